"""Process groups and megatron parallel state: NCCL on GPU, gloo (with CPU emulation) otherwise."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mlmclm.parallel import cpu_emulation, rendezvous
from mlmclm.parallel.local_store import process_group_store
from mlmclm.parallel.ports import loopback_listener


# Refused rather than half-done: with CP > 1 megatron's attention expects each CP rank to hold its load-balanced
# slice of the sequence, and everything around the model would have to follow. None of it does here.
CONTEXT_PARALLEL_UNSUPPORTED = (
    "parallel.context_parallel={cp} is not supported: context parallelism is not implemented in mlmclm. Missing: "
    "(1) each CP rank gets the whole sequence and positions 0..S-1 instead of its load-balanced slice of tokens, "
    "labels, loss mask and positions (megatron's get_batch_on_this_cp_rank); (2) loss, token counts and accuracy "
    "are reduced over the data-parallel group only, not over data × context parallel; (3) pipeline-parallel "
    "buffers would be sized for sequence/CP while the ranks send whole sequences; (4) the CPU path (megatron's "
    "local attention) has no CP attention at all, only TE's does. Training would be silently wrong or hang. "
    "Use context_parallel=1 (tensor, pipeline and data parallelism cover the paper's sizes at sequence 1024-2048)."
)


@dataclass
class ParallelConfig:
    """How one model replica is split; data parallelism takes the remaining ranks."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    virtual_pipeline_parallel: int | None = None  # model chunks per pipeline rank (interleaved schedule)
    context_parallel: int = 1
    sequence_parallel: bool = False

    def __post_init__(self):
        for name in ("tensor_parallel", "pipeline_parallel", "context_parallel"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.virtual_pipeline_parallel is not None:
            if self.virtual_pipeline_parallel < 1:
                raise ValueError("parallel.virtual_pipeline_parallel must be >= 1 or None")
            if self.pipeline_parallel == 1 and self.virtual_pipeline_parallel > 1:
                raise ValueError("parallel.virtual_pipeline_parallel > 1 needs pipeline_parallel > 1")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError("parallel.sequence_parallel needs tensor_parallel > 1 (it splits TP activations)")
        if self.context_parallel > 1:
            raise ValueError(CONTEXT_PARALLEL_UNSUPPORTED.format(cp=self.context_parallel))

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def data_parallel_size(self, world_size: int) -> int:
        if world_size % self.model_parallel_size:
            raise ValueError(
                f"world size {world_size} is not divisible by TP×PP×CP = {self.tensor_parallel}×"
                f"{self.pipeline_parallel}×{self.context_parallel} = {self.model_parallel_size}"
            )
        return world_size // self.model_parallel_size


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    rank: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    cp_rank: int
    cp_size: int
    device: torch.device
    emulated_cuda: bool

    @property
    def is_logging_rank(self) -> bool:
        return self.rank == 0


_layout: ParallelLayout | None = None


def on_gpu() -> bool:
    return torch.cuda.is_available()


def gpu_name() -> str | None:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def gpu_capability() -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def peak_gpu_memory_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def cuda_rng_state() -> torch.Tensor | None:
    """The state of CUDA's default generator on this process's device; None without CUDA."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def set_cuda_rng_state(state: torch.Tensor) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state)


def current_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`, copied without a host wait when it goes from the host to a GPU (pinned, non-blocking)."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def seed_everything(seed: int) -> None:
    """Seed python, numpy, torch and megatron's model-parallel RNG tracker (call after init_parallel)."""
    from megatron.core import tensor_parallel

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def init_parallel(cfg: ParallelConfig, seed: int = 1234, timeout_minutes: int = 30) -> ParallelLayout:
    """Start torch.distributed (from torchrun's env, or a 1-process group) and megatron's parallel state."""
    global _layout
    from megatron.core import parallel_state

    emulated = cpu_emulation.install()
    backend = "gloo" if emulated else "nccl"
    if not dist.is_initialized():
        held_port = None  # a socket listening on the port chosen for this group, until its store serves on it
        if "RANK" not in os.environ:
            # A single process without torchrun: a 1-rank group on a free local port.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                held_port = loopback_listener()
                os.environ["MASTER_PORT"] = str(held_port.getsockname()[1])
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        if not emulated:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # a group started again in launch.spawn's processes: never the last one's port
        held_port = rendezvous.use_fresh_port() or held_port
        timeout = timedelta(minutes=timeout_minutes)
        store = process_group_store(timeout, held_port)   # a job on this host only: its store listens on 127.0.0.1
        if store is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, timeout=timeout, store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]))
    world = dist.get_world_size()
    cfg.data_parallel_size(world)  # validates divisibility with a clear message
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tensor_parallel,
        pipeline_model_parallel_size=cfg.pipeline_parallel,
        virtual_pipeline_model_parallel_size=cfg.virtual_pipeline_parallel,
        context_parallel_size=cfg.context_parallel,
        distributed_timeout_minutes=timeout_minutes,
    )
    seed_everything(seed)
    _layout = ParallelLayout(
        world_size=world,
        rank=dist.get_rank(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=cfg.tensor_parallel,
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        pp_size=cfg.pipeline_parallel,
        dp_rank=parallel_state.get_data_parallel_rank(),
        dp_size=parallel_state.get_data_parallel_world_size(),
        cp_rank=parallel_state.get_context_parallel_rank(),
        cp_size=cfg.context_parallel,
        device=current_device(),
        emulated_cuda=emulated,
    )
    return _layout


def layout() -> ParallelLayout:
    if _layout is None:
        raise RuntimeError("parallel runtime not initialised: call mlmclm.parallel.init_parallel first")
    return _layout


def destroy_parallel() -> None:
    global _layout
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    _layout = None


def gpu_count() -> int:
    """CUDA devices this process sees (0 without CUDA): the evaluation grid gives each worker one of them."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
