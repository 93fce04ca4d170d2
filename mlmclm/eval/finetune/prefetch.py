"""The coming optimizer steps' micro-batches, collated on the host by a thread ahead of the device.

Tokenizing (retrieval tokenizes in its collate) and padding take host time between a step's kernels; done in line
they leave the GPU waiting on every micro-batch. A daemon thread runs `make_step` for the next `depth` steps
while the device computes this one, and pins the tensors for a GPU; the loop takes them in order. `make_step`
is a pure function of the step's rows, so the thread changes no number (the rows' order is decided before).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mlmclm.eval.finetune.device import pinned

DEPTH = 2  # steps collated ahead: one in use, one ready; more only holds more host memory


class StepPrefetch:
    """Iterates `make_step(i)` for i in range(steps), produced by a thread up to `depth` steps ahead. `close()`
    (also on leaving a `with`) stops the thread early: a run that ends before its budget leaves none behind."""

    def __init__(self, make_step: Callable[[int], Any], steps: int, pin: bool = False, depth: int = DEPTH):
        self._make, self._steps, self._pin = make_step, steps, pin
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, daemon=True, name="finetune-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for step in range(self._steps):
                value = self._make(step)
                if not self._put(("ok", pinned(value) if self._pin else value)):
                    return
        except BaseException as err:  # raised again in the loop's thread, with its traceback
            self._put(("error", err))

    def __iter__(self) -> Iterator:
        for _ in range(self._steps):
            kind, value = self._queue.get()
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> StepPrefetch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
