"""Loading a checkpoint runs no code stored in it: hostile `.metadata` and byte items are refused by every reader
(resume, init_from, convert_to_hf, its --verify loader), before their code runs, naming the file and the import;
legitimate checkpoints and TE's FP8 extra state still load."""
import importlib.util
import io
import json
import pickle
import re
import warnings
from pathlib import Path

import pytest
import torch

import train_scenarios as sc
from hostile_checkpoints import CreatesFile, copy_checkpoint, plant_in_byte_item, plant_in_metadata
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint_guard
from mlmclm.train.checkpoint_guard import UnsafeCheckpointError
from mlmclm.train.te_extra_state import safe_extra_state

ROOT = Path(__file__).resolve().parents[2]


def tool_main(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    """A tiny 1-rank run stopped after step 4, its latest checkpoint at step 3."""
    run_dir = tmp_path_factory.mktemp("guard") / "run"
    cfg = sc.config(run_dir, data)
    spawn(sc.run_until, 1, cfg, sc.SWITCH)
    return cfg, run_dir / "checkpoints" / "iter_0000003"


HOSTILE = {"metadata": (plant_in_metadata, r"\.metadata: refused: its pickle imports posix\.system"),
           "byte_item": (plant_in_byte_item, r"__0_0\.distcp: byte item 'common_state/shard_0_1'.*posix\.system")}


def _hostile_copy(source: Path, where: Path, kind: str) -> tuple[Path, Path]:
    marker = where / f"payload_ran_{kind}"
    run_dir = where / f"hostile_{kind}"
    HOSTILE[kind][0](copy_checkpoint(source, run_dir), marker)
    return run_dir, marker


def test_hostile_metadata_is_refused_by_torch_dcp_reader_itself(trained, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    run_dir, marker = _hostile_copy(trained[1], tmp_path, "metadata")
    checkpoint_guard.install()
    with pytest.raises(UnsafeCheckpointError, match=HOSTILE["metadata"][1]):
        FileSystemReader(str(run_dir / "checkpoints" / "iter_0000003")).read_metadata()
    assert not marker.exists()


def test_legitimate_metadata_reads_as_pickle_reads_it(trained):
    guarded = checkpoint_guard.read_metadata_file(trained[1])
    plain = pickle.loads((trained[1] / ".metadata").read_bytes())  # our own file, written by this test
    assert guarded.state_dict_metadata == plain.state_dict_metadata
    assert guarded.storage_data == plain.storage_data


def test_resume_and_init_from_refuse_hostile_checkpoints_and_write_nothing(trained, data, tmp_path):
    cfg, source = trained
    attempts, markers, expected = [], [], []
    for kind in HOSTILE:
        run_dir, marker = _hostile_copy(source, tmp_path, kind)
        attempts.append({**cfg, "run_dir": str(run_dir)})  # resume: the run's own latest checkpoint
        fresh = tmp_path / f"init_from_{kind}"
        attempts.append({**sc.config(fresh, data), "checkpoint": {"save_interval": 3,
                                                                 "init_from": str(run_dir / "checkpoints")}})
        markers.append(marker)
        expected += [HOSTILE[kind][1]] * 2
    report = tmp_path / "report.json"
    spawn(sc.run_each_reporting_errors, 1, attempts, str(report))
    results = json.loads(report.read_text())
    for attempt, result, pattern in zip(attempts, results, expected):
        assert result["type"] == "UnsafeCheckpointError", (attempt["run_dir"], result)
        assert re.search(pattern, result["message"]), result["message"]
        checkpoints = sorted(p.name for p in (Path(attempt["run_dir"]) / "checkpoints").glob("iter_*"))
        assert checkpoints in ([], ["iter_0000003"])  # nothing saved by the refused run
    assert not [m for m in markers if m.exists()]


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_convert_to_hf_and_verify_refuse_hostile_checkpoints(trained, tmp_path, capsys, kind):
    run_dir, marker = _hostile_copy(trained[1], tmp_path, kind)
    for extra in ([], ["--verify"]):
        out = tmp_path / f"hf{len(extra)}"
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            assert tool_main("convert_to_hf")([str(run_dir), str(out), *extra]) == 2
        # the refusal alone: not torch's "Detected pickle protocol 4 ... might not support" hint before it
        assert [str(w.message) for w in shown if "pickle" in str(w.message)] == [], kind
        err = capsys.readouterr().err
        assert re.search(HOSTILE[kind][1], err), err
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}")]
    assert not marker.exists()


def test_verify_logits_loader_refuses_a_hostile_checkpoint(trained, tmp_path):
    """--verify's own loader (megatron's, in a fresh process) refuses too, not only the conversion before it."""
    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf, open_checkpoint
    from mlmclm.convert.verify import compare_logits

    export = tmp_path / "hf"
    convert_to_hf(ExportConfig(trained[1], export, progress=False))
    model = open_checkpoint(trained[1]).model
    for kind in HOSTILE:
        run_dir, marker = _hostile_copy(trained[1], tmp_path, kind)
        with pytest.raises(Exception, match="UnsafeCheckpointError"):
            compare_logits(run_dir / "checkpoints" / "iter_0000003", export, model)
        assert not marker.exists()


def test_a_legacy_common_file_is_refused(trained, tmp_path):
    from mlmclm.train.checkpoint import resolve_checkpoint

    copy = copy_checkpoint(trained[1], tmp_path / "legacy")
    torch.save({"x": 1}, copy / "common.pt")
    with pytest.raises(UnsafeCheckpointError, match="common.pt: refused"):
        checkpoint_guard.refuse_legacy_common_file(resolve_checkpoint(tmp_path / "legacy"))


def _te_extra_state(state) -> torch.Tensor:
    """What TE's `get_extra_state` returns: its FP8 metadata pickled into a byte tensor."""
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)


