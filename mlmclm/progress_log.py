"""Progress over a list of long jobs (the evaluation's fine-tuning runs): a bar on a terminal, plain lines in a log.

A tqdm bar redraws one line with carriage returns, so in a log file it is either disabled (nothing for the 17 min of
the demo's smoke fine-tuning, the 36 min of `evaluate.py grid --smoke`) or one unreadable line. Where the stream is
not a terminal, a line is printed every `interval` seconds instead — the last run finished, how many are done and
left, and an ETA — whether or not a run finished meanwhile (one run may take minutes), then one at the end.
The interval comes from $MLMCLM_PROGRESS_SECONDS when set (tests use a fraction of a second), else 30 s: well inside
the minute a person watching a log waits before wondering whether it hangs.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Iterable, Iterator, TextIO

INTERVAL_ENV = "MLMCLM_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0
# Runs read back from an earlier invocation take milliseconds; counted in the mean, they would make the ETA of a
# resumed grid a fraction of the real one.
REAL_RUN_SECONDS = 1.0


_LINE_LOCK = threading.Lock()


def write_line(text: str, stream: TextIO | None = None) -> None:
    """`text` and its newline in one write, flushed, one thread at a time: `print` writes the text and the newline
    separately, so a progress line and a worker's notice printed from two threads could share a line."""
    stream = stream or sys.stderr
    with _LINE_LOCK:
        stream.write(text + "\n")
        stream.flush()


def seconds_from_env(env: str, default: float) -> float:
    """A duration from $`env` (seconds, > 0), else `default`; a bad value is a ValueError naming the variable."""
    raw = os.environ.get(env, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"${env}={raw!r}: expected seconds (a number > 0)") from None
    if not value > 0:
        raise ValueError(f"${env}={raw!r}: expected seconds (a number > 0)")
    return value


def interval_seconds() -> float:
    return seconds_from_env(INTERVAL_ENV, DEFAULT_INTERVAL)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class LogProgress:
    """Iterates `items` like a tqdm bar does (`set_postfix_str` names the item in progress, `write` prints a line
    between updates) and prints a status line every `interval` seconds from a background thread."""

    def __init__(self, items: Iterable, desc: str, stream: TextIO, interval: float):
        self.items, self.desc, self.stream, self.interval = list(items), desc, stream, interval
        self.done, self.durations = 0, []
        self.current, self.last = "", None  # last: (name, seconds) of the run finished last
        self._started = self._item_started = time.monotonic()
        self._lock, self._stop = threading.Lock(), threading.Event()

    def set_postfix_str(self, text: str) -> None:
        with self._lock:
            self.current = text

    def write(self, text: str, file: TextIO | None = None) -> None:
        write_line(text, file or self.stream)

    def status(self) -> str:
        with self._lock:
            left = len(self.items) - self.done
            slow = [d for d in self.durations if d >= REAL_RUN_SECONDS] or self.durations
            eta = f"ETA {_minutes(left * sum(slow) / len(slow))}" if slow else "ETA after the first run"
            last = f"; last finished: {self.last[0]} in {_minutes(self.last[1])}" if self.last else ""
            now = (f"; running: {self.current} for {_minutes(time.monotonic() - self._item_started)}"
                   if self.current and left else "")
            return f"{self.desc}: {self.done}/{len(self.items)} done, {left} left, {eta}{last}{now}"

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.write(self.status())

    def __iter__(self) -> Iterator:
        ticker = threading.Thread(target=self._tick, daemon=True, name="progress-log")
        ticker.start()
        try:
            for item in self.items:
                with self._lock:
                    self._item_started = time.monotonic()
                yield item
                with self._lock:  # the caller asked for the next item: this one is finished
                    seconds = time.monotonic() - self._item_started
                    self.done, self.last = self.done + 1, (self.current, seconds)
                    self.durations.append(seconds)
        finally:  # also when the loop is left early (an error, Ctrl-C): no line after the caller's own
            self._stop.set()
        self.write(f"{self.desc}: {self.done}/{len(self.items)} done in {_minutes(time.monotonic() - self._started)}")


