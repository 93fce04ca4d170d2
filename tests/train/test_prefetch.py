"""The next global batch is built on a background thread while the current step runs (mlmclm/train/prefetch.py):
the same batches as building them in the loop, bit for bit; the build of step k + 1 overlaps step k; a run stopped
with a batch built ahead resumes exactly (the checkpoint holds the position of the last batch trained)."""
import json
import os
import signal
import threading
import time

import torch

import train_scenarios as sc
from mlmclm.parallel.launch import spawn

TOTAL, SWITCH = 6, 3
PHASES = [{"objective": {"kind": "clm"}, "steps": SWITCH},
          {"objective": {"kind": "mlm", "mask_ratio": 0.4, "mask_ratio_end": 0.2, "mask_schedule": "linear"},
           "steps": TOTAL - SWITCH}]


def config(run_dir, data, **overrides):
    return sc.config(run_dir, data, total_steps=TOTAL, phases=PHASES, global_batch_size=4, micro_batch_size=2,
                     data={"path": str(data), "tokenizer": "embedded",
                           "random_length": {"min_length": 4, "max_length": 100}},
                     checkpoint={"save_interval": None}, **overrides)


def _steps(background: bool, cfg, data_dir):
    from mlmclm.train.phase_data import PhaseLoaders
    from mlmclm.train.prefetch import StepBatches

    data = PhaseLoaders(cfg, 0, 1, pad_multiple=16)
    threads = []
    original = data.for_phase

    def for_phase(index):
        threads.append(threading.current_thread().name)
        return original(index)

    data.for_phase = for_phase
    batches = StepBatches(cfg, data, data.manifest.tokenizer, 0, TOTAL, background=background)
    try:
        steps = [batches.get(k) for k in range(TOTAL)]
        return steps, threads, batches.position(), data.state_dict()
    finally:
        batches.close()
        data.close()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and _same(vars(a), vars(b))
    if hasattr(a, "tolist"):
        return a.tolist() == b.tolist()
    return a == b


def test_the_thread_builds_the_same_batches_bit_for_bit(tmp_path, data):
    from mlmclm.train.config import TrainConfig

    cfg = TrainConfig.from_dict(config(tmp_path / "run", data))
    inline, inline_threads, inline_position, _ = _steps(False, cfg, data)
    ahead, ahead_threads, ahead_position, loaders_after = _steps(True, cfg, data)
    assert _same(inline, ahead)
    assert inline[SWITCH].masking and not inline[0].masking  # MLM steps carry their scheduled rate
    assert inline[0].documents is not None and inline[0].lengths is not None  # random-length samples
    assert set(inline_threads) == {"MainThread"}
    assert ahead_threads[0] == "MainThread" and set(ahead_threads[1:]) == {"batch-prefetch_0"}
    assert ahead_position == inline_position and ahead_position[1] == loaders_after


def _recording_run(cfg_dict, record_path, stop_at=None):
    """pretrain, recording when each step's batch was built (thread, start) and when each step ran; with
    `stop_at`, SIGUSR1 from inside that step (the preemption path: agreed at the step's read, saved, exit)."""
    from mlmclm.train import prefetch
    from mlmclm.train import pretrain as pt

    builds, steps = {}, []
    build, step = prefetch.build_host_step, pt.train_step

    def recorded_build(cfg, data, objectives, tokenizer, iteration):
        builds[iteration] = (threading.current_thread().name, time.monotonic())
        return build(cfg, data, objectives, tokenizer, iteration)

    def recorded_step(*args, **kwargs):
        if stop_at is not None and len(steps) + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        begin = time.monotonic()
        result = step(*args, **kwargs)
        steps.append((begin, time.monotonic()))
        return result

    prefetch.build_host_step, pt.train_step = recorded_build, recorded_step
    result = sc._train(cfg_dict)
    if sc._rank0():
        record_path.write_text(json.dumps({"builds": builds, "steps": steps, "status": result.status}))


def _runs(reference, stopped, resumed_record):
    _recording_run(*reference)
    _recording_run(*stopped)
    _recording_run(*resumed_record)


def test_the_next_batch_is_built_during_the_step_and_a_stop_resumes_exactly(tmp_path, data):
    ref_dir, stop_dir = tmp_path / "reference", tmp_path / "stopped"
    records = [tmp_path / name for name in ("reference.json", "stopped.json", "resumed.json")]
    spawn(_runs, 1, (config(ref_dir, data), records[0]), (config(stop_dir, data), records[1], 2),
          (config(stop_dir, data), records[2]))
    reference = json.loads(records[0].read_text())
    builds = {int(k): v for k, v in reference["builds"].items()}
    assert sorted(builds) == list(range(TOTAL)) and reference["status"] == "completed"
    for k, (begin, end) in enumerate(reference["steps"][:-1]):
        thread, started = builds[k + 1]
        assert thread.startswith("batch-prefetch") and started < end, k  # step k + 1's batch built during step k
    stopped = json.loads(records[1].read_text())
    assert stopped["status"] == "preempted" and len(stopped["steps"]) == 2
    assert 2 in {int(k) for k in stopped["builds"]}  # step 3's batch was built ahead when the run stopped
    state = json.loads((stop_dir / "checkpoints" / "iter_0000002" / "train_state.json").read_text())
    assert state["consumed_samples"] == 2 * 4  # the two steps trained, not the batch built ahead
    ours, ref = sc.metrics_rows(stop_dir), sc.metrics_rows(ref_dir)
    assert sorted(ours) == sorted(ref) == list(range(1, TOTAL + 1))
    for step in ref:
        phase = ref[step]["phase"]
        assert ours[step][f"train/{phase}/loss"] == ref[step][f"train/{phase}/loss"], step
        assert ours[step]["train/grad_norm"] == ref[step]["train/grad_norm"], step
