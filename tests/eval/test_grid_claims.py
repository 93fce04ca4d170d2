"""Claims on a unit of the grid (mlmclm/eval/grid/claims.py): created exactly once among processes racing for it,
taken over exactly once when stale (its worker stopped beating, or is a process of this host that is gone), never
while its worker beats, and a worker that lost its claim knows it. Real processes racing on real files."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlmclm.eval.grid.claims import ClaimStore, Heartbeat, process_start

ROOT = Path(__file__).resolve().parents[2]
UNITS = [f"m/t/lr0.001_seed{seed}" for seed in range(12)]

# Each racer waits for the start file, then tries every unit (claim, or take over when stale) and prints what it got.
RACER = """
import json, sys, time
from pathlib import Path
from mlmclm.eval.grid.claims import ClaimStore
out, start, units = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
store = ClaimStore(out)
print("ready", flush=True)
while not start.exists():
    time.sleep(0.001)
print(json.dumps([u for u in units if store.claim(u, "fp") or store.take_over(u, "fp")]), flush=True)
"""


def _race(out: Path, racers: int = 6) -> list[list[str]]:
    start = out / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLMCLM_GRID_STALE_SECONDS": "600"}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(out), str(start), json.dumps(UNITS)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(racers)]
    assert [proc.stdout.readline() for proc in procs] == ["ready\n"] * racers  # every one up and polling
    start.touch()
    return [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]


def test_processes_racing_for_units_claim_each_exactly_once(tmp_path):
    won = _race(tmp_path)
    assert sorted(unit for units in won for unit in units) == sorted(UNITS)
    claims = {json.loads(ClaimStore(tmp_path).path(u).read_text())["worker"] for u in UNITS}
    assert len(claims) >= 1 and all(c.count(":") == 2 for c in claims)


def test_a_stale_claim_is_taken_over_exactly_once_and_a_beating_one_never(tmp_path):
    owner = ClaimStore(tmp_path, worker="elsewhere:1:aaaaaa")  # another node: only its beat says it is alive
    for unit in UNITS:
        assert owner.claim(unit, "fp")
    old = time.time() - 3600
    for unit in UNITS[:6]:
        os.utime(owner.path(unit), (old, old))  # stopped beating an hour ago (stale after 10 min here)
    won = _race(tmp_path)
    taken = sorted(unit for units in won for unit in units)
    assert taken == sorted(UNITS[:6])  # each stale one by exactly one racer; the beating ones by none
    for unit in UNITS[:6]:
        assert not owner.holds(unit) and not owner.beat(unit)  # the old owner sees it lost the unit
    assert all(owner.holds(unit) for unit in UNITS[6:])
    assert not list(tmp_path.rglob("*.stale.*"))  # the renamed-away claims are gone


def test_the_claim_of_a_process_of_this_host_that_is_gone_is_taken_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMCLM_GRID_STALE_SECONDS", "3600")
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    store = ClaimStore(tmp_path)
    assert store.claim("m/t/u", "fp")
    claim = json.loads(store.path("m/t/u").read_text())
    claim["pid"], claim["pid_start"] = dead.pid, process_start(dead.pid)
    store.path("m/t/u").write_text(json.dumps(claim))
    other = ClaimStore(tmp_path)
    assert not other.take_over("m/t/u", "fp")  # its process still runs: not stale, whatever its beat
    dead.kill()
    dead.wait()
    assert other.take_over("m/t/u", "fp") and other.holds("m/t/u")  # gone: taken without waiting an hour


def test_the_heartbeat_keeps_a_claim_fresh_and_notices_when_it_is_lost(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMCLM_GRID_BEAT_SECONDS", "0.05")
    monkeypatch.setenv("MLMCLM_GRID_STALE_SECONDS", "0.5")
    store = ClaimStore(tmp_path)
    assert store.claim("m/t/u", "fp")
    old = time.time() - 10
    os.utime(store.path("m/t/u"), (old, old))
    with Heartbeat(store, "m/t/u") as heartbeat:
        time.sleep(0.3)
        assert time.time() - store.path("m/t/u").stat().st_mtime < 0.3 and not heartbeat.lost.is_set()
        store.path("m/t/u").write_text(json.dumps({"worker": "someone else"}))  # taken over meanwhile
        time.sleep(0.3)
        assert heartbeat.lost.is_set()


def test_a_taker_that_looked_before_another_took_over_takes_nothing_and_leaves_the_new_claim(tmp_path, monkeypatch):
    """The interleaving CI hit under load: B reads the stale claim; A takes it over (its fresh claim); then B acts on
    what it read. Renaming A's claim away would let C claim the unit in the gap, and A and C would both run it."""
    unit = UNITS[0]
    owner = ClaimStore(tmp_path, worker="elsewhere:1:aaaaaa")
    assert owner.claim(unit, "fp")
    old = time.time() - 3600
    os.utime(owner.path(unit), (old, old))
    a, b, c = (ClaimStore(tmp_path, worker=f"here:{n}:bbbbbb") for n in (2, 3, 4))
    looked = b.read(unit)  # B's look: the stale claim
    assert b.stale(looked) and a.take_over(unit, "fp") and a.holds(unit)
    real_read, real_rename = ClaimStore.read, os.rename
    reads = [looked]
    monkeypatch.setattr(b, "read", lambda u: reads.pop() if reads else real_read(b, u))

    def rename_then_c_claims(src, dst):  # C claims the moment the path is free
        real_rename(src, dst)
        c.claim(unit, "fp")

    monkeypatch.setattr(os, "rename", rename_then_c_claims)
    assert not b.take_over(unit, "fp")
    assert a.holds(unit) and not c.holds(unit)  # A's claim stands; nobody else runs the unit
    assert sorted(p.name for p in owner.path(unit).parent.iterdir()) == [owner.path(unit).name]  # no token left
