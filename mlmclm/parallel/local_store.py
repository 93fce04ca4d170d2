"""TCP stores for processes on this host only, listening on the loopback interface.

torch's `TCPStore` server listens on every interface (`::`, whatever host name it is given), unauthenticated: any
host that reaches the port may read or set keys while a local job runs (the side store of `launch.spawn`, used by
`convert_from_hf` and `convert_to_hf --verify`; the process group's store of a single process or a spawned job).
Where every rank is on this host (the store's address is a loopback one) the server here listens on a socket
bound to 127.0.0.1 (`master_listen_fd`, which the store then owns and closes). Multi-node jobs (torchrun, Slurm)
keep torch's own stores: other hosts must reach them.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

from mlmclm.parallel.ports import loopback_listener

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def is_loopback(host: str | None) -> bool:
    return host in LOOPBACK_HOSTS or str(host).startswith("127.")


def loopback_store(port: int, world_size: int, is_master: bool, timeout: timedelta, wait_for_workers: bool = True,
                   listener: socket.socket | None = None):
    """A TCPStore at 127.0.0.1:`port`; its server (`is_master`) listens on 127.0.0.1 only: on `listener` where the
    port was held since it was chosen (`ports.loopback_listener`; the store owns it from then on), else on a socket
    bound now."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    if listener is None:
        listener = loopback_listener(port, world_size)
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True, timeout=timeout,
                              wait_for_workers=wait_for_workers, master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()   # the store's server owns the descriptor now (and closes it when it ends)
    return store


def process_group_store(timeout: timedelta, listener: socket.socket | None = None):
    """The store `init_process_group` would make from MASTER_ADDR/MASTER_PORT, bound to loopback, or None where
    torch's own must be used (another host's address, or torchrun's agent store). Rank 0 serves on `listener`
    where MASTER_PORT was held since it was chosen."""
    if not is_loopback(os.environ.get("MASTER_ADDR")) or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        if listener is not None:
            listener.close()
        return None
    return loopback_store(int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                          os.environ["RANK"] == "0", timeout, listener=listener)
