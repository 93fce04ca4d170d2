"""The agreed stop flag makes no new device tensor per step (issue 23).

On a GPU, `torch.tensor([...], device=cuda)` each step was a copy from pageable host memory, which waits for the
whole backward queued before it: a second host synchronisation per step that the one-read step (train_step) had
removed everywhere else. No CUDA here, so the test counts what would be that copy: every tensor a torch call
creates (a result that shares storage with none of its tensor arguments), on whatever device the flag lives.
"""
import pytest
import torch
import torch.distributed as dist

from mlmclm.train.signals import StopRequest


class NewTensors(torch.overrides.TorchFunctionMode):
    """Counts the torch calls that return a freshly made tensor (factories, copies), by name."""

    def __init__(self):
        super().__init__()
        self.made: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in inputs:
            self.made.append(getattr(func, "__name__", str(func)))
        return out


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_counter_sees_a_tensor_made_from_host_values():
    with NewTensors() as counter:
        torch.tensor([1], dtype=torch.int32)
    assert counter.made == ["tensor"]


def test_agreed_flag_makes_its_tensor_once_and_refills_it(one_rank_group):
    stop = StopRequest(signals=())  # no handler installed in the test process
    first = stop.agreed_flag()  # the run's one allocation
    per_step = []
    for requested in (False, True, False):
        stop.requested = requested
        with NewTensors() as counter:
            flag = stop.agreed_flag()
        per_step.append(counter.made)
        assert flag is first and flag.tolist() == [int(requested)]
    assert per_step == [[], [], []]  # old code: [['tensor'], ['tensor'], ['tensor']]