def test_te_extra_state_is_handed_over_re_serialised_and_hostile_ones_refused(tmp_path):
    fp8_meta = {"scale_fwd": torch.ones(3), "amax_history_fwd": torch.arange(12.0).reshape(4, 3),
                "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True, "shape": (1, 2), "xs": [0.5]}}
    safe = safe_extra_state(_te_extra_state(fp8_meta), "ckpt: layer._extra_state")
    decoded = pickle.loads(safe.numpy().tobytes())  # what TE's set_extra_state does with it
    assert decoded.keys() == fp8_meta.keys() and decoded["extra_fp8_variables"] == fp8_meta["extra_fp8_variables"]
    assert all(torch.equal(decoded[k], fp8_meta[k]) for k in ("scale_fwd", "amax_history_fwd"))

    marker = tmp_path / "payload_ran"
    for hostile in ({"scale_fwd": CreatesFile(marker)}, CreatesFile(marker)):
        with pytest.raises(UnsafeCheckpointError, match=r"ckpt: layer\._extra_state: refused.*posix\.system"):
            safe_extra_state(_te_extra_state(hostile), "ckpt: layer._extra_state")
    buffer = io.BytesIO()
    torch.save(CreatesFile(marker), buffer)  # older TE: a torch.save'd BytesIO
    with pytest.raises(UnsafeCheckpointError, match="weights-only loader"):
        safe_extra_state(buffer, "ckpt: layer._extra_state")
    assert not marker.exists()
    # A payload that does not decode is refused rather than handed to TE's unvetted pickle.loads.
    truncated = torch.frombuffer(bytearray(pickle.dumps(fp8_meta)[:-40]), dtype=torch.uint8)
    for broken in (torch.tensor(list(b"not-a-pickle"), dtype=torch.uint8), truncated):
        with pytest.raises(UnsafeCheckpointError, match=r"ckpt: x: refused: .*does not decode"):
            safe_extra_state(broken, "ckpt: x")
    assert safe_extra_state(None, "x") is None
    empty = torch.empty(0, dtype=torch.uint8)   # megatron's local layers store an empty extra state
    assert safe_extra_state(empty, "x") is empty


def test_te_2_18s_opt_in_is_opened_only_for_vetted_extra_state(tmp_path):
    """TE >= 2.18 refuses delayed-scaling extra state without NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (the stand-in
    applies that rule). `load_vetted_state` sets the opt-in only for a load whose every payload `safe_extra_state`
    wrote, and unsets it afterwards; a payload it did not vet meets TE's refusal; a hostile one never gets that far."""
    import os

    from tests.stand_ins import transformer_engine_stand_in

    from mlmclm.train.te_extra_state import load_vetted_state

    with transformer_engine_stand_in.on_path():
        from transformer_engine.pytorch.module.base import FP8ExtraState

        class Linear(FP8ExtraState, torch.nn.Linear):
            pass

        saved, fresh = Linear(2, 2), Linear(2, 2)
        saved.init_fp8_meta(delayed=True, seed=3.0)
        fresh.init_fp8_meta(delayed=True, seed=1.0)
        state = saved.state_dict()
        assert state["_extra_state"].numel() > 0
        assert os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE") is None
        with pytest.raises(RuntimeError, match="Refusing to load pickled Transformer Engine extra state"):
            fresh.load_state_dict(state)  # what our resume did before: TE refuses
        with pytest.raises(RuntimeError, match="Refusing to load pickled Transformer Engine extra state"):
            load_vetted_state(fresh, dict(state))  # not vetted: the door stays shut
        vetted = {**state, "_extra_state": safe_extra_state(state["_extra_state"], "ckpt: _extra_state")}
        load_vetted_state(fresh, vetted)
        assert torch.equal(fresh.fp8_meta["scale_fwd"], torch.full((3,), 3.0))
        assert os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE") is None
        # A vetted copy is handed over once: holding on to it does not reopen the door later.
        with pytest.raises(RuntimeError, match="Refusing"):
            load_vetted_state(fresh, vetted)
        marker = tmp_path / "payload_ran"
        with pytest.raises(UnsafeCheckpointError, match="posix.system"):
            safe_extra_state(_te_extra_state({"recipe": None, "scale_fwd": CreatesFile(marker)}), "ckpt: x")
        assert not marker.exists()
    assert not any(name.startswith("transformer_engine") for name in __import__("sys").modules)


# Every dtype whose tensor TE's and megatron's readers turn into bytes (`numpy().tobytes()`) before unpickling.
_NUMPY_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                 torch.uint64, torch.float16, torch.float32, torch.float64, torch.bool, torch.complex64,
                 torch.complex128]


