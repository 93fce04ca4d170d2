"""`tools/evaluate.py grid --workers N` on the smoke suite, as real processes with real signals (issue 53's Must
show, on CPU): 2 workers write the records 1 worker writes (scores bit for bit), one line per finished unit; a
worker killed with SIGKILL mid-unit loses nothing (its unit is taken over at once, the summary is the uninterrupted
one's); a command killed whole leaves a claim that the same command, run again, takes over, running only the
missing units and saying how many; SIGTERM ends a command with 75 and its claims given back."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from eval_fixtures import evaluate_main

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ("0", "1")
UNITS = 8  # 4 smoke tasks x 1 LR x 2 seeds


def _arguments(model: Path, out: Path, workers: int) -> list[str]:
    return ["grid", "--model", f"tiny={model}", "--smoke", "--seeds", *SEEDS, "--max-steps", "12", "--batch-size",
            "8", "--device", "cpu", "--workers", str(workers), "--threads", "1",  # on CPU the last bits depend on
            "--output", str(out)]                                                # the threads: one each


ENV = {"MLMCLM_PROGRESS_SECONDS": "600", "MLMCLM_GRID_STALE_SECONDS": "600"}


def _start(model: Path, out: Path, workers: int, log: Path) -> subprocess.Popen:
    """The command as its own process (for the signals it gets), output into `log`."""
    with open(log, "w") as stream:
        return subprocess.Popen([sys.executable, "tools/evaluate.py", *_arguments(model, out, workers)], cwd=ROOT,
                                env={**os.environ, **ENV}, stdout=stream, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _run(model: Path, out: Path, workers: int, capfd=None, after_a_spawned_claim: bool = False) -> str:
    """The command in this process (with more than one worker, it runs units here and the others are processes of
    their own): what it prints. `after_a_spawned_claim`: this process starts its first unit only once a spawned
    worker holds a claim, so that both run units however fast this one is (here nobody imports for it)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        if after_a_spawned_claim:
            _hold_the_first_unit_until_a_spawned_claim(patch, out)
        code = evaluate_main()(_arguments(model, out, workers))
    text = "" if capfd is None else "".join(capfd.readouterr())
    assert code == 0, text[-4000:]
    return text


def _hold_the_first_unit_until_a_spawned_claim(patch: pytest.MonkeyPatch, out: Path) -> None:
    from mlmclm.eval.grid import worker

    real_run_unit, held = worker.run_unit, []

    def run_unit(*args, **kwargs):
        deadline = time.monotonic() + 300
        while not held and time.monotonic() < deadline:
            if [pid for pid in _pids_claiming(out) if pid != os.getpid()]:
                held.append(True)
            time.sleep(0.05)
        return real_run_unit(*args, **kwargs)

    patch.setattr(worker, "run_unit", run_unit)


def _records(out: Path) -> dict[str, str]:
    """Each record as JSON text, with what differs between two runs of one grid in one folder set aside: how long
    it took and which worker ran it."""
    found = {}
    for path in sorted((out / "runs").glob("*/*/*.json")):
        record = json.loads(path.read_text())
        del record["seconds"]
        record["extra"].pop("worker")
        found[str(path.relative_to(out))] = json.dumps(record, sort_keys=True)
    return found


def _fresh(out: Path) -> None:
    """The same folder for every run of this module: a record's fingerprint holds the smoke tasks' paths."""
    if out.exists():
        import shutil

        shutil.rmtree(out)


@pytest.fixture(scope="module")
def grid(tmp_path_factory, tiny_model_dir):
    """The uninterrupted 1-worker run: its records and summary, and the folder every test runs in."""
    base = tmp_path_factory.mktemp("grid")
    out = base / "out"
    _run(tiny_model_dir, out, 1)
    return {"model": tiny_model_dir, "out": out, "base": base, "records": _records(out),
            "summary": (out / "summary.md").read_text()}


