"""`tools/evaluate.py status OUT`: where a grid stands, from the files alone — the plan, the records, the claims
and the failures — so it answers on any node while commands run on others: done, running (which unit, by which
worker, since when, its last beat), failed (why), left."""
from __future__ import annotations

import time
from pathlib import Path

from mlmclm.bounded_read import read_regular_json
from mlmclm.eval.finetune.protocol import RUNS_FOLDER, read_finished
from mlmclm.eval.grid.claims import ClaimStore
from mlmclm.eval.grid.run import PLAN_FILE


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else \
        f"{seconds / 3600:.1f} h"


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def grid_status(output_dir: Path, now: float | None = None) -> str:
    output_dir = Path(output_dir)
    plan_path = output_dir / PLAN_FILE
    if not plan_path.exists():
        raise FileNotFoundError(f"{output_dir}: no {PLAN_FILE} (no grid command has started there)")
    try:
        plan = read_regular_json(plan_path, what="grid plan")
        units = plan["units"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{plan_path}: not a grid plan ({err})") from None
    now = time.time() if now is None else now
    store = ClaimStore(output_dir, worker="status")
    done, running, failed, left = [], [], [], []
    for unit in units:
        records = [read_finished(output_dir / RUNS_FOLDER / f"{unit['model']}/{task}/lr{unit['learning_rate']:g}_"
                                 f"seed{unit['seed']}.json", unit["fingerprint"])
                   for task in [unit["task"], *unit.get("extra_tasks", [])]]
        if all(r is not None for r in records):
            done.append((unit, records[0]))
        elif (claim := store.read(unit["id"])) is not None:
            running.append((unit, claim))
        elif (failure := store.failure(unit["id"])) is not None and failure.get("fingerprint") == unit["fingerprint"]:
            failed.append((unit, failure))
        else:
            left.append(unit)
    lines = [f"{output_dir}: {len(units)} units (plan written {_when(plan.get('written', 0))}): {len(done)} done, "
             f"{len(running)} running, {len(failed)} failed, {len(left)} left"]
    if done:
        seconds = sum(record.seconds for _, record in done)
        lines.append(f"done: {len(done)} units, {seconds / 3600:.2f} device-hours by their records")
    if running:
        lines.append("running:")
        for unit, claim in running:
            beat = f"last beat {_ago(now - claim.beat)} ago" + (", stale: the next worker to look takes it over"
                                                                if store.stale(claim) else "")
            who = claim.worker or "(an unreadable claim)"
            since = f"since {_when(claim.since)} ({_ago(now - claim.since)})" if claim.since else ""
            lines.append(f"  {unit['id']}  by {who}  {since}  {beat}")
    if failed:
        lines.append("failed:")
        for unit, failure in failed:
            why = (failure.get("error") or "").strip().splitlines()[-1:] or ["(no error recorded)"]
            lines.append(f"  {unit['id']}  by {failure.get('worker', '?')} at {_when(failure.get('when', 0))}: "
                         f"{why[0]}")
    if left:
        lines.append(f"left: {len(left)} units, e.g. {', '.join(u['id'] for u in left[:3])}")
    return "\n".join(lines)

