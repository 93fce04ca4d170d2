"""CPU-sized evaluation on the embedded smoke tasks, for `make demo` and offline checks."""
from __future__ import annotations

from pathlib import Path

from mlmclm.eval.checks.smoke_tasks import SmokeSizes, write_smoke_tasks
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.reports.summary import write_summary


# The smoke budget, measured on the demo's 4-layer, 128-wide exports (README, the demo): 30 steps at 1e-3 left
# token classification at F1 0 for every model; 100 steps of 16 at 3e-3 (AdamW 0.9/0.95, wd 0.1, 10 % warmup)
# learns the name tasks. A tiny model wants a larger LR than the paper grid's 1e-5..5e-4.
SMOKE_LEARNING_RATES = (3e-3,)
SMOKE_MAX_STEPS = 100
SMOKE_BATCH_SIZE = 16


def run_smoke_evaluation(model_dirs: dict[str, Path], output_dir: Path,
                         lrs: tuple[float, ...] = SMOKE_LEARNING_RATES, seeds: tuple[int, ...] = (0,),
                         max_steps: int = SMOKE_MAX_STEPS, max_epochs: int | None = None,
                         batch_size: int = SMOKE_BATCH_SIZE, sizes: SmokeSizes = SmokeSizes(), progress: bool = True,
                         tasks: tuple[str, ...] | None = None) -> Path:
    """Fine-tune every model on the smoke tasks (all four, or those named in `tasks`; LR grid x seeds), write run
    JSONs under `output_dir/runs`, and return the path of `output_dir/summary.md`. Re-running skips finished runs."""
    if not model_dirs:
        raise ValueError("run_smoke_evaluation: no model directories given")
    output_dir = Path(output_dir)
    specs = write_smoke_tasks(output_dir / "smoke_tasks", sizes=sizes)
    if tasks is not None:
        unknown = set(tasks) - {s.name for s in specs}
        if unknown:
            raise ValueError(f"unknown smoke tasks {sorted(unknown)}; known: {[s.name for s in specs]}")
        specs = [s for s in specs if s.name in tasks]
    protocol = ProtocolConfig(learning_rates=tuple(lrs), seeds=tuple(seeds), max_steps=max_steps,
                              max_epochs=max_epochs, batch_size=batch_size)
    records = run_grid({label: Path(d) for label, d in model_dirs.items()}, specs, output_dir, protocol,
                       progress=progress)
    return write_summary(records, output_dir)
