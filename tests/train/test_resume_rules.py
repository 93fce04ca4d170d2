"""Resume rules without processes: what a resume may change, the run directory's writer lock, the metrics rewind,
and how the torchrun wrapper reads its ranks' exit codes."""
import json
import os
import signal
import subprocess
import sys

import pytest

from mlmclm.data.manifest import Manifest
from mlmclm.parallel.torchrun import preempted
from mlmclm.train import run_lock
from mlmclm.train.config import TrainConfig
from mlmclm.train.logger import rewind_metrics as _rewind_metrics
from mlmclm.train.resume_check import IncompatibleCheckpointError, check_resume_compatible, check_same_settings

import train_scenarios as sc

TOKENIZER = {"name": "demo", "vocab_hash": "abc", "vocab_size": 8192, "mask_id": 3}


def _manifest() -> Manifest:
    return Manifest.__new__(Manifest)


def _check(saved: dict, changed: dict, allowed=()):
    manifest = _manifest()
    manifest.tokenizer, manifest.seq_length = TOKENIZER, sc.SEQ
    state = {"tokenizer": TOKENIZER, "seq_length": sc.SEQ}
    check_resume_compatible(saved, state, changed, list(allowed), manifest, "iter_0000006")


def _config(tmp_path, **overrides) -> dict:
    return TrainConfig.from_dict(sc.config(tmp_path / "run", tmp_path / "data", **overrides)).to_dict()