def _pids_claiming(out: Path, unfinished: bool = False) -> list[int]:
    """The pids of the claims in `out`; `unfinished`: only those whose unit has no record yet (a worker writes its
    unit's record, then gives the claim back: a kill between the two leaves a claim on a finished unit)."""
    pids = []
    for path in (out / "claims").rglob("*.json"):
        try:
            claim = json.loads(path.read_text())
            if not (unfinished and (out / "runs" / f"{claim['unit']}.json").exists()):
                pids.append(claim["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return pids


def _wait_for(condition, proc, log: Path, seconds: float = 600):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, log.read_text()[-4000:]
        time.sleep(0.05)
    raise AssertionError(f"timed out: {log.read_text()[-4000:]}")


def test_two_workers_write_the_records_of_one_and_a_line_per_finished_unit(grid, capfd):
    assert len(grid["records"]) == UNITS
    out = grid["out"]
    _fresh(out)
    capfd.readouterr()
    text = _run(grid["model"], out, 2, capfd, after_a_spawned_claim=True)
    assert _records(out) == grid["records"]  # every field, the scores bit for bit, losses included
    assert (out / "summary.md").read_text() == grid["summary"]
    workers = {json.loads(p.read_text())["extra"]["worker"] for p in (out / "runs").glob("*/*/*.json")}
    assert len(workers) == 2, workers  # both workers ran units: this process's loop and the spawned one
    assert "\r" not in text  # no bar in a log file
    done = [int(n) for n in re.findall(r"^evaluation runs: (\d)/8 done, \d left, ETA [^;]+; last finished: tiny/smoke_",
                                       text, flags=re.M)]
    assert sorted(done) == list(range(1, UNITS + 1)), text[-3000:]  # one line per finished unit
    assert re.search(r"^spent: 8 of 8 units finished, [0-9.]+ CPU-worker-hours by their records; this command "
                     r"ran 8 in [0-9.]+ min of wall time \([0-9.]+ units per hour\)$", text, flags=re.M), text[-2000:]
    assert not list((out / "claims").rglob("*.json"))


def test_a_worker_killed_mid_unit_loses_nothing(grid, capfd):
    out = grid["out"]
    _fresh(out)
    killed = []

    def kill_a_worker():  # the command runs in this process: any other pid holding a claim is a worker's
        deadline = time.monotonic() + 600
        while not killed and time.monotonic() < deadline:
            pids = [pid for pid in _pids_claiming(out) if pid != os.getpid()]
            if pids:
                os.kill(pids[0], signal.SIGKILL)  # in the middle of its unit: its claim is on disk
                killed.append(pids[0])
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    capfd.readouterr()
    killer.start()
    text = _run(grid["model"], out, 2, capfd, after_a_spawned_claim=True)
    killer.join()
    assert killed and re.search(rf"^evaluate: worker \d \(pid {killed[0]}\): killed by SIGKILL; the unit it held "
                                rf"goes back to the queue$", text, flags=re.M), text[-3000:]
    assert _records(out) == grid["records"] and (out / "summary.md").read_text() == grid["summary"]
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/*/*.json")}
    again = _run(grid["model"], out, 2, capfd)
    assert "grid: 8 units (cpu, 2 workers here): 8 finished, 0 to run" in again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing run twice


def test_a_command_killed_whole_resumes_the_missing_units_and_sigterm_gives_its_claims_back(grid, capfd):
    out, base = grid["out"], grid["base"]
    _fresh(out)
    # 1. SIGKILL to the whole command (its process group) in the middle of a unit
    proc = _start(grid["model"], out, 1, base / "k1.log")
    try:
        _wait_for(lambda: len(list((out / "runs").glob("*/*/*.json"))) >= 2 and _pids_claiming(out, True), proc,
                  base / "k1.log")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    finished = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/*/*.json")}
    assert 2 <= len(finished) < UNITS and _pids_claiming(out, True) == [proc.pid]  # its claim stayed behind

    # 2. the same command again: says what it finds, takes the dead claim over at once; SIGTERM mid-way -> 75
    log, dead = base / "k2.log", proc.pid
    proc = _start(grid["model"], out, 2, log)
    try:  # a unit done and another running (by the command's own loop or its spawned worker)
        _wait_for(lambda: len(list((out / "runs").glob("*/*/*.json"))) > len(finished) and
                  [pid for pid in _pids_claiming(out) if pid != dead], proc, log)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 75, log.read_text()[-4000:]
    finally:
        proc.kill()
    text = log.read_text()
    missing = UNITS - len(finished)
    assert (f"grid: 8 units (cpu, 2 workers here): {len(finished)} finished, {missing} to run, 1 of them claimed "
            f"by a worker that is gone (taken over)") in text, text[-3000:]
    assert "evaluate: stopped (SIGTERM)" in text.splitlines()[-1], text[-3000:]
    assert not list((out / "claims").rglob("*.json"))  # every claim given back
    assert all(p.stat().st_mtime_ns == stamp for p, stamp in finished.items())  # finished units not run again

    # 3. and again: it runs only what is missing, and the summary is the uninterrupted run's
    now = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/*/*.json")}
    capfd.readouterr()
    text = _run(grid["model"], out, 2, capfd)
    assert f"{len(now)} finished, {UNITS - len(now)} to run" in text
    assert all(p.stat().st_mtime_ns == stamp for p, stamp in now.items())
    assert _records(out) == grid["records"] and (out / "summary.md").read_text() == grid["summary"]
