"""What the throughput logs divide by: a step's model FLOPs and the device's peak (for MFU)."""
from __future__ import annotations

from mlmclm.train.config import TrainConfig


def flops_per_step(cfg: TrainConfig, seq_length: int, objective, lengths=None) -> float:
    """Model FLOPs of a step: fixed rows of `seq_length`, or random-length samples of `lengths`, each attending
    within itself (the real tokens and attention lengths, not micro_batch × seq_length)."""
    from mlmclm import flops

    kwargs = dict(causal=objective.kind == "clm", lm_head_fraction=flops.lm_head_fraction(objective))
    if lengths is not None:
        return flops.flops_for_lengths(cfg.model, lengths, **kwargs)
    return flops.flops_per_step(cfg.model, seq_length, cfg.global_batch_size, **kwargs)


def peak_tflops(cfg: TrainConfig) -> float | None:
    """Per-GPU peak for MFU: the configured number, else the device's from the table; None on CPU/unknown."""
    if cfg.logging.peak_tflops is not None:
        return cfg.logging.peak_tflops
    from mlmclm import flops

    try:
        return flops.peak_flops("fp8" if cfg.precision.fp8 else "bf16") / 1e12
    except ValueError:
        return None
