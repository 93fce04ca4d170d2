"""TCP ports on this host for a process group's rendezvous (its own module: the launcher, the rendezvous and the
runtime all need it, and none may import the others).

A port the OS reports free and then lets go of may be taken by any other process before the store that was meant
to serve on it binds it (an outgoing connection gets an ephemeral port from the same range): CI saw rank 0 of a
spawned job fail with 'address already in use' on a port chosen a few seconds earlier. So a store's port is a
listening socket held from the moment it is chosen (`loopback_listener`), and the store serves on that socket.
"""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port free now, not held: only for a server that binds it at once in this process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_listener(port: int = 0, clients: int = 1) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` (0: a port the OS picks, held by this socket until it is closed), its
    backlog room for `clients` connecting at once (at least 128)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(max(128, clients))
    except BaseException:
        listener.close()
        raise
    return listener
