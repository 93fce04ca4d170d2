"""`run_grid`: plan -> workers -> records. Every model and task is checked and loaded first (a refusal before any
unit runs), the plan written (OUT/plan.json: what `status` reads), how many units are finished and left said in
one line, the units run by this command's workers (pool.py) while a watcher turns the folder's new records — this
command's and other commands' — into progress lines, and the finished records returned in the grid's order."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.eval.finetune.protocol import (FEW_STEPS, ProtocolConfig, RunRecord, budget_text, check_models,
                                           write_json_atomic)
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.finetune.training import budget_steps
from mlmclm.eval.grid.claims import ClaimStore
from mlmclm.eval.grid.pool import PoolResult, run_pool
from mlmclm.eval.grid.units import Unit, finished_records, plan_units
from mlmclm.progress_log import GridProgress, write_line

PLAN_FILE = "plan.json"
WATCH_SECONDS = 0.5  # how often the watcher looks for new records


class GridStopped(Exception):
    """The grid was stopped by a signal (SIGTERM/SIGUSR1: a preemption); its claims are released."""


class GridFailed(Exception):
    """Some units failed (OUT/failed/ says why); every other unit finished."""


@dataclass
class GridOutcome:
    units: list[Unit]
    records: list[RunRecord]  # every finished unit's, in the grid's order
    failed: list[dict] = field(default_factory=list)  # failed/<unit>.json of the units left unfinished
    stopped: str | None = None
    ran_here: int = 0  # units this command's workers finished
    finished: int = 0  # units finished in all (here, earlier, elsewhere)
    wall_seconds: float = 0.0
    lost_workers: list[str] = field(default_factory=list)

    def spent(self, device: str) -> str:
        """What the grid cost, the line its command prints after the summary: the units finished (by any
        command), the device-hours their records took (a worker holds one device while its unit runs; an extra
        set's record repeats its unit's seconds and is not counted again), and the units this command ran per hour
        of its wall time (start-up, planning and idle workers included: what a user waits for)."""
        own = [r for r in self.records if "trained_on" not in r.extra]
        hours = sum(r.seconds for r in own) / 3600
        kind = "GPU" if device == "cuda" else "CPU-worker"
        rate = self.ran_here / (self.wall_seconds / 3600) if self.wall_seconds > 0 else 0.0
        # a real model's unit takes minutes to hours: below 10 units an hour the first decimal matters
        rate_text = f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"
        return (f"spent: {len(own)} of {len(self.units)} units finished, {hours:.3f} {kind}-hours by their records; "
                f"this command ran {self.ran_here} in {self.wall_seconds / 60:.1f} min of wall time ({rate_text} "
                f"units per hour)")


def _warn_few_steps(units: list[Unit], say) -> None:
    """Before any run: a task whose runs get fewer than FEW_STEPS optimizer steps says little about the model."""
    warned = set()
    for unit in units:
        train_rows = len(unit.data.splits.get("train", []))
        steps = budget_steps(max(1, train_rows), unit.config) if unit.data.spec.family != "retrieval" else None
        if steps is not None and steps < FEW_STEPS and (unit.model, unit.task) not in warned:
            warned.add((unit.model, unit.task))
            say(f"warning: {unit.model}/{unit.task}: {steps} optimizer steps per run (budget "
                f"{budget_text(unit.config)}): a score from so few updates says little about the model; give it "
                f"more with --max-epochs, --batch-size or --max-steps")


def write_plan(units: list[Unit], output_dir: Path, workers: int, device: str) -> None:
    write_json_atomic(Path(output_dir) / PLAN_FILE, {
        "written": time.time(), "workers": workers, "device": device,
        "units": [{"id": u.id, "model": u.model, "task": u.task, "learning_rate": u.learning_rate, "seed": u.seed,
                   "fingerprint": u.fingerprint, "flops": u.flops, "extra_tasks": list(u.data.extra_tests)}
                  for u in units]}, allow_nan=False)


class Watcher:
    """Looks at the output folder every WATCH_SECONDS and tells `progress` of each unit that finished there (by any
    worker of any command) and of the claims held (the workers running)."""

    def __init__(self, units: list[Unit], output_dir: Path, progress: GridProgress):
        self.units, self.output_dir, self.progress = units, Path(output_dir), progress
        self.store = ClaimStore(output_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="grid-watcher")

    def look(self) -> None:
        for unit in self.units:
            if unit.id in self.progress.done or not unit.record_paths(self.output_dir)[unit.task].exists():
                continue
            records = finished_records(unit, self.output_dir)
            if records is not None:
                self.progress.finished(unit.id, f"{unit.model}/{unit.task} lr={unit.learning_rate:g} "
                                                f"seed={unit.seed}", records[0].seconds)
        self.progress.set_running([claim.unit for claim in self.store.claims()])

    def _run(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            self.look()

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.look()
        self.progress.close()


def evaluate_grid(model_dirs: dict[str, Path], tasks: list[TaskSpec | TaskData], output_dir: Path,
                  protocol: ProtocolConfig, progress: bool = True, workers: int = 1, threads: int | None = None,
                  say=None) -> GridOutcome:
    """Every unit of the grid finished (here or by other commands on the same folder), or failed, or the command
    stopped by a signal (see docs/evaluation.md, "Many runs at once")."""
    say = say or write_line
    started = time.time()
    check_models(model_dirs)
    loaded = [t if isinstance(t, TaskData) else load_task(t) for t in tasks]
    units = plan_units(model_dirs, loaded, protocol)
    _warn_few_steps(units, say)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_plan(units, output_dir, workers, protocol.device)
    done = {u.id for u in units if finished_records(u, output_dir) is not None}
    store = ClaimStore(output_dir)
    held = {c.unit: c for c in store.claims()}
    gone = [unit for unit, claim in held.items() if unit not in done and store.stale(claim)]
    running = [unit for unit in held if unit not in done and unit not in gone]
    parts = [f"{len(done)} finished", f"{len(units) - len(done)} to run"]
    if running:
        parts.append(f"{len(running)} of them running elsewhere")
    if gone:
        parts.append(f"{len(gone)} of them claimed by a worker that is gone (taken over)")
    say(f"grid: {len(units)} units ({protocol.device}, {workers} worker{'s' * (workers != 1)} here): "
        + ", ".join(parts))
    costs = {u.id: u.flops for u in units}
    if len(done) == len(units):  # nothing to run: no worker to start
        result = PoolResult()
    else:
        with Watcher(units, output_dir, GridProgress(costs, done, "evaluation runs", enabled=progress)):
            result = run_pool(units, output_dir, started, workers, protocol.device, threads)
    finished = {u.id: rs for u in units if (rs := finished_records(u, output_dir)) is not None}
    by_grid_order = sorted(units, key=lambda u: u.index)
    records = [record for u in by_grid_order if u.id in finished for record in finished[u.id]]
    failed = [f for u in units if u.id not in finished and (f := store.failure(u.id)) is not None
              and f.get("fingerprint") == u.fingerprint]
    ours = {(_host(), str(pid)) for pid in result.pids}
    ran_here = sum(1 for unit, rs in finished.items() if unit not in done
                   and tuple(rs[0].extra.get("worker", "").split(":")[:2]) in ours)
    return GridOutcome(units, records, failed, result.stopped, ran_here, len(finished), time.time() - started,
                       result.lost)


def _host() -> str:
    return socket.gethostname()


def run_grid(model_dirs: dict[str, Path], tasks: list[TaskSpec | TaskData], output_dir: Path,
             protocol: ProtocolConfig, progress: bool = True, workers: int = 1) -> list[RunRecord]:
    """Every (model, task, lr, seed) run; finished runs (same fingerprint) are read back instead of re-run. Raises
    GridStopped on a preemption signal, GridFailed when a unit failed (after every other unit ended)."""
    outcome = evaluate_grid(model_dirs, tasks, output_dir, protocol, progress, workers)
    if outcome.stopped:
        raise GridStopped(f"stopped by {outcome.stopped}")
    if outcome.failed:
        raise GridFailed("; ".join(f"{f['unit']}: {f['error'].strip().splitlines()[-1]}" for f in outcome.failed))
    return outcome.records
