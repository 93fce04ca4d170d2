"""`make test`'s two xdist workers (tests/suite_groups.py): each costly session fixture set up by one worker, a
file's tests on one worker, the longest group dealt out first, and a test that would set a shared fixture up again
refused at collection."""
import collections
import os
import subprocess
import sys
from pathlib import Path

import suite_groups

REPO = Path(__file__).resolve().parents[1]

# Where each test ran, then skipped before any fixture is set up: the scheduling is what is tested, not the tests.
RECORDER = '''
import os, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open(os.environ["WHERE_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER')} {item.nodeid}\\n")
    pytest.skip("scheduling only")
'''


def test_each_shared_fixtures_files_and_each_file_run_on_one_worker(tmp_path):
    (tmp_path / "where_recorder.py").write_text(RECORDER)
    log = tmp_path / "where.log"
    files = ["tests/cluster", "tests/convert/test_convert_errors.py", "tests/convert/test_convert_verify.py",
             "tests/test_bounded_read.py", "tests/test_redact.py"]
    env = {**os.environ, "WHERE_LOG": str(log), "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                          "--no-loadscope-reorder", "-p", "where_recorder", *files],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line.split(" ", 1) for line in log.read_text().splitlines()]
    workers_of = collections.defaultdict(set)
    first_of = {}
    for worker, nodeid in rows:
        workers_of[suite_groups.worker_group(nodeid.split("::", 1)[0])].add(worker)
        first_of.setdefault(worker, nodeid)
    assert {"slurm_cluster", "tp2pp2_run", "tests/test_bounded_read.py", "tests/test_redact.py"} <= set(workers_of)
    split = {group: sorted(workers) for group, workers in workers_of.items() if len(workers) > 1}
    assert not split, f"groups run by more than one worker: {split}"
    assert len({w for ws in workers_of.values() for w in ws}) == 2, f"one worker did everything: {dict(workers_of)}"
    # the longest group (suite_tiers.LONGEST_FIRST) is the first a worker starts
    assert any(nodeid.startswith("tests/cluster/") for nodeid in first_of.values()), first_of


def test_the_groups_follow_the_listed_files():
    assert suite_groups.worker_group("tests/cluster/test_slurm_eval.py") == "slurm_cluster"
    assert suite_groups.worker_group("tests/convert/test_convert_verify.py") == "tp2pp2_run"
    assert suite_groups.worker_group("tests/recipes/test_recipes_ctrl_c.py") == "uninterrupted_tiny_run"
    assert suite_groups.worker_group("tests/convert/test_convert_llama.py") == "tests/convert/test_convert_llama.py"
    assert suite_groups.worker_group("tests/clusterx/test_a.py") == "tests/clusterx/test_a.py"  # a prefix is a folder


def test_a_shared_fixture_used_from_an_unlisted_file_is_named():
    problems = suite_groups.misplaced([
        ("tests/convert/test_new.py::test_x", "tests/convert/test_new.py", ("tmp_path", "tp2pp2_run")),
        ("tests/convert/test_convert_verify.py::test_y", "tests/convert/test_convert_verify.py", ("tp2pp2_run",)),
        ("tests/test_redact.py::test_z", "tests/test_redact.py", ("tmp_path",)),
    ])
    assert len(problems) == 1
    assert problems[0].startswith("tests/convert/test_new.py::test_x uses the session fixture 'tp2pp2_run'")
    assert "SHARED_FIXTURE_FILES" in problems[0]

