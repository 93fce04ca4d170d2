"""The CPU emulation of CUDA calls: each piece behaves as megatron expects, and only when CUDA is absent."""
import pytest
import torch

from mlmclm.parallel.launch import spawn

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the emulation is off where CUDA exists")


def _check_emulation(out_path):
    from megatron.core import tensor_parallel

    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.parallel import cpu_emulation

    assert not cpu_emulation.is_active()
    init_parallel(ParallelConfig(), seed=5)
    results = {"active": cpu_emulation.is_active()}
    results["current_device"] = str(torch.cuda.current_device())
    results["empty_device"] = str(torch.empty(2, device="cuda").device)
    results["to_device"] = str(torch.ones(2).to("cuda:0").device)
    x = torch.ones(3)
    results["cuda_noop"] = x.cuda() is x
    results["type_name"] = torch.ones(2).type()
    results["type_cast"] = torch.ones(2).type("torch.cuda.DoubleTensor").dtype == torch.float64
    torch.cuda.synchronize()
    torch.cuda.current_stream().wait_event(None)

    tracker = tensor_parallel.get_cuda_rng_tracker()
    torch.manual_seed(0)
    outside_before = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    results["outer_state_restored"] = torch.equal(outside_before, torch.get_rng_state())
    with tracker.fork():
        second = torch.rand(4)
    results["tracker_advances"] = not torch.equal(first, second)
    results["tracker_differs_from_default"] = not torch.equal(first, torch.rand(4))
    destroy_parallel()
    torch.save(results, out_path)


def test_emulation_pieces(tmp_path):
    out = tmp_path / "emulation.pt"
    spawn(_check_emulation, 1, out)
    r = torch.load(out)
    assert r["active"]
    assert r["current_device"] == "cpu"
    assert r["empty_device"] == "cpu" and r["to_device"] == "cpu"
    assert r["cuda_noop"]
    assert r["type_name"] == "torch.cuda.FloatTensor"
    assert r["type_cast"]
    assert r["outer_state_restored"] and r["tracker_advances"] and r["tracker_differs_from_default"]