class _Silent:
    """What a disabled bar is: the same calls, no output but `write`'s."""

    def __init__(self, items: Iterable):
        self.items = items

    def set_postfix_str(self, text: str) -> None:
        pass

    def write(self, text: str, file: TextIO | None = None) -> None:
        write_line(text, file or sys.stderr)

    def __iter__(self) -> Iterator:
        return iter(self.items)


def progress(items: Iterable, desc: str, unit: str = "run", enabled: bool = True, stream: TextIO | None = None):
    """A tqdm bar over `items` on a terminal, a `LogProgress` elsewhere, nothing when not `enabled`."""
    stream = stream or sys.stderr
    if not enabled:
        return _Silent(items)
    if stream.isatty():
        from tqdm.auto import tqdm

        # disable given: $TQDM_DISABLE (which the demo sets for the fine-tuning's step bars) does not hide this one
        return tqdm(items, desc=desc, unit=unit, file=stream, dynamic_ncols=True, disable=False)
    return LogProgress(items, desc, stream, interval_seconds())


class GridProgress:
    """Progress of a grid whose units finish in other threads, processes or nodes (`finished` is told each one):
    one line per finished unit with the ETA of the whole grid — on a terminal a bar instead — and, in a log, the
    status line every `interval` seconds meanwhile (a unit may take minutes).

    The ETA weighs what is left by each unit's estimated cost (`costs`): seconds per unit of cost, measured on the
    units finished since this command started (not those read back), times the cost left, over the workers running
    (`set_running`: every claim in the output folder, this node's and others')."""

    def __init__(self, costs: dict[str, float], done: set[str], desc: str, stream: TextIO | None = None,
                 interval: float | None = None, enabled: bool = True):
        self.costs, self.done, self.desc = dict(costs), set(done) & set(costs), desc
        self.stream = stream or sys.stderr
        self.interval = interval_seconds() if interval is None else interval
        self.enabled = enabled
        self.started = time.monotonic()
        self.spent_seconds = self.spent_cost = 0.0
        self.running: list[str] = []
        self.last: tuple[str, float] | None = None
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._bar = None
        if enabled and self.stream.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.costs), initial=len(self.done), desc=desc, unit="run", file=self.stream,
                             dynamic_ncols=True, disable=False)
        self._ticker = None
        if enabled and self._bar is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True, name="progress-log")
            self._ticker.start()

    def set_running(self, names: list[str]) -> None:
        with self._lock:
            self.running = list(names)

    def eta_seconds(self) -> float | None:
        with self._lock:
            left = sum(cost for unit, cost in self.costs.items() if unit not in self.done)
            if not self.spent_cost:
                return None
            return left * self.spent_seconds / self.spent_cost / max(1, len(self.running))

    def finished(self, unit: str, name: str, seconds: float) -> None:
        """`unit` (an id of `costs`) ended after `seconds` of work; `name` is how the line names it."""
        with self._lock:
            if unit in self.done:
                return
            self.done.add(unit)
            self.last = (name, seconds)
            if seconds >= REAL_RUN_SECONDS and self.costs.get(unit):
                self.spent_seconds += seconds
                self.spent_cost += self.costs[unit]
        if self._bar is not None:
            eta = self.eta_seconds()
            self._bar.set_postfix_str(f"ETA {_minutes(eta)}" if eta is not None else "")
            self._bar.update(1)
        elif self.enabled:
            self.write(self.status())

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            write_line(text, self.stream)

    def status(self) -> str:
        eta = self.eta_seconds()
        with self._lock:
            total, done = len(self.costs), len(self.done)
            eta_text = f"ETA {_minutes(eta)}" if eta is not None else "ETA after the first run"
            last = f"; last finished: {self.last[0]} in {_minutes(self.last[1])}" if self.last else ""
            now = f"; running: {', '.join(self.running[:4])}{' …' * (len(self.running) > 4)}" if self.running else ""
            return f"{self.desc}: {done}/{total} done, {total - done} left, {eta_text}{last}{now}"

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.write(self.status())

    def close(self) -> None:
        """Stops the lines; the last one says how many are done and the wall time."""
        self._stop.set()
        if self._bar is not None:
            self._bar.close()
        if self.enabled:
            with self._lock:
                total, done = len(self.costs), len(self.done)
            self.write(f"{self.desc}: {done}/{total} done in {_minutes(time.monotonic() - self.started)}")
