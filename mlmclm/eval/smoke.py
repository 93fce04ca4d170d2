"""CPU-sized evaluation on the embedded smoke tasks, for `make demo` and offline checks."""
from __future__ import annotations

from pathlib import Path

from mlmclm.eval.protocol import ProtocolConfig, run_grid
from mlmclm.eval.smoke_tasks import SmokeSizes, write_smoke_tasks
from mlmclm.eval.summary import write_summary


def run_smoke_evaluation(model_dirs: dict[str, Path], output_dir: Path, lrs: tuple[float, ...] = (1e-4, 5e-4),
                         seeds: tuple[int, ...] = (0,), max_steps: int = 30, max_epochs: int = 3,
                         batch_size: int = 16,
                         sizes: SmokeSizes = SmokeSizes(), progress: bool = True) -> Path:
    """Fine-tune every model on the four smoke tasks (LR grid x seeds), write run JSONs under
    `output_dir/runs`, and return the path of `output_dir/summary.md`. Re-running skips finished runs."""
    if not model_dirs:
        raise ValueError("run_smoke_evaluation: no model directories given")
    output_dir = Path(output_dir)
    specs = write_smoke_tasks(output_dir / "smoke_tasks", sizes=sizes)
    protocol = ProtocolConfig(learning_rates=tuple(lrs), seeds=tuple(seeds), max_steps=max_steps,
                              max_epochs=max_epochs, batch_size=batch_size)
    records = run_grid({label: Path(d) for label, d in model_dirs.items()}, specs, output_dir, protocol,
                       progress=progress)
    return write_summary(records, output_dir)
