"""Workers started early (mlmclm/eval/grid/spawn.py): `tools/evaluate.py grid --workers N --device cpu` starts its
N-1 extra workers before its own imports; a command that ends without using them (a refusal) leaves none running,
and a worker whose command hands it no work ends by itself. Real processes; the grid itself with early workers is
test_grid_workers.py's killed-command test (it runs the script)."""
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from mlmclm.eval.grid import spawn

ROOT = Path(__file__).resolve().parents[2]


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries `mark` (a command's early workers are reparented when it exits)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GRID_SPAWN_TEST") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def test_only_a_cpu_grid_with_several_workers_starts_them_early(monkeypatch):
    started = []
    monkeypatch.setattr(spawn, "spawn_worker", lambda env: started.append(env) or object())
    monkeypatch.setattr(spawn, "_early", [])
    assert spawn.start_early(["grid", "--model", "m=x", "--workers", "3", "--device", "cpu", "--output", "o"]) == 2
    assert spawn.start_early(["grid", "--workers=2", "--device=cpu"]) == 1
    assert started == [{}, {}, {}]  # CPU workers need no environment of their own
    started.clear()
    for argv in (["grid", "--workers", "3"],  # --device auto: maybe GPUs, whose workers each need their own
                 ["grid", "--workers", "3", "--device", "cuda"], ["grid", "--workers", "1", "--device", "cpu"],
                 ["grid", "--list", "--workers", "3", "--device", "cpu"], ["summary", "--workers", "3"],
                 ["grid", "--workers", "three", "--device", "cpu"], ["grid", "--device", "cpu", "--workers"], []):
        assert spawn.start_early(argv) == 0, argv  # anything it cannot read is the real parser's to refuse
    assert started == []


def test_a_refused_command_leaves_no_early_worker_running(tmp_path):
    """The refusal's one line and exit 2, with early workers started; none outlives the command."""
    mark = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "tools/evaluate.py", "grid", "--model", f"m={tmp_path / 'missing'}",
                           "--smoke", "--workers", "3", "--device", "cpu", "--output", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRID_SPAWN_TEST": mark})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "evaluate: error:" in proc.stderr, proc.stderr
    assert not _marked(mark), [p.pid for p in _marked(mark)]


def test_a_worker_handed_no_work_ends_quietly():
    worker = spawn.spawn_worker({})
    worker.stdin.close()  # its command died, or ended without running units
    assert worker.wait(timeout=300) == 0


def test_early_workers_a_command_did_not_use_are_killed_as_it_exits(tmp_path):
    """A command that exits at once (here before the workers' imports could end) takes its unused early workers
    with it: none is left importing torch for nobody. (Their output goes nowhere: a pipe they inherited would keep
    this test waiting for them.)"""
    mark, pids = uuid.uuid4().hex, tmp_path / "pids"
    code = ("import sys; from mlmclm.eval.grid import spawn; spawn.start_early(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(' '.join(str(p.pid) for p in spawn._early))")
    proc = subprocess.run([sys.executable, "-c", code, str(pids), "grid", "--workers", "3", "--device", "cpu"],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                          env={**os.environ, "GRID_SPAWN_TEST": mark})
    assert proc.returncode == 0 and len(pids.read_text().split()) == 2
    assert not _marked(mark), [p.pid for p in _marked(mark)]
