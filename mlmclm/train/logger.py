"""Per-step metrics: metrics.jsonl, TensorBoard event files (rank 0; layout and tag names in
mlmclm/tensorboard_tags.py) and a compact console line every N steps."""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import psutil

from mlmclm.atomic_write import write_atomic
from mlmclm.tensorboard_tags import phase_location, phase_tag, tensorboard_tag

log = logging.getLogger("mlmclm.train")


def memory_gb() -> float:
    """Peak accelerator memory when on GPU, else this process's resident memory."""
    from mlmclm.parallel.runtime import peak_gpu_memory_gb

    peak = peak_gpu_memory_gb()
    return peak if peak is not None else psutil.Process().memory_info().rss / 2**30


class MetricsLogger:
    def __init__(self, tensorboard_dir: Path | None, log_interval: int, enabled: bool, hparams: dict,
                 phase_names: list[str], metrics_file: Path | None = None, mfu: bool = True,
                 run_name: str = "run"):
        self.enabled = enabled
        self.log_interval = log_interval
        self.writer = None
        self.run_dir: Path | None = None
        self._phase_writers: dict = {}
        # Every step's metrics as JSON lines (exact floats; appended across resumes) for scripts and tests.
        self.metrics_file = open(metrics_file, "a") if enabled and metrics_file is not None else None
        if enabled and tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.run_dir = Path(tensorboard_dir) / run_name
            self.writer = SummaryWriter(log_dir=str(self.run_dir))
            self.writer.add_text("config", "```json\n" + json.dumps(hparams, indent=1) + "\n```", 0)
            self._layout(mfu)
        self._last = time.perf_counter()

    def _phase_writer(self, folder: str):
        """The writer of one phase's run folder (below the run's own), opened when its first value comes."""
        if folder not in self._phase_writers:
            from torch.utils.tensorboard import SummaryWriter

            self._phase_writers[folder] = SummaryWriter(log_dir=str(self.run_dir / folder))
        return self._phase_writers[folder]

    def _layout(self, mfu: bool) -> None:
        """Group the charts: training and held-out loss and accuracy, each chart holding every phase's run folder
        (one colour per phase), then throughput and optimisation. No MFU chart where the device's peak is unknown
        (CPU): it would stay empty. Chart entries are regular expressions over tags, anchored so that `loss` does
        not also draw `loss_held_out`."""
        def chart(*keys: str) -> list:
            return ["Multiline", [f"^{re.escape(tensorboard_tag(k))}$" for k in keys]]

        def phase_chart(split: str, metric: str) -> list:
            return ["Multiline", [f"^{phase_tag(split, metric)}$"]]

        throughput = {"tokens/s": chart("perf/tokens_per_s"), "TFLOP/s per GPU": chart("perf/tflops_per_gpu")}
        if mfu:
            throughput["MFU"] = chart("perf/mfu")
        self.writer.add_custom_scalars({
            "objectives": {"loss": phase_chart("train", "loss"), "accuracy": phase_chart("train", "accuracy")},
            "validation": {  # held-out losses of both objectives, whatever the run trains
                "loss": phase_chart("val", "loss"), "accuracy": phase_chart("val", "accuracy")},
            "throughput": throughput,
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
                located = phase_location(key)
                if located is None:
                    self.writer.add_scalar(tensorboard_tag(key), value, step)
                else:
                    self._phase_writer(located[0]).add_scalar(located[1], value, step)
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

        Written into the run's own folder (the HParams "session"), each metric named by its phase folder below it
        (the metric's "group") and its tag there; not as torch's `add_hparams` does (a second run named "hparams"
        holding one point per metric, whose single-point cards then opened TensorBoard's Time Series view)."""
        if self.writer is None:
            return
        from tensorboard.plugins.hparams import plugin_data_pb2
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        names = {}
        for key in metric_keys:
            located = phase_location(key)
            names[tensorboard_tag(key)] = located if located is not None else ("", tensorboard_tag(key))
        experiment, start, end = hparams_summary(hparams, dict.fromkeys(names, 0.0))
        # torch names a metric by its tag alone, which the HParams plugin looks up in the session's own folder.
        plugin = experiment.value[0].metadata.plugin_data
        data = plugin_data_pb2.HParamsPluginData.FromString(plugin.content)
        for info in data.experiment.metric_infos:
            info.name.group, info.name.tag = names[info.name.tag]
        plugin.content = data.SerializeToString()
        for summary in (experiment, start, end):
            self.writer.file_writer.add_summary(summary)

    def close(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
        for writer in [self.writer, *self._phase_writers.values()]:
            if writer is not None:
                writer.flush()
                writer.close()


def rewind_metrics(path: Path, step: int) -> None:
    """Drop the rows after `step` (the resumed checkpoint) that a crashed attempt logged: one row per step."""
    if not path.exists():
        return
    rows = path.read_text().splitlines(keepends=True)
    kept = [row for row in rows if _row_step(row) is not None and _row_step(row) <= step]
    if len(kept) != len(rows):
        write_atomic(path, "".join(kept))


def _row_step(row: str) -> int | None:
    try:
        return int(json.loads(row)["step"])
    except (ValueError, KeyError, TypeError):  # a line torn by the crash, or not ours
        return None
