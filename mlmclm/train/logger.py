"""Per-step metrics: metrics.jsonl, TensorBoard event files (rank 0; tag names in mlmclm/tensorboard_tags.py) and a
compact console line every N steps."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import psutil

from mlmclm.tensorboard_tags import tensorboard_tag

log = logging.getLogger("mlmclm.train")


def memory_gb() -> float:
    """Peak accelerator memory when on GPU, else this process's resident memory."""
    from mlmclm.parallel.runtime import peak_gpu_memory_gb

    peak = peak_gpu_memory_gb()
    return peak if peak is not None else psutil.Process().memory_info().rss / 2**30


class MetricsLogger:
    def __init__(self, tensorboard_dir: Path | None, log_interval: int, enabled: bool, hparams: dict,
                 phase_names: list[str], metrics_file: Path | None = None, mfu: bool = True):
        self.enabled = enabled
        self.log_interval = log_interval
        self.writer = None
        # Every step's metrics as JSON lines (exact floats; appended across resumes) for scripts and tests.
        self.metrics_file = open(metrics_file, "a") if enabled and metrics_file is not None else None
        if enabled and tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(tensorboard_dir))
            self.writer.add_text("config", "```json\n" + json.dumps(hparams, indent=1) + "\n```", 0)
            self._layout(phase_names, mfu)
        self._last = time.perf_counter()

    def _layout(self, phase_names: list[str], mfu: bool) -> None:
        """Group the charts: one loss/accuracy chart across objectives, throughput, optimisation. No MFU chart where
        the device's peak is unknown (CPU): it would stay empty."""
        objectives = sorted(set(phase_names))

        def chart(*keys: str) -> list:
            return ["Multiline", [tensorboard_tag(k) for k in keys]]

        throughput = {"tokens/s": chart("perf/tokens_per_s"), "TFLOP/s per GPU": chart("perf/tflops_per_gpu")}
        if mfu:
            throughput["MFU"] = chart("perf/mfu")
        self.writer.add_custom_scalars({
            "objectives": {
                "loss": chart(*(f"train/{o}/loss" for o in objectives)),
                "accuracy": chart(*(f"train/{o}/accuracy" for o in objectives)),
            },
            "throughput": throughput,
            "validation": {  # held-out losses of both objectives, whatever the run trains
                "loss": chart("val/clm/loss", "val/mlm/loss"),
                "accuracy": chart("val/clm/accuracy", "val/mlm/accuracy"),
            },
            "optimisation": {"lr": chart("train/lr"), "grad norm": chart("train/grad_norm")},
        })

    def step(self, step: int, phase_name: str, phase_index: int, result, consumed_tokens: int, step_tokens: int,
             step_samples: int, flops_per_step: float, world_size: int, peak_tflops: float | None,
             extra: dict | None = None) -> dict:
        """One row per step; `extra` (the held-out losses and `perf/validation_s` on a validation step) joins it,
        and the validation's time is left out of the step's throughput."""
        extra = extra or {}
        now = time.perf_counter()
        elapsed, self._last = now - self._last - extra.get("perf/validation_s", 0.0), now
        tokens_per_s = step_tokens / elapsed
        tflops = flops_per_step / elapsed / world_size / 1e12
        metrics = {
            f"train/{phase_name}/loss": result.loss,
            f"train/{phase_name}/accuracy": result.accuracy,
            "train/lr": result.lr,
            "train/tokens": consumed_tokens,
            "train/phase": phase_index,
            "train/skipped": int(result.skipped),
            "perf/tokens_per_s": tokens_per_s,
            "perf/samples_per_s": step_samples / elapsed,
            "perf/tflops_per_gpu": tflops,
            "perf/memory_gb": memory_gb(),
        }
        if result.grad_norm is not None:
            metrics["train/grad_norm"] = result.grad_norm
        if peak_tflops:
            metrics["perf/mfu"] = tflops / peak_tflops
        metrics.update(extra)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(tensorboard_tag(key), value, step)
        if self.metrics_file is not None:
            self.metrics_file.write(json.dumps({"step": step, "phase": phase_name, **metrics}) + "\n")
            self.metrics_file.flush()
        if self.enabled and (step % self.log_interval == 0):
            log.info("step %d [%s] loss %.4f acc %.3f lr %.2e gnorm %s | %.0f tok/s %.2f TFLOP/s/GPU",
                     step, phase_name, result.loss, result.accuracy, result.lr,
                     "-" if result.grad_norm is None else f"{result.grad_norm:.3f}", tokens_per_s, tflops)
        return metrics

    def text(self, tag: str, message: str, step: int) -> None:
        if self.enabled:
            log.info(message)
            if self.writer is not None:
                self.writer.add_text(tag, message, step)

    def hparams(self, hparams: dict, metric_keys: list[str]) -> None:
        """The HParams tab: this run's settings beside the last values of its own curves (`metric_keys`, named as in
        metrics.jsonl).

        Written into the run itself, not as torch's `add_hparams` does (a second run named "hparams" holding one
        point per metric, whose single-point cards then opened TensorBoard's Time Series view)."""
        if self.writer is not None:
            from torch.utils.tensorboard.summary import hparams as hparams_summary

            for summary in hparams_summary(hparams, dict.fromkeys(map(tensorboard_tag, metric_keys), 0.0)):
                self.writer.file_writer.add_summary(summary)

    def close(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
