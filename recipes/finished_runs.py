"""Which tasks of a launch still have steps to train: a finished run (or segment) starts no process, once the checks a
resume makes accept this config (a changed setting is refused, never ignored)."""
from __future__ import annotations

from pathlib import Path

import nemo_run as run

from mlmclm.data.manifest import MANIFEST_NAME, Manifest
from recipes.base import validate
from recipes.data_check import is_local_path
from recipes.progress import finished_step


def unfinished(tasks: list[tuple[str, run.Partial]], console) -> list[tuple[str, run.Partial]]:
    """The tasks with steps left to train; each finished one is named on `console` (None: not named) — its
    processes never start, so a re-run of a finished run returns at once."""
    left = []
    for name, partial in tasks:
        cfg = partial.config
        step = finished_step(cfg.run_dir, cfg.total_steps, cfg.checkpoint.stop_at)
        if step is None:
            left.append((name, partial))
        else:
            check_finished_run_unchanged(partial)
            then = ("without checkpoint.stop_at (or with a later one) the same command continues"
                    if step < cfg.total_steps else "delete the directory to train again")
            what = "the segment (checkpoint.stop_at)" if step < cfg.total_steps else "the run"
            if console is not None:
                print(f"{cfg.run_dir}: {what} already finished at step {step}; nothing to train ({then})",
                      file=console, flush=True)
    return left


def check_finished_run_unchanged(partial: run.Partial, host_dir: Path | None = None) -> None:
    """A finished run counts as finished for this config only if a resume would accept it: the resume's own checks
    (mlmclm.train.resume_check), so a setting changed since (`seed=99`) is refused naming it, never ignored. The
    data identity is checked where the data is a local dataset (a remote run's may not be visible from here).
    `host_dir`: where this machine sees the run directory when that is not its configured path (a container's
    /checkpoints mount, recipes.sweep_plan.host_run_dir)."""
    from mlmclm.train import checkpoint_files as ckpt
    from mlmclm.train.resume_check import check_resume_from

    cfg = validate(partial)
    try:
        checkpoints = cfg.checkpoint_dir if host_dir is None else Path(host_dir) / "checkpoints"
        check_resume_from(cfg, ckpt.latest_checkpoint(checkpoints), _local_manifest(cfg))
    except ckpt.CheckpointError as err:  # an unreadable checkpoint: a refusal like any bad input
        raise ValueError(str(err)) from None


def _local_manifest(cfg):
    """The first phase's dataset manifest when it is a local dataset (a resume checks it), else None."""
    path = cfg.phase_data()[0].path
    if path is None or not is_local_path(str(path)):
        return None
    manifest = Path(path) if str(path).endswith(".json") else Path(path) / MANIFEST_NAME
    return Manifest.load(path) if manifest.is_file() else None
