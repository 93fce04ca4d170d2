"""The determinism section forks its runs from a fork server; a child forked after anything asked CUDA for its
devices (megatron's `dist_checkpointing` and torch's `cpp_extension` call `torch.cuda.is_available()` at import)
is in a "bad fork" and fails at its first `torch.cuda.set_device`. On CPU the same poisoning happens (a CUDA build
of torch asks the driver, finds none, and still arms the check), so this is seen without a GPU."""
import multiprocessing.forkserver
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import determinism_check  # noqa: E402


def test_a_run_forked_from_the_fork_server_is_not_in_a_bad_fork():
    try:
        child = determinism_check._context().Process(target=determinism_check.refuse_bad_fork)
        child.start()
        child.join(timeout=120)
        assert child.exitcode == 0, "the forked run is in a bad fork: CUDA would refuse to initialise there"
    finally:
        multiprocessing.forkserver._forkserver._stop()  # the server is this test's process, not the suite's
        determinism_check._CONTEXT = None
