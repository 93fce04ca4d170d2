"""The next global batch is built on a background thread while the current step runs (mlmclm/train/prefetch.py):
the same batches as building them in the loop, bit for bit; the build of step k + 1 overlaps step k; a run stopped
with a batch built ahead resumes exactly (the checkpoint holds the position of the last batch trained)."""
import json
import os
import signal
import threading
import time

import pytest
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


def _stopped_with_a_stalled_read(cfg_dict, record_path):
    """pretrain stopped by SIGUSR1 from inside step 2 while the thread builds step 3's batch from a shard whose
    server stalls; records (wall clock) when the save ended and when the run status was written."""
    from mlmclm.data import remote
    from mlmclm.train import pretrain as pt

    remote.STALL_S = 20.0   # the old code wrote its status only when the stalled read gave up (180 s in a run)
    times, save, status, step = {}, pt.ckpt.save_checkpoint, pt.write_status, pt.train_step
    calls = {"n": 0}

    def recorded_save(*args, **kwargs):
        path = save(*args, **kwargs)
        times["saved"] = time.time()
        return path

    def recorded_status(*args, **kwargs):
        status(*args, **kwargs)
        times["status"] = time.time()

    def stopping_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(*args, **kwargs)

    pt.ckpt.save_checkpoint, pt.write_status, pt.train_step = recorded_save, recorded_status, stopping_step
    result = sc._train(cfg_dict)
    record_path.write_text(json.dumps({**times, "status_of_run": result.status, "steps": result.steps}))


@pytest.mark.timeout(180)
def test_a_preemption_writes_its_status_at_once_while_a_shard_read_is_stalled(tmp_path):
    """Shards of 8 rows, 4 per step: steps 1-2 read the first shard, step 3's batch needs the second, whose server
    stalls. The stop comes in step 2, while the thread waits on that read: the checkpoint of step 2 is saved, and
    the status follows within 5 s (before: the close waited for the batch being built, i.e. for the stalled read
    to give up), and the rank's process ends as soon (its stalled read is abandoned, not waited for)."""
    from mlmclm.data.prepare import prepare_embedded_corpus
    from tests.local_servers import serve_stalling

    data = tmp_path / "data"
    prepare_embedded_corpus(data, seq_length=sc.SEQ, max_tokens=12_000, samples_per_shard=8, rows_per_block=8)
    served = []

    def stalls(path: str) -> bool:  # the first shard asked for is served, every later one stalls
        if not path.startswith("shard-"):
            return False
        served.append(path)
        return len(served) > 1

    server, release = serve_stalling(directory=data, stalls=stalls)
    url = f"http://127.0.0.1:{server.server_address[1]}/manifest.json"
    cfg = sc.config(tmp_path / "run", data, total_steps=6, global_batch_size=4, micro_batch_size=2,
                    phases=[{"objective": {"kind": "clm"}, "steps": 6}], data={"path": url, "tokenizer": "embedded"},
                    checkpoint={"save_interval": None})
    record = tmp_path / "record.json"
    try:
        spawn(_stopped_with_a_stalled_read, 1, cfg, record)
        ended = time.time()
    finally:
        release.set()
        server.shutdown()
    times = json.loads(record.read_text())
    assert times["status_of_run"] == "preempted" and times["steps"] == 2
    assert len(served) >= 2  # the second shard was asked for, and stalled
    assert json.loads((tmp_path / "run" / "run_status.json").read_text())["status"] == "preempted"
    assert times["status"] - times["saved"] < 5, times
    assert ended - times["status"] < 10, (ended, times)
