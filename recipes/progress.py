"""What a local launch shows while NeMo-Run runs the task: the run's progress, read from its `metrics.jsonl`.

NeMo-Run's local executor prints its own panel and a final status; the losses stay in a log several folders down.
This reporter prints where the run starts (fresh, resumed at step N, already finished), then every `interval` seconds
the last step's objective, loss, held-out losses when measured, tokens/s and an ETA — and, as they happen, each phase
switch, held-out evaluation and saved checkpoint — and at the end where the metrics, TensorBoard files and
checkpoints are.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path


def checkpointed_step(run_dir: Path) -> int | None:
    pointer = Path(run_dir) / "checkpoints" / "latest_checkpointed_iteration.txt"
    text = pointer.read_text().strip() if pointer.exists() else ""
    return int(text) if text.isdigit() else None


def finished_step(run_dir: str | Path, total_steps: int, stop_at: int | None) -> int | None:
    """The checkpointed step when the run (or its segment, `checkpoint.stop_at`) has nothing left to train, else
    None: the end `pretrain` would train to, min(total_steps, stop_at), is already saved."""
    step = checkpointed_step(Path(run_dir))
    return step if step is not None and step >= min(total_steps, stop_at or total_steps) else None


def stopped_as_asked(run_dir: str | Path, total_steps: int, stop_at: int | None) -> str | None:
    """The last line of a launch that ended its segment (`checkpoint.stop_at`) rather than the run; else None."""
    step = checkpointed_step(Path(run_dir))
    if stop_at is None or step is None or not stop_at <= step < total_steps:
        return None
    return (f"stopped at step {step} as asked (checkpoint.stop_at); the same command continues, without "
            f"checkpoint.stop_at or with a later one")


def step_line(row: dict, total: int, seconds_per_step: float | None) -> str:
    phase = row["phase"]
    held_out = (f", held-out CLM {row['val/clm/loss']:.3f} / MLM {row['val/mlm/loss']:.3f}"
                if "val/clm/loss" in row and "val/mlm/loss" in row else "")
    eta = "" if seconds_per_step is None else f", ETA {seconds_per_step * (total - row['step']) / 60:.1f} min"
    return (f"step {row['step']:>5}/{total} [{phase}] loss {row[f'train/{phase}/loss']:.3f}{held_out} "
            f"({row['perf/tokens_per_s']:.0f} tok/s{eta})")


class RunProgress(threading.Thread):
    """Prints a run's progress while it trains in other processes; `stop()` prints where its outputs are."""

    def __init__(self, run_dir: str | Path, total_steps: int, console, interval: float = 10.0,
                 prefix: str = "", summary: bool = True):
        super().__init__(daemon=True)
        self.run_dir, self.total, self.console = Path(run_dir), total_steps, console
        self.interval, self.prefix, self.summary = interval, prefix, summary
        self.done = threading.Event()
        self.shown_step = None
        self._offset, self._phase, self._first = 0, None, None  # _first: (time, step) of the first row seen
        self._saved = self._resumed_at = checkpointed_step(self.run_dir)  # news: only what comes after

    def _say(self, text: str) -> None:
        print(self.prefix + text, file=self.console, flush=True)

    def start(self) -> None:
        step = checkpointed_step(self.run_dir)
        if step is None:
            self._say(f"{self.run_dir}: new run of {self.total} steps")
        elif step >= self.total:
            self._say(f"{self.run_dir}: already finished at step {step}; nothing to train (delete it to train again)")
        else:
            self._say(f"{self.run_dir}: resuming at step {step} of {self.total}")
        super().start()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self._poll()

    def _new_rows(self) -> list[dict]:
        """The complete rows appended to metrics.jsonl since the last poll (the trainer may be writing the next)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        with open(path, "rb") as f:
            if f.seek(0, 2) < self._offset:  # rewound by a resume: read it again from the start
                self._offset = 0
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def _poll(self, final: bool = False) -> None:
        """Besides the last step: each phase switch, each validation and each checkpoint since the last poll.
        `final`: the run is over, so its last step line has no ETA."""
        rows = self._new_rows()
        for row in rows:
            if self._resumed_at is not None and row["step"] <= self._resumed_at:  # trained before this launch
                self._phase = row["phase"]
                continue
            if self._phase is not None and row["phase"] != self._phase:
                self._say(f"phase switch at step {row['step']}: {self._phase} → {row['phase']}")
            self._phase = row["phase"]
            if "val/clm/loss" in row and "val/mlm/loss" in row and row is not rows[-1]:
                self._say(f"held-out at step {row['step']}: CLM {row['val/clm/loss']:.3f} / MLM "
                          f"{row['val/mlm/loss']:.3f}")
        saved = checkpointed_step(self.run_dir)
        if saved is not None and saved != self._saved:
            self._say(f"checkpoint saved: step {saved} ({self.run_dir / 'checkpoints' / f'iter_{saved:07d}'})")
            self._saved = saved
        if not rows or rows[-1]["step"] == self.shown_step:
            return
        row = rows[-1]
        if self._first is None:
            self._first = (time.monotonic(), row["step"])
        rate = ((time.monotonic() - self._first[0]) / (row["step"] - self._first[1])
                if row["step"] > self._first[1] and not final else None)
        self.shown_step = row["step"]
        self._say(step_line(row, self.total, rate))

    def stop(self) -> None:
        self.done.set()
        self.join()
        if not self.summary:
            return
        self._poll(final=True)  # what the last interval did not show yet
        self._say(f"metrics: {self.run_dir / 'metrics.jsonl'}; TensorBoard: tensorboard --logdir "
                  f"{self.run_dir / 'tensorboard'}; checkpoints: {self.run_dir / 'checkpoints'}")
