"""What every test shares: ranks forked from one fork server, the check that no process outlives its test, and
the two tiers: `make test` runs every test; `make check` (pytest -m "not slow or check") the tests that start no
process plus one spawned end-to-end run. tests/suite_tiers.py says which tests are which.
"""
import os
import warnings

# Quiet megatron's "TE/apex not installed" warnings; the fallbacks are what CPU tests exercise.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process (torchrun already sets it for its ranks): the suite runs 2 workers on 2 cores, and
# two processes of 2 OpenMP threads each spin-wait on each other's cores — one in-process fine-tuning test took 6-10 s
# beside a copy of itself, 1.5 s with one thread each (measured here, 2 cores). Inherited by every process started.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import multiprocessing.pool  # noqa: E402
import multiprocessing.process  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

import suite_groups  # noqa: E402
import suite_tiers  # noqa: E402
from mlmclm.parallel import launch  # noqa: E402

# Ranks of `launch.spawn` are forked from one fork server that imported torch's heavy parts once (~7 s of the ~9 s
# a spawned rank spent importing, on 2 loaded cores). Not megatron: ranks that put a TE or apex stand-in on sys.path
# must import megatron after that (tests/stand_ins).
launch.use_fork_server(["torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo",
                        "torch._inductor.compile_fx"])


def _import_the_demo_without_its_pin() -> None:
    """Importing recipes.demo pins the CPU kernels in os.environ (mlmclm/cpu_kernels.py), once per process, for the
    demo's own process and what it starts. In a pytest worker the first test to import it (the detour's twin data,
    the demo's fill-mask test) ran with the pin set: what the worker first computed then kept the pinned kernels
    for the rest of the session (ATen picks each kernel at its first call, MKL its reproducibility mode at its first
    product), and so did a fork server started then, while every later subprocess ran unpinned: records that must
    be equal bit for bit differed (test_grid_workers, CI of d34b47a, after that commit's imports moved the first
    computations of a worker). The worker imports it here, before computing anything, with the pin left out; the
    pin itself is tested in subprocesses (tests/test_cpu_kernels.py)."""
    from mlmclm import cpu_kernels

    pin = cpu_kernels.pin
    cpu_kernels.pin = lambda: {}
    try:
        import recipes.demo  # noqa: F401
    finally:
        cpu_kernels.pin = pin


_import_the_demo_without_its_pin()


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


def _listed(table: dict, path: str, name: str) -> bool:
    names = table.get(path, ())
    return names == suite_tiers.ALL or name in names


def pytest_collection_modifyitems(config, items):
    """The tiers' markers, from tests/suite_tiers.py (one table, not a marker in each of ~100 modules); the shared
    session fixtures' files checked, and on an xdist worker the longest groups first (tests/suite_groups.py)."""
    root = Path(str(config.rootpath))
    for item in items:
        path = _path(root, item)
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        if _listed(suite_tiers.SLOW, path, name):
            item.add_marker(pytest.mark.slow)
        if _listed(suite_tiers.CHECK_RUN, path, name):
            item.add_marker(pytest.mark.check)
    problems = suite_groups.misplaced(
        (item.nodeid, _path(root, item), getattr(item, "fixturenames", ())) for item in items)
    if problems:
        raise pytest.UsageError("\n".join(problems))
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the order groups are dealt out
        items.sort(key=lambda item: suite_groups.longest_first(_path(root, item)))  # stable: the rest keep theirs


def _path(root: Path, item) -> str:
    return Path(str(item.path)).relative_to(root).as_posix()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s workers (`--dist loadgroup`): the groups of tests/suite_groups.py, in place of xdist's own."""
    if config.getoption("dist") == "loadgroup":
        return suite_groups.file_group_scheduler(config, log)
    return None


@pytest.fixture(autouse=True)
def fast_tier_starts_no_process(request, monkeypatch):
    """A test not marked `slow` or `check` that starts a process fails, so the fast tier stays free of start-ups as
    tests are added: it belongs in tests/suite_tiers.py's SLOW. Checked in every run, `make test` (CI) included: a
    check made only under `make check` let a test that starts a process break that tier unseen (8810d12 to 0ae4305).
    A worker pool's processes do not count: prepare_data sizes its pool by the machine's cores (none on 2 cores), so
    that would fail one machine's tier and not another's."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("check"):
        yield
        return
    started = []
    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def popen(self, args, *rest, **kwargs):
        started.append(f"subprocess {str(args)[:100]}")
        return popen_init(self, args, *rest, **kwargs)

    def start(self):  # ranks of launch.spawn (torch's start_processes), Process, DataLoader workers
        if getattr(self, "_target", None) is not multiprocessing.pool.worker:
            started.append(f"multiprocessing {self.name}")
        return process_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} started {len(started)} process(es) ({'; '.join(started[:3])}) but is "
                    f"not marked slow: name it in tests/suite_tiers.py SLOW (make check runs no process start-ups "
                    f"but its one end-to-end run)", pytrace=False)


@pytest.fixture(autouse=True)
def _cpu_kernel_pins_stay_in_their_test():
    """Importing recipes.demo pins the CPU kernels through environment variables (mlmclm/cpu_kernels.PINNED) for the
    processes started after it. A test that imports it in the pytest process (the detour's twin data does) left them
    set: later tests' subprocess workers then ran pinned kernels while their in-process reference did not, and
    records that must be equal bit for bit differed (test_grid_workers, CI after the Slurm detour test). Each test's
    changes to them are undone when it ends."""
    from mlmclm.cpu_kernels import PINNED

    before = {name: os.environ.get(name) for name in PINNED}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
