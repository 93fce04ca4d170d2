import os
import warnings

# Quiet megatron's "TE/apex not installed" warnings; the fallbacks are what CPU tests exercise.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import psutil  # noqa: E402
import pytest  # noqa: E402


def _leftovers() -> list:
    """Processes this test session started that are still running, except multiprocessing's resource tracker (one
    per session, shared by every spawn)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(_cmdline(p))]


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    """Every process a test starts (ranks, torchrun agents, their children) ends with the test, pass or
    fail: leftovers are killed, and reported as the test's error."""
    yield
    leftovers = _leftovers()
    if leftovers:
        _, alive = psutil.wait_procs(leftovers, timeout=5)  # a helper that dies with its parent needs a moment
        for proc in alive:
            proc.kill()
        psutil.wait_procs(alive, timeout=10)
        assert not alive, f"processes left running by this test: {[(p.pid, _cmdline(p)[:5]) for p in alive]}"