def _stored_as(payload: bytes, dtype: torch.dtype) -> torch.Tensor:
    """`payload` padded to the dtype's item size (pickle ignores what follows its STOP) and viewed as `dtype`: how a
    planted extra state slips past a guard that vets only uint8."""
    size = torch.empty(0, dtype=dtype).element_size()
    padded = payload + b"\0" * (-len(payload) % size)
    return torch.frombuffer(bytearray(padded), dtype=torch.uint8).view(dtype)


@pytest.mark.parametrize("dtype", _NUMPY_DTYPES, ids=str)
def test_te_extra_state_of_every_dtype_is_vetted(dtype, tmp_path):
    """TE 2.2-2.17's `set_extra_state` and megatron's `_decode_extra_state` unpickle a tensor of any dtype; a payload
    stored as int32 (or any other dtype numpy holds) is vetted like a byte tensor: hostile refused, the marker never
    appears, TE's real metadata handed over as the uint8 copy TE writes."""
    marker = tmp_path / "payload_ran"
    hostile = _stored_as(pickle.dumps({"scale_fwd": CreatesFile(marker)}), dtype)
    assert pickle.loads(hostile.numpy().tobytes())["scale_fwd"] == 0  # as TE reads it: the payload does run
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeCheckpointError, match=r"ckpt: layer\._extra_state: refused.*posix\.system"):
        safe_extra_state(hostile, "ckpt: layer._extra_state")
    assert not marker.exists()

    fp8_meta = {"scale_fwd": torch.ones(3), "extra_fp8_variables": {"num_gemms": 1}}
    safe = safe_extra_state(_stored_as(pickle.dumps(fp8_meta), dtype), "ckpt: x")
    assert safe.dtype == torch.uint8
    decoded = pickle.loads(safe.numpy().tobytes())
    assert torch.equal(decoded["scale_fwd"], fp8_meta["scale_fwd"]) and decoded["extra_fp8_variables"] == {"num_gemms": 1}


