"""A local sweep's progress, one line per job: locally NeMo-Run runs the sweep's jobs (trainings, exports,
evaluations, the report) one after the other and prints nothing of them, so a chain of hours would be silent. Each
line says which job starts, how many have ended and how long the sweep has run; the last one how it ended.

Locally a job has ended when the next one is launched (recipes.sweep_eval.none_after_a_failure sees each launch in
order), so the lines come from those launches, not from polling."""
from __future__ import annotations

import time


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class ChainProgress:
    def __init__(self, names: list[str], console, clock=time.monotonic):
        self.names, self.console, self.clock = names, console, clock
        self.started_at = clock()
        self.current: tuple[str, float] | None = None  # the job running and when it started
        self.done = 0  # jobs that ran to their end
        self.skipped = 0

    def _say(self, text: str) -> None:
        print(f"sweep: {text}", file=self.console, flush=True)

    def _end_current(self, succeeded: bool | None) -> str:
        if self.current is None:
            return ""
        name, since = self.current
        self.done += 1
        self.current = None
        outcome = "failed" if succeeded is False else "ended"
        return f"{name} {outcome} after {_clock(self.clock() - since)}; "

    def launching(self, name: str, skipped: bool, previous_succeeded: bool | None = None) -> None:
        """Job `name` is about to start (the one before it has ended, `previous_succeeded` or not), or is skipped."""
        ended = self._end_current(previous_succeeded)
        index = self.names.index(name) + 1 if name in self.names else self.done + self.skipped + 1
        elapsed = _clock(self.clock() - self.started_at)
        if skipped:
            self.skipped += 1
            self._say(f"{ended}[{index}/{len(self.names)}] {name} skipped: a job before it did not succeed "
                      f"({elapsed} in all)")
            return
        self.current = (name, self.clock())
        self._say(f"{ended}[{index}/{len(self.names)}] {name} starting ({elapsed} in all)")

    def finished(self, last_succeeded: bool | None = None) -> None:
        ended = self._end_current(last_succeeded)
        skipped = f" ({self.skipped} skipped)" if self.skipped else ""
        self._say(f"{ended}{self.done} of {len(self.names)} jobs ran{skipped} in "
                  f"{_clock(self.clock() - self.started_at)}")