@pytest.mark.parametrize("overrides, field", [
    ({"seed": 7}, "seed"),
    ({"global_batch_size": 16}, "global_batch_size"),
    ({"total_steps": 20, "phases": [{"objective": {"kind": "clm"}, "steps": 4},
                                    {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": 16}]},
     "phases.1.steps"),
    ({"phases": [{"objective": {"kind": "clm"}, "steps": 4},
                 {"objective": {"kind": "mlm", "mask_ratio": 0.4}, "steps": 6}]}, "phases.1.objective.mask_ratio"),
    ({"phases": [{"objective": {"kind": "clm"}, "steps": 4},
                 {"objective": {"kind": "mlm", "mask_ratio": 0.3, "mask_schedule": "linear", "mask_ratio_end": 0.15},
                  "steps": 6}]}, "phases.1.objective.mask_ratio_end"),
    ({"schedule": {"style": "cosine", "warmup_steps": 2, "decay_steps": 3}}, "schedule.style"),
    ({"optimizer": {"lr": 1e-3}}, "optimizer.lr"),
    ({"model": {"preset": "tiny", "num_layers": 2}}, "model.num_layers"),
    ({"precision": {"dtype": "bf16"}}, "precision.dtype"),
])
def test_a_change_that_breaks_exactness_is_refused_naming_the_field(tmp_path, overrides, field):
    saved = _config(tmp_path)
    with pytest.raises(IncompatibleCheckpointError, match=rf"{field.replace('.', '[.]')} is .* in the checkpoint"):
        _check(saved, _config(tmp_path, **overrides))


def test_total_steps_alone_is_refused_too(tmp_path):
    saved = _config(tmp_path)
    changed = dict(saved, total_steps=12)
    with pytest.raises(IncompatibleCheckpointError, match="total_steps"):
        _check(saved, changed)


def test_layout_logging_and_checkpointing_may_change(tmp_path):
    saved = _config(tmp_path)
    changed = _config(tmp_path, tp=2, micro_batch_size=4, logging={"log_interval": 1},
                      checkpoint={"save_interval": 5, "keep_last": 2})
    changed["run_dir"], changed["data"]["path"] = str(tmp_path / "elsewhere"), str(tmp_path / "moved")
    changed["optimizer"]["distributed_optimizer"] = False
    changed["optimizer"]["overlap_grad_reduce"] = not changed["optimizer"]["overlap_grad_reduce"]
    changed["optimizer"]["overlap_param_gather"] = not changed["optimizer"]["overlap_param_gather"]
    changed["manual_gc_interval"] = 0
    changed["sparse_mlm_head"], changed["fused_kernels"], changed["head_chunk_tokens"] = False, False, 0
    _check(saved, changed)


def test_an_allowed_change_extends_the_run(tmp_path):
    saved = _config(tmp_path)
    longer = _config(tmp_path, total_steps=20,
                     phases=[{"objective": {"kind": "clm"}, "steps": 4},
                             {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": 16}])
    _check(saved, longer, allowed=["total_steps", "phases"])
    with pytest.raises(IncompatibleCheckpointError, match="total_steps"):
        _check(saved, longer, allowed=["phases"])


def test_the_refusal_names_every_change_and_a_way_forward_that_leads_somewhere(tmp_path):
    """Following the hint resumes (no second refusal naming the next field); a changed seed, or any change to a
    finished run, points at a new run_dir instead: no resume would ever train it."""
    saved = _config(tmp_path)
    changed = _config(tmp_path, optimizer={"lr": 1e-3}, global_batch_size=16)
    with pytest.raises(IncompatibleCheckpointError) as refused:
        _check(saved, changed)
    hint = str(refused.value).rpartition("checkpoint.allow_resume_changes=")[2]
    assert hint == "[global_batch_size,optimizer.lr]", refused.value
    _check(saved, changed, allowed=hint.strip("[]").split(","))

    reseeded = _config(tmp_path, seed=99)
    reseeded["data"]["seed"] = 99  # as the recipes' seed= sets both
    with pytest.raises(IncompatibleCheckpointError) as refused:
        _check(saved, reseeded)
    assert str(refused.value) == ("iter_0000006: data.seed is 1234 in the checkpoint but 99 here; seed is 1234 in the "
                                  "checkpoint but 99 here. A different seed is a new run: give it a new run_dir "
                                  "(run_dir=...)")
    with pytest.raises(IncompatibleCheckpointError, match=r"This run is finished, so a changed setting is a new run: "
                                                          r"give it a new run_dir"):
        check_same_settings(saved, changed, ["global_batch_size", "optimizer.lr"], "iter_0000006", finished=True)


def test_allowed_changes_parse_from_a_command_line_list(tmp_path):
    cfg = TrainConfig.from_dict(sc.config(tmp_path, tmp_path, checkpoint={"allow_resume_changes": "[total_steps,phases]"}))
    assert cfg.checkpoint.allow_resume_changes == ["total_steps", "phases"]


def test_another_tokenizer_is_refused(tmp_path):
    manifest = _manifest()
    manifest.tokenizer, manifest.seq_length = {**TOKENIZER, "vocab_hash": "other"}, sc.SEQ
    saved = _config(tmp_path)
    with pytest.raises(IncompatibleCheckpointError, match="vocab_hash"):
        check_resume_compatible(saved, {"tokenizer": TOKENIZER, "seq_length": sc.SEQ}, saved, [], manifest, "x")


# --- the writer lock ------------------------------------------------------------------------------------------

def test_a_live_writer_on_this_host_keeps_the_directory(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(
            {"host": run_lock.socket.gethostname(), "pid": sleeper.pid, "slurm_job": None}))
        with pytest.raises(run_lock.RunLockedError, match=f"pid {sleeper.pid}"):
            run_lock.RunLock(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    lock = run_lock.RunLock(tmp_path)  # its process is gone now: the lock is stale and taken over
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not lock.path.exists()


def test_a_lock_from_another_host_is_stale_only_when_requeued_or_silent(tmp_path, monkeypatch):
    path = tmp_path / run_lock.LOCK_FILE
    path.write_text(json.dumps({"host": "node-a", "pid": 1, "slurm_job": "41"}))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(run_lock.RunLockedError, match="node-a"):
        run_lock.RunLock(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # the same job, requeued on another node
    run_lock.RunLock(tmp_path).release()
    path.write_text(json.dumps({"host": "node-a", "pid": 1, "slurm_job": "41"}))
    old = path.stat().st_mtime - run_lock.STALE_AFTER_S - 1
    os.utime(path, (old, old))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    run_lock.RunLock(tmp_path).release()


def test_staging_leftovers_are_removed(tmp_path):
    (tmp_path / ".staging_iter_0000007" / "rng").mkdir(parents=True)
    (tmp_path / "iter_0000006").mkdir()
    assert run_lock.remove_staging_leftovers(tmp_path) == [".staging_iter_0000007"]
    assert [p.name for p in tmp_path.iterdir()] == ["iter_0000006"]


# --- metrics and exit codes -----------------------------------------------------------------------------------

def test_metrics_are_rewound_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "tr')
    _rewind_metrics(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("codes, expected", [
    ([75, 75], True),
    ([75, -signal.SIGTERM], True),  # torchrun ended the second rank once the first had exited
    ([75, -signal.SIGKILL], True),
    ([1, 75], False),  # a rank that broke is not a preemption
    ([-signal.SIGTERM], False),
    ([1], False),
])
def test_preemption_is_recognised_from_the_ranks_exit_codes(codes, expected):
    assert preempted(codes) is expected
