"""Start N local worker processes wired as a torch.distributed job (what torchrun does, in-process).

Used by multi-process tests and CPU benchmarks; real runs use torchrun or Slurm (see `cluster/`).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch.multiprocessing as mp

from mlmclm.parallel import rendezvous
from mlmclm.parallel.ports import free_ports


def _worker(local_rank: int, fn: Callable, world_size: int, ports: tuple[int, int], args: tuple) -> None:
    master_port, side_port = ports
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    rendezvous.open_side_store(side_port, local_rank, world_size)  # each init_parallel then gets a fresh port
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
    context = mp.start_processes(_worker, args=(fn, world_size, tuple(free_ports(2)), args), nprocs=world_size,
                                 join=False, start_method="spawn")
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
