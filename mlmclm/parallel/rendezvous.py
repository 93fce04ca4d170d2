"""A fresh rendezvous port for each process group that the same processes start again (`launch.spawn`'s workers).

Tests and CPU benchmarks run several trainings one after the other in one set of spawned processes (a process
start costs seconds). Each training starts and destroys its own process group, whose TCP store rank 0 serves on
MASTER_PORT. Re-using that port lets a rank that finished first reach the previous group's store while a slower
rank still serves it (stale keys, then 'Connection refused'); a port derived from it (port + 1, ...) may be held by
anything else on the host by then ('address already in use': seen in CI). So the spawned processes share one
small side store for their whole life, and before each group starts rank 0 asks the OS for a free port and
publishes it there under the group's ordinal; the others wait for that key. No rank can start group k + 1 before
rank 0 has finished group k, and the port is free a moment before rank 0 binds it.

Processes not started by `launch.spawn` (torchrun, Slurm, a single process) have no side store: nothing changes.
"""
from __future__ import annotations

import os
from datetime import timedelta

from mlmclm.parallel.local_store import loopback_store
from mlmclm.parallel.ports import free_port

_side_store = None
_groups_started = 0


def open_side_store(port: int, rank: int, world_size: int) -> None:
    """Join (rank 0: serve) the side store for these processes' whole life."""
    global _side_store
    # on 127.0.0.1 only: torch's own server would listen on every interface, unauthenticated
    _side_store = loopback_store(port, world_size, rank == 0, timedelta(minutes=10), wait_for_workers=False)


def use_fresh_port() -> None:
    """Point the next `init_process_group` (env://) at a port chosen for it now; a no-op outside `launch.spawn`."""
    global _groups_started
    if _side_store is None:
        return
    _groups_started += 1
    key = f"mlmclm/master_port/{_groups_started}"
    if os.environ["RANK"] == "0":
        _side_store.set(key, str(free_port()))
    os.environ["MASTER_PORT"] = _side_store.get(key).decode()
