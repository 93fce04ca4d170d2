"""`tools/evaluate.py grid --suite paper --list`: what the suite will read and spend, before anything is downloaded
or trained — per task its source (repository@revision, "unpinned" where no commit is known), which split trains,
validates and tests, its budget, and the total of fine-tuning runs and steps per model (a paper QA run fine-tunes
two models: its steps count twice)."""
from __future__ import annotations

import math
from pathlib import Path

from mlmclm.eval.data.fetch import suite_repos
from mlmclm.eval.data.sources import PARQUET_EXPORT, REPOS, TASK_SOURCES
from mlmclm.eval.finetune.presets import PAPER_TASKS, PAPER_TEST_ONLY, paper_task
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.task_spec import TaskSpec


def _where(task: str, split: str, manifest: dict | None) -> str:
    repo, pattern = TASK_SOURCES[task].splits[split]
    source = REPOS[repo]
    via = " (parquet export)" if source.ref == PARQUET_EXPORT else ""
    fetched = (manifest or {}).get("repos", {}).get(repo, {}).get("revision")
    got = f" (fetched {fetched})" if fetched and source.revision is None else ""
    return f"{source.pin_text}{got} {pattern}{via}"


def split_plan(spec: TaskSpec, manifest: dict | None = None) -> dict[str, str]:
    """Our split -> where its rows come from, in words."""
    task = spec.source

    def where(split: str) -> str:
        return _where(task, split, manifest)

    if spec.split_protocol == "paper":
        test = spec.split_names.get("test", "validation")
        return {"train": f"95 % of {where('train')}",
                "validation": "5 % of that train split (seed 42, datasets' train_test_split)",
                "test": where(test)}
    if spec.split_protocol == "seeded_halves":
        return {"validation": f"half the queries of {where('test')} (drawn per seed; not EncodEval's "
                              f"unseeded draw)", "test": "the other half"}
    return {split: where(split) for split in ("train", "validation", "test") if split in TASK_SOURCES[task].splits}


def _train_rows(task: str, manifest: dict | None) -> int | None:
    if manifest is None:
        return None
    repo, pattern = TASK_SOURCES[task].splits["train"]
    import fnmatch

    files = manifest["repos"].get(repo, {}).get("files", {})
    return sum(f["rows"] for name, f in files.items() if fnmatch.fnmatchcase(name, pattern)) or None


def task_budget(protocol: ProtocolConfig, name: str, manifest: dict | None = None) -> tuple[str, int | None, int]:
    """(the budget in words, optimizer steps per run or None when an epoch budget meets unknown rows, models
    fine-tuned per run) of one paper task."""
    spec = paper_task(name)
    config = protocol.finetune_config(protocol.learning_rates[0], 0, spec.family, name)
    if config.max_steps is not None and config.max_epochs is None:
        budget, steps = f"{config.max_steps} steps", config.max_steps
    else:
        rows = _train_rows(name, manifest)
        if rows is not None and spec.split_protocol == "paper":
            rows -= math.ceil(0.05 * rows)
        batches = None if rows is None else config.max_epochs * math.ceil(rows / config.batch_size)
        steps = batches if config.max_steps is None or batches is None else min(batches, config.max_steps)
        budget = f"{config.max_epochs} epoch(s)" + (f" = {steps} steps" if steps is not None else
                                                   " (steps known once fetched: --data-root)")
    models = 2 if spec.family == "qa" and spec.rules == "encodeval" else 1  # the tagger and the span model
    if models > 1:
        budget += f", x {models} models (EncodEval's tagger, and the span model of the standard score)"
    return budget, steps, models


def describe_suite(protocol: ProtocolConfig, tasks: list[str] | None = None, manifest: dict | None = None) -> str:
    names = tasks or list(PAPER_TASKS)
    lines, known_steps, unknown = [], 0, []
    for name in names:
        spec = paper_task(name)
        budget, steps, models = task_budget(protocol, name, manifest)
        if steps is None:
            unknown.append(name)
        else:
            known_steps += models * steps
        lines.append(f"{name} ({spec.family}): {budget}")
        for split, where in split_plan(spec, manifest).items():
            lines.append(f"  {split:<10} {where}")
        for extra, fields in spec.extra_tests.items():
            sub = TaskSpec(name=extra, family="retrieval", source=extra, split_protocol=fields["split_protocol"])
            lines.append(f"  scored with this model: {extra}")
            for split, where in split_plan(sub, manifest).items():
                lines.append(f"    {split:<10} {where}")
    grid = len(protocol.learning_rates) * len(protocol.seeds)
    runs = len(names) * grid
    total = f"{known_steps * grid:,}" + (f" + the epochs of {', '.join(unknown)}" if unknown else "")
    unpinned = [repo for repo in suite_repos(names) if REPOS[repo].revision is None]
    lines += ["", f"per model: {len(names)} fine-tuned tasks x {len(protocol.learning_rates)} LRs x "
                  f"{len(protocol.seeds)} seeds = {runs} runs, {total} optimizer steps (batch {protocol.batch_size}); "
                  f"{', '.join(t for t in PAPER_TEST_ONLY if 'msmarco' in names)} scored with the msmarco runs",
              "no source is read through a dataset script (script-based repositories: their parquet export)"]
    if unpinned:
        lines.append(f"unpinned (no commit known; fetch records the one it downloads): {', '.join(unpinned)}")
    return "\n".join(lines)
