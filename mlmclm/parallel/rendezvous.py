"""A fresh rendezvous port for each process group that the same processes start again (`launch.spawn`'s workers).

Tests and CPU benchmarks run several trainings one after the other in one set of spawned processes (a process
start costs seconds). Each training starts and destroys its own process group, whose TCP store rank 0 serves on
MASTER_PORT. Re-using that port lets a rank that finished first reach the previous group's store while a slower
rank still serves it (stale keys, then 'Connection refused'); a port derived from it (port + 1, ...) may be held by
anything else on the host by then ('address already in use': seen in CI). So the spawned processes share one
small side store for their whole life, and before each group starts rank 0 takes a port from the OS, listening on
it already, and publishes it there under the group's ordinal; the others wait for that key. No rank can start
group k + 1 before rank 0 has finished group k, and no other process can take the port between its choice and the
group's store (rank 0 serves the store on that very socket). The side store's own port is held the same way, by
`launch.spawn`, from before the ranks start (`open_side_store`'s `listener`).

Processes not started by `launch.spawn` (torchrun, Slurm, a single process) have no side store: nothing changes.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

from mlmclm.parallel.local_store import loopback_store
from mlmclm.parallel.ports import loopback_listener

_side_store = None
_groups_started = 0


def open_side_store(port: int, rank: int, world_size: int, listener: socket.socket | None = None) -> None:
    """Join (rank 0: serve, on `listener` where the port is held already) the side store for these processes'
    whole life."""
    global _side_store
    # on 127.0.0.1 only: torch's own server would listen on every interface, unauthenticated
    _side_store = loopback_store(port, world_size, rank == 0, timedelta(minutes=10), wait_for_workers=False,
                                 listener=listener)


def use_fresh_port() -> socket.socket | None:
    """Point the next `init_process_group` (env://) at a port chosen for it now; a no-op outside `launch.spawn`.

    Returns, on rank 0, the socket that holds the port (listening already): the group's store must serve on it."""
    global _groups_started
    if _side_store is None:
        return None
    _groups_started += 1
    key = f"mlmclm/master_port/{_groups_started}"
    listener = None
    if os.environ["RANK"] == "0":
        listener = loopback_listener(clients=int(os.environ["WORLD_SIZE"]))
        _side_store.set(key, str(listener.getsockname()[1]))
    os.environ["MASTER_PORT"] = _side_store.get(key).decode()
    return listener
