import os
import warnings

# Quiet megatron's "TE/apex not installed" warnings; the fallbacks are what CPU tests exercise.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import psutil  # noqa: E402
import pytest  # noqa: E402

from mlmclm.parallel import launch  # noqa: E402

# Ranks of `launch.spawn` are forked from one fork server that imported torch's heavy parts once (~7 s of the ~9 s
# a spawned rank spent importing, on 2 loaded cores). Not megatron: ranks that put a TE or apex stand-in on sys.path
# must import megatron after that (tests/stand_ins).
launch.use_fork_server(["torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo",
                        "torch._inductor.compile_fx"])


def _leftovers() -> list:
    """Processes this test session started that are still running, except multiprocessing's resource tracker and
    fork server (one each per session, shared by every spawn). The ranks forked from the server carry its command
    line too: they are its children, not this process's, and they count."""
    me = psutil.Process()
    return [p for p in me.children(recursive=True)
            if not ("resource_tracker" in " ".join(_cmdline(p))
                    or (_ppid(p) == me.pid and "multiprocessing.forkserver" in " ".join(_cmdline(p))))]


def _ppid(proc) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


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
