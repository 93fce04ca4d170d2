"""Every section of the GPU session stops itself before its deadline and writes its JSON when it ends (issue 55):
a deadline that cuts a section is reported "not reached", never "failed", and the processes it started are gone.

`gpu_deadline` is checked in this process (a deadline inside a sleep, a process group started in its own session);
then each section runs on CPU under a shortened budget as the shell runs it (`gpu_session.py run`, its own
process), and must end before the shell's `timeout` would kill it (budget + MARGIN_S): on a loaded machine most
budgets here end inside the section's imports, model builds or runs, which is where the old sections overran;
determinism's ends inside its runs on any host seen."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_deadline  # noqa: E402
import gpu_session  # noqa: E402

# Short enough to cut the sections with processes (determinism's runs, train_check's torchrun launches) mid-way on
# a loaded machine. determinism's is below what it needs on the fastest idle host seen (an Intel Xeon, 2 cores: done
# in 13-15 s; at 7 s its three ranks had started), so every run of this test sees a section cut: at 16 s an idle run
# there cut none and the test failed (CI of 88814b0).
BUDGETS = {"environment": 6, "speed_bf16": 12, "speed_fp8": 6, "memory": 10, "determinism": 7,
           "train_check": 16, "features": 10}


def test_the_deadline_cuts_a_piece_of_work_and_kills_the_groups_it_started():
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    gpu_deadline.started_group(sleeper.pid)
    began = time.monotonic()
    with pytest.raises(gpu_deadline.DeadlineReached, match="deadline"):
        with gpu_deadline.enforced(time.monotonic() + 0.5):
            time.sleep(30)
    assert time.monotonic() - began < 5
    assert sleeper.wait(timeout=5) == -9  # killed with its group when the section's block ended
    with gpu_deadline.enforced(time.monotonic() + 30):  # work that ends in time: nothing raised, timer gone
        pass
    time.sleep(0.2)


@pytest.mark.timeout(300)
def test_each_section_ends_before_its_deadline_under_a_short_budget(tmp_path):
    assert set(BUDGETS) == {name for name, _, _ in gpu_session.SECTIONS}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GPU_SESSION_PEAK_TFLOPS": "0.05", "PYTHONUNBUFFERED": "1",
           "GPU_SESSION_WORK": str(tmp_path / "work"), "PYTHONPATH": str(ROOT)}
    (tmp_path / "work" / "logs").mkdir(parents=True)
    out = tmp_path / "out"
    gpu_session.start(out)
    results = {}
    for name, budget in BUDGETS.items():
        began = time.monotonic()
        with open(tmp_path / "work" / "logs" / f"{name}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "run", name,
                                     "--out", str(out), "--budget-s", str(budget)], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                proc.wait(timeout=budget + gpu_session.MARGIN_S)  # what the shell's `timeout` allows
            except subprocess.TimeoutExpired:
                for child in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
                    child.kill()
                proc.wait()
                pytest.fail(f"{name} ran past its budget + margin ({budget} + {gpu_session.MARGIN_S} s)")
        seconds = time.monotonic() - began
        data = json.loads((out / f"{name}.json").read_text())
        results[name] = (data["status"], round(seconds, 1))
        assert data["status"] in ("ok", "not reached"), (name, data["result"].get("error"), data["result"])
        assert proc.returncode == 0, name
        assert data["seconds"] <= budget + gpu_deadline.GRACE_S + 1, (name, data["seconds"])
        if data["status"] == "not reached":
            assert "deadline" in data["result"]["not_reached"]
        assert data["result"]["log_tail"]
    print("status and seconds per section under short budgets:", results)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_run"] == ["install"]
    assert {n: s["status"] for n, s in summary["sections"].items() if n != "install"} == {
        n: status for n, (status, _) in results.items()}
    assert results["determinism"][0] == "not reached", results  # the budgets did cut a section with processes