def test_te_extra_state_of_another_kind_is_refused(tmp_path):
    """A dtype numpy cannot hold (TE's reader fails on it) and a type no TE writes are refused, naming the value."""
    as_bf16 = _stored_as(pickle.dumps({"x": 1}), torch.bfloat16)
    with pytest.raises(UnsafeCheckpointError, match=r"ckpt: x: refused: .*torch\.bfloat16 tensor"):
        safe_extra_state(as_bf16, "ckpt: x")
    for other in (pickle.dumps({"x": 1}), {"scale_fwd": torch.ones(1)}, [torch.ones(1)]):
        with pytest.raises(UnsafeCheckpointError, match=r"ckpt: x: refused: .*byte tensor or a BytesIO"):
            safe_extra_state(other, "ckpt: x")
    assert safe_extra_state(torch.empty(0, dtype=torch.int32), "x").numel() == 0


@pytest.mark.timeout(60)
def test_a_foreign_checkpoint_cannot_block_or_exhaust_a_rank(trained, tmp_path, capsys):
    """A FIFO or /dev/zero in place of a checkpoint's pointer, JSON files or data, a stored range past its file's end:
    each refused naming the file before anything blocks or grows (the old code blocked on the FIFO, read /dev/zero
    until MemoryError)."""
    import os

    from mlmclm.train.checkpoint import CheckpointError, resolve_checkpoint

    def copy(name: str) -> Path:
        return copy_checkpoint(trained[1], tmp_path / name)

    pointer_run = copy("fifo_pointer").parent
    (pointer_run / "latest_checkpointed_iteration.txt").unlink()
    os.mkfifo(pointer_run / "latest_checkpointed_iteration.txt")
    with pytest.raises(CheckpointError, match=r"latest_checkpointed_iteration\.txt: refusing .* a FIFO"):
        resolve_checkpoint(pointer_run)

    for name in ("run_config.json", "train_state.json", "metadata.json"):
        iteration = copy(f"zero_{name}")
        (iteration / name).unlink()
        (iteration / name).symlink_to("/dev/zero")
        assert tool_main("convert_to_hf")([str(iteration), str(tmp_path / f"hf_{name}")]) == 2
        assert re.search(rf"{re.escape(name)}: refusing .* a character device", capsys.readouterr().err)

    iteration = copy("fifo_data")
    data_file = next(iteration.glob("*.distcp"))
    data_file.unlink()
    os.mkfifo(data_file)
    with pytest.raises(UnsafeCheckpointError, match=rf"{data_file.name}: refusing .* a FIFO"):
        checkpoint_guard.check_checkpoint(iteration)

    iteration = copy("past_the_end")
    metadata = checkpoint_guard.read_metadata_file(iteration)
    index, info = next(iter(metadata.storage_data.items()))
    metadata.storage_data[index] = type(info)(info.relative_path, info.offset, 1 << 40, info.transform_descriptors)
    (iteration / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: refused: .* is stored at bytes .* which holds"):
        checkpoint_guard.check_checkpoint(iteration)
