"""Process groups started again and again in the same spawned processes, as the training tests do: each group
rendezvous on a port of its own, and a rank that finishes first cannot reach the previous group's store."""
import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

GROUPS = 3


def _listening() -> list[str]:
    """The addresses this process's TCP sockets listen on (the OS's own view, as `ss -ltn` shows it)."""
    import psutil

    return sorted({conn.laddr.ip for conn in psutil.Process().net_connections("tcp") if conn.status == "LISTEN"})


def _start_groups(report_dir):
    ports, sums, listening = [], [], []
    for group in range(GROUPS):
        init_parallel(ParallelConfig(), timeout_minutes=1)  # on failure: an error within a minute, not a hang
        ports.append(int(os.environ["MASTER_PORT"]))
        listening += _listening()
        value = torch.tensor([float(dist.get_rank() + 1 + 10 * group)])
        dist.all_reduce(value)
        sums.append(value.item())
        if dist.get_rank() == 0:
            time.sleep(1.0)  # rank 1 is done with this group long before rank 0 tears it down
        destroy_parallel()
    with open(os.path.join(report_dir, f"rank{os.environ['RANK']}.json"), "w") as out:
        json.dump({"ports": ports, "sums": sums, "listening": sorted(set(listening))}, out)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    """One spawn of 2 ranks that start and end 3 process groups; each rank's report (both tests read it)."""
    report_dir = tmp_path_factory.mktemp("rendezvous")
    spawn(_start_groups, 2, str(report_dir))
    return [json.loads((report_dir / f"rank{r}.json").read_text()) for r in range(2)]


def test_each_group_rendezvous_on_a_port_of_its_own(reports):
    assert reports[0]["ports"] == reports[1]["ports"], "the ranks met on different ports"
    assert len(set(reports[0]["ports"])) == GROUPS, reports[0]["ports"]
    for report in reports:
        assert report["sums"] == [3.0 + 20 * group for group in range(GROUPS)]


def test_local_stores_listen_on_loopback_only(reports):
    """The side store of launch.spawn (used by convert_from_hf and convert_to_hf --verify) and each process group's
    store: torch's server listened on every interface ('::', unauthenticated); now their sockets are bound to
    127.0.0.1, as the ranks' own gloo sockets are. A single process (no torchrun) likewise."""
    import subprocess
    import sys

    for rank, report in enumerate(reports):
        assert report["listening"] and set(report["listening"]) <= {"127.0.0.1"}, (rank, report["listening"])
    single = subprocess.run(
        [sys.executable, "-c", "import json, sys; sys.path.insert(0, 'tests/parallel'); import test_rendezvous as t; "
         "from mlmclm.parallel import ParallelConfig, init_parallel; init_parallel(ParallelConfig()); "
         "print(json.dumps(t._listening()))"],
        capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert single.returncode == 0, single.stderr[-2000:]
    assert json.loads(single.stdout.splitlines()[-1]) == ["127.0.0.1"]


def _port_is_taken(port: int) -> bool:
    """Whether another socket could bind this loopback port now (what any other process on the host could do)."""
    import errno
    import socket

    with socket.socket() as thief:
        try:
            thief.bind(("127.0.0.1", port))
        except OSError as error:
            assert error.errno == errno.EADDRINUSE, error
            return True
    return False


def test_a_groups_port_is_held_from_its_choice_until_its_store_serves_on_it(monkeypatch):
    """CI: rank 0 of a spawned job died with 'address already in use' on a port chosen free seconds before; a port
    only chosen, not held, may be taken by any process (an outgoing connection's ephemeral port) before its store
    binds it. Rank 0 now publishes a port it listens on already, and the group's store serves on that socket. One
    process with a side store of its own, as a spawned rank 0 has (the module's state restored afterwards)."""
    from mlmclm.parallel import rendezvous
    from mlmclm.parallel.local_store import process_group_store
    from mlmclm.parallel.ports import free_port

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    saved = rendezvous._side_store, rendezvous._groups_started
    try:
        rendezvous.open_side_store(free_port(), 0, 1)
        held = rendezvous.use_fresh_port()
        port = int(os.environ["MASTER_PORT"])
        assert port != 1 and _port_is_taken(port), "the published port was free for anyone to take"
        store = process_group_store(timedelta(seconds=30), held)
        store.set("served", "on the held socket")
        assert store.get("served") == b"on the held socket" and store.port == port
        del store
    finally:
        rendezvous._side_store, rendezvous._groups_started = saved
