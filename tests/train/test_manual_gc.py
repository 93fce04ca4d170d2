"""The manual GC schedule: automatic collection off while training, a collection every `interval` steps, and the
collector handed back as it was found."""
import gc

import pytest

from mlmclm.train.step import ManualGC


class _Cycle:
    def __init__(self):
        self.me = self


def test_collects_only_at_the_interval_and_restores_the_collector():
    assert gc.isenabled()
    control = ManualGC(3)
    control.start()
    try:
        assert not gc.isenabled()
        counts = []
        for iteration in range(1, 7):
            before = gc.get_stats()[2]["collections"]
            _Cycle()  # garbage only a cyclic collection frees
            control.step(iteration)
            counts.append(gc.get_stats()[2]["collections"] - before)
        assert counts == [0, 0, 1, 0, 0, 1]
    finally:
        control.stop()
    assert gc.isenabled()


def test_zero_keeps_automatic_collection_and_negative_is_refused():
    control = ManualGC(0)
    control.start()
    assert gc.isenabled()
    control.stop()
    assert gc.isenabled()
    with pytest.raises(ValueError, match="manual_gc_interval"):
        ManualGC(-1)
