"""Who runs which unit: claim files under OUT/claims/, shared by every worker of every command on every node.

A shared filesystem across nodes (NFS, Lustre) gives no reliable lock (`fcntl` locks are advisory, and on NFS
depend on a lock daemon), so only two atomic operations are used:
- **`O_CREAT | O_EXCL`** creates `claims/<unit>.json`: of all the workers that try at once, one succeeds; it
  writes its worker id, host, pid (and the pid's start time), since when, and the unit's fingerprint.
- **`rename`** takes a claim over: the one worker that creates (O_EXCL) a token named after that stale claim, and
  finds the claim still there, renames it to a name of its own and creates a new claim with O_EXCL.
The claim's mtime is its heartbeat: its worker touches it every `beat_s` seconds while the unit runs. A claim is
stale when its mtime is older than `stale_s` (clocks of the nodes must agree to well within that: NTP), or at once
when it names a process of this host that is gone (a killed worker's unit need not wait out the heartbeat). A worker
that finds its claim no longer its own (taken over after it failed to beat: a stopped or starved process) drops the
unit's result. A crash between the create and the write leaves an empty claim: stale by its mtime alone.

Failures go to `failed/<unit>.json` (why, by whom, when): a failed unit is not run again by commands that started
before it failed, and once more by a command started later (grid.worker).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.progress_log import seconds_from_env

CLAIMS_FOLDER = "claims"
FAILED_FOLDER = "failed"
BEAT_ENV, STALE_ENV = "MLMCLM_GRID_BEAT_SECONDS", "MLMCLM_GRID_STALE_SECONDS"
DEFAULT_BEAT_S, DEFAULT_STALE_S = 10.0, 120.0


def process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22): with the pid, it names
    one process, not a later one that reuses the pid. None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass
class Claim:
    unit: str
    worker: str
    host: str
    pid: int
    pid_start: str | None
    since: float  # time.time() when claimed
    fingerprint: str
    beat: float = 0.0  # the file's mtime when read

    def process_gone(self) -> bool:
        return self.host == socket.gethostname() and process_start(self.pid) != self.pid_start


def _instance(claim: Claim) -> str:
    """One claim file's identity, the same for every worker that reads it: its worker and creation time (an
    unreadable one, left by a crash before its write: its mtime, which nothing touches any more)."""
    key = f"{claim.worker}|{claim.since!r}" if claim.worker else f"unreadable|{claim.beat!r}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class ClaimStore:
    """The claim and failure files of one output folder, as seen by one worker (`worker`: its id)."""

    def __init__(self, output_dir: Path, worker: str | None = None):
        self.root = Path(output_dir) / CLAIMS_FOLDER
        self.failed_root = Path(output_dir) / FAILED_FOLDER
        self.worker = worker or new_worker_id()
        self.beat_s = seconds_from_env(BEAT_ENV, DEFAULT_BEAT_S)
        self.stale_s = seconds_from_env(STALE_ENV, DEFAULT_STALE_S)

    def path(self, unit: str) -> Path:
        return self.root / f"{unit}.json"

    def claim(self, unit: str, fingerprint: str) -> bool:
        """Creates the unit's claim; False when someone holds it."""
        path = self.path(unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        pid = os.getpid()
        claim = Claim(unit, self.worker, socket.gethostname(), pid, process_start(pid), time.time(), fingerprint)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(claim), handle)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def read(self, unit: str) -> Claim | None:
        """The unit's claim (None when unclaimed); an unreadable one (a crash before its write) with no worker."""
        path = self.path(unit)
        try:
            beat = path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return Claim(unit, "", "", 0, None, 0.0, "", beat=beat)
        try:
            return Claim(**{k: raw[k] for k in Claim.__dataclass_fields__ if k in raw and k != "beat"}, beat=beat)
        except TypeError:  # not a claim of ours: judged by its mtime alone
            return Claim(unit, "", "", 0, None, 0.0, "", beat=beat)

    def stale(self, claim: Claim) -> bool:
        return time.time() - claim.beat > self.stale_s or (bool(claim.worker) and claim.process_gone())

    def take_over(self, unit: str, fingerprint: str) -> bool:
        """Claims a unit whose claim is stale. One taker per stale claim: the one that creates (O_EXCL) the token
        named after that claim, and finds the claim still there under it. Without the token, a worker that judged
        the old claim stale could rename away the fresh claim another taker had just made, and a third worker claim
        the unit in the gap: two workers would run it."""
        claim = self.read(unit)
        if claim is None:
            return self.claim(unit, fingerprint)
        if not self.stale(claim):
            return False
        token = self.path(unit).with_name(f"{self.path(unit).name}.takeover.{_instance(claim)}")
        try:
            os.close(os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            try:  # a taker that died holding it would block the unit for good: stale tokens are removed
                if time.time() - token.stat().st_mtime > self.stale_s:
                    token.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            return False
        try:
            current = self.read(unit)
            if current is None or _instance(current) != _instance(claim) or not self.stale(current):
                return False  # taken over (or beating again) since this worker looked
            return self._rename_and_claim(unit, fingerprint, claim)
        finally:
            token.unlink(missing_ok=True)

    def _rename_and_claim(self, unit: str, fingerprint: str, claim: Claim) -> bool:
        """Renames the stale claim away, checks it was still stale when renamed (a beat may have come in between:
        then it goes back), and creates this worker's own claim."""
        path = self.path(unit)
        aside = path.with_name(f"{path.name}.stale.{self.worker.replace(':', '_')}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False  # another worker took it over first
        if time.time() - aside.stat().st_mtime <= self.stale_s and not claim.process_gone():
            try:  # beaten between our look and the rename: its owner is alive; give it back (link: fails, as
                os.link(aside, path)  # O_EXCL does, when a claim is there again)
            except FileExistsError:
                pass  # another worker has claimed it meanwhile: that claim stands, this worker takes nothing
            finally:
                aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return self.claim(unit, fingerprint)

    def holds(self, unit: str) -> bool:
        claim = self.read(unit)
        return claim is not None and claim.worker == self.worker

    def beat(self, unit: str) -> bool:
        """Touches this worker's claim; False when it is no longer this worker's."""
        if not self.holds(unit):
            return False
        try:
            os.utime(self.path(unit))
        except FileNotFoundError:
            return False
        return True

    def release(self, unit: str) -> None:
        if self.holds(unit):
            self.path(unit).unlink(missing_ok=True)

    def claims(self) -> list[Claim]:
        """Every claim in the folder (status, the progress' running count)."""
        if not self.root.is_dir():
            return []
        return [claim for path in sorted(self.root.rglob("*.json"))
                if (claim := self.read(str(path.relative_to(self.root).with_suffix("")))) is not None]

    # --- failures ---------------------------------------------------------------------------------------------------

    def failure_path(self, unit: str) -> Path:
        return self.failed_root / f"{unit}.json"

    def fail(self, unit: str, fingerprint: str, error: str) -> None:
        path = self.failure_path(unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"unit": unit, "fingerprint": fingerprint, "error": error,
                                       "worker": self.worker, "when": time.time()}, indent=2))
        self.release(unit)

    def failure(self, unit: str) -> dict | None:
        try:
            return json.loads(self.failure_path(unit).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def clear_failure(self, unit: str) -> None:
        self.failure_path(unit).unlink(missing_ok=True)

    def failures(self) -> list[dict]:
        if not self.failed_root.is_dir():
            return []
        found = [self.failure(str(p.relative_to(self.failed_root).with_suffix(""))) for p in
                 sorted(self.failed_root.rglob("*.json"))]
        return [f for f in found if f is not None]


class Heartbeat:
    """Beats a unit's claim from a thread while the unit runs; `lost` is set when the claim stopped being ours."""

    def __init__(self, store: ClaimStore, unit: str):
        self.store, self.unit = store, unit
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="claim-heartbeat")

    def _run(self) -> None:
        while not self._stop.wait(self.store.beat_s):
            if not self.store.beat(self.unit):
                self.lost.set()
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
