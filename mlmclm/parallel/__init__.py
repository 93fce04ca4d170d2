"""Parallel runtime: the only package that touches process groups, devices and torch.cuda."""
from mlmclm.parallel.runtime import (
    ParallelConfig,
    ParallelLayout,
    current_device,
    destroy_parallel,
    init_parallel,
    layout,
    to_device,
)

__all__ = [
    "ParallelConfig",
    "ParallelLayout",
    "current_device",
    "destroy_parallel",
    "init_parallel",
    "layout",
    "to_device",
]
