"""Start N local worker processes wired as a torch.distributed job (what torchrun does, in-process).

Used by multi-process tests and CPU benchmarks; real runs use torchrun or Slurm (see `cluster/`).

Each rank is a fresh interpreter ("spawn"), which costs seconds of imports (torch alone ~3 s, with megatron's
~9 s on a 2-core machine). `use_fork_server` makes every later `spawn` of this process fork its ranks from one
fork server instead, a process that imported the given modules once and ran nothing: each rank is still a new
process with no state of any other run, and it gets what a spawned one inherits from this process at the time of
the call: environment, working directory, `sys.path`, umask, and standard output and error (a test's captured
output holds its ranks' tracebacks). The test suite uses it (tests/conftest.py).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch.multiprocessing as mp

from mlmclm.parallel import rendezvous
from mlmclm.parallel.ports import loopback_listener


_start_method = "spawn"


def use_fork_server(preload: list[str]) -> None:
    """Every later `spawn` in this process forks its ranks from a fork server that imported `preload` once.

    Preload only what no rank's set-up changes: a module a rank must import after setting something up (a stand-in
    on `sys.path`, an environment variable read at import) has to be imported by that rank, not by the server. The
    server starts at the first `spawn` and ends with this process."""
    global _start_method
    mp.set_forkserver_preload(list(preload))
    _start_method = "forkserver"


class _CallerState:
    """What a rank forked from the fork server takes from the caller of `spawn` instead of from the server (which
    started earlier, maybe under another test's umask or captured output): the environment, the umask, and
    standard output and error, sent as file descriptors with the call (multiprocessing's DupFd)."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def __reduce__(self):
        from multiprocessing import reduction

        return (_ForkedCaller, (self.environ, self.umask, reduction.DupFd(1), reduction.DupFd(2)))


class _ForkedCaller:
    def __init__(self, environ: dict[str, str], umask: int, stdout, stderr):
        self.environ, self.umask, self.streams = environ, umask, (stdout, stderr)

    def apply(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        os.umask(self.umask)
        for target, handle in zip((1, 2), self.streams):
            fd = handle.detach()
            os.dup2(fd, target)
            os.close(fd)


class _HeldPort:
    """The side store's port, chosen and listened on by the caller of `spawn` before any rank starts, so that no
    other process can take it while the ranks start (seconds; CI saw 'address already in use' when the port was
    only chosen there). Each rank receives a duplicate of the listening socket (multiprocessing's DupFd, under
    spawn and the fork server alike): rank 0 serves the side store on it, the others close theirs."""

    def __init__(self, listener):
        self.port, self.listener = listener.getsockname()[1], listener

    def __reduce__(self):
        from multiprocessing import reduction

        return (_InheritedPort, (self.port, reduction.DupFd(self.listener.fileno())))


class _InheritedPort:
    def __init__(self, port: int, handle):
        self.port, self.handle = port, handle

    def take(self, is_rank_0: bool):
        """Rank 0: the listening socket; any other rank: None (its duplicate closed)."""
        import socket

        listener = socket.socket(fileno=self.handle.detach())
        listener.set_inheritable(False)   # this rank's own children never hold the port
        if is_rank_0:
            return listener
        listener.close()
        return None


def _worker(local_rank: int, fn: Callable, world_size: int, side_port: _InheritedPort, args: tuple,
            caller: _ForkedCaller | None = None) -> None:
    if caller is not None:  # forked from the fork server
        caller.apply()
    # MASTER_PORT is set by each init_parallel (rendezvous.use_fresh_port), from a port rank 0 holds already
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    # each init_parallel then gets a fresh port through the side store
    rendezvous.open_side_store(side_port.port, local_rank, world_size, side_port.take(local_rank == 0))
    from mlmclm import quiet

    quiet.install(children=False)  # the known third-party warnings, as in the process that spawned this one
    # One thread per rank: ranks share the machine's cores, and fewer threads keep results reproducible.
    import torch

    torch.set_num_threads(1)
    fn(*args)


def spawn(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run `fn(*args)` on `world_size` fresh processes; raises if any of them fails.

    When one fails, the others are killed at once (training turns torch's SIGTERM into "save at the next step", so
    it would wait in a collective with the dead rank until torch's 30 s grace ends), with their children.
    """
    caller = _CallerState() if _start_method == "forkserver" else None
    with loopback_listener(clients=world_size) as side_listener:  # each rank took a duplicate at its start
        context = mp.start_processes(_worker, args=(fn, world_size, _HeldPort(side_listener), args, caller),
                                     nprocs=world_size, join=False, start_method=_start_method)
    try:
        while not context.join(grace_period=0):
            pass
    except BaseException:
        kill_tree([p.pid for p in context.processes])
        raise


def kill_tree(pids: list[int]) -> None:
    """SIGKILL these processes and all their descendants, then reap them."""
    import psutil

    victims = []
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            victims += parent.children(recursive=True) + [parent]
        except psutil.NoSuchProcess:
            pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)
