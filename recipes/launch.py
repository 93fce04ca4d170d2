"""From a recipe name plus `key=value` overrides to a launched (or dry-run) NeMo-Run experiment.

Overrides are of three kinds, told apart by their key:
  * a recipe parameter (`nodes=4`, `mask_ratio=0.3`, `total_steps=12000`, ...): passed to the builder, so derived
    values (micro batch, phase lengths, run dir) follow;
  * `executor.KEY=VALUE`: an argument of the executor factory (`cluster.executors`);
  * any other dotted path into the TrainConfig (`optimizer.lr=3e-4`, `phases.1.objective.mask_ratio=0.3`,
    optionally prefixed `config.`): set on the built `run.Config` tree.
The result is validated again after the overrides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import fiddle as fdl
import nemo_run as run

from mlmclm.config_io import parse_value
from recipes import registry
from recipes.base import validate

EXECUTORS = ("local", "slurm")


@dataclass
class Overrides:
    recipe: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    config: list[tuple[list[str], object]] = field(default_factory=list)


def split_overrides(recipe: registry.Recipe, items: list[str]) -> Overrides:
    out = Overrides()
    params = recipe.parameters()
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value")
        value = parse_value(raw)
        if key.startswith("executor."):
            out.executor[key.removeprefix("executor.")] = value
        elif key in params:
            out.recipe[key] = value
        else:
            out.config.append((key.removeprefix("config.").split("."), value))
    return out


def set_config_path(config: run.Config, path: list[str], value) -> None:
    """Set `value` at a dotted path of a `run.Config` tree (list items by index)."""
    node = config
    where = []
    for part in path[:-1]:
        where.append(part)
        node = _child(node, part, ".".join(where))
    last = path[-1]
    if isinstance(node, list):
        node[_index(node, last, ".".join(path))] = value
        return
    if not isinstance(node, fdl.Buildable):
        raise ValueError(f"config override {'.'.join(path)!r}: {'.'.join(where)!r} is not a config section")
    if last not in fdl.ordered_arguments(node, include_defaults=True):
        known = sorted(fdl.ordered_arguments(node, include_defaults=True))
        raise ValueError(f"config override {'.'.join(path)!r}: {fdl.get_callable(node).__name__} has no field "
                         f"{last!r}; known: {known}")
    setattr(node, last, value)


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"config override {key!r}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


def _child(node, part: str, key: str):
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if isinstance(node, fdl.Buildable) and part in fdl.ordered_arguments(node, include_defaults=True):
        child = getattr(node, part)
        if isinstance(child, (fdl.Buildable, list)):
            return child
    raise ValueError(f"config override {key!r}: no config section named {part!r}")


def build(name: str, items: list[str] = (), extra_params: dict | None = None) -> tuple[run.Partial, Overrides]:
    """The recipe `name` with overrides applied and validated; also returns the executor overrides."""
    recipe = registry.get(name)
    overrides = split_overrides(recipe, list(items))
    partial = recipe.build(**{**overrides.recipe, **(extra_params or {})})
    for path, value in overrides.config:
        set_config_path(partial.config, path, value)
    validate(partial)
    return partial, overrides


def make_executor(kind: str, partial: run.Partial, options: dict | None = None):
    """An executor sized by the recipe itself (its nodes × gpus_per_node), so the two cannot disagree."""
    from cluster.executors import local_executor, slurm_executor

    options = dict(options or {})
    for sized in ("nodes", "gpus_per_node", "processes"):
        if sized in options:
            raise ValueError(f"executor.{sized} comes from the recipe: set `nodes=`/`gpus_per_node=` (or "
                             f"`processes=` for tiny recipes) on the recipe instead")
    if kind == "local":
        if partial.nodes != 1:
            raise ValueError(f"the local executor runs one node, but the recipe is sized for {partial.nodes} nodes "
                             f"(pass nodes=1)")
        if "gpus" not in options:
            import torch

            options["gpus"] = torch.cuda.is_available()
        return local_executor(processes=partial.gpus_per_node, **options)
    if kind == "slurm":
        return slurm_executor(nodes=partial.nodes, gpus_per_node=partial.gpus_per_node, **options)
    raise ValueError(f"unknown executor {kind!r}; choose one of {EXECUTORS}")


def run_dir_of(partial: run.Partial) -> str:
    return partial.config.run_dir


def chain(clm: run.Partial, then: run.Partial) -> run.Partial:
    """Make `then` start from `clm`'s final checkpoint (`checkpoint.init_from` = the CLM run dir)."""
    clm_cfg, then_cfg = validate(clm), validate(then)
    if clm_cfg.model.to_dict() != then_cfg.model.to_dict():
        raise ValueError(f"chain: the second task's model ({then_cfg.model.name}) differs from the first's "
                         f"({clm_cfg.model.name}); weights cannot be carried over")
    if Path(clm_cfg.run_dir).resolve() == Path(then_cfg.run_dir).resolve():
        raise ValueError("chain: both tasks use the same run_dir; the second would resume the first")
    then.config.checkpoint.init_from = clm_cfg.run_dir
    return then


def init_from_param(name: str, first: run.Partial) -> dict:
    """For a second recipe that takes `init_from` (cpt_*, tiny_mlm): the first run's directory."""
    return {"init_from": run_dir_of(first)} if "init_from" in registry.get(name).parameters() else {}


def launch(tasks: list[tuple[str, run.Partial]], executor_kind: str, executor_options: dict | None = None,
           title: str | None = None, dryrun: bool = False, detach: bool = False,
           base_dir: str | None = None) -> run.Experiment:
    """Run `tasks` as one `run.Experiment`, each task depending on the previous one (a chain when > 1).

    On Slurm the dependency is `afterok`: the next job starts only if the previous one finished (a preempted run
    exits non-zero and requeues itself first). Locally, tasks run one after the other.
    `dryrun` writes the scripts (sbatch for Slurm) under the experiment directory without submitting.
    """
    title = title or tasks[0][0]
    with run.Experiment(title, base_dir=base_dir, log_level="WARN") as exp:
        previous = None
        for name, partial in tasks:
            executor = make_executor(executor_kind, partial, executor_options)
            previous = exp.add(partial, executor=executor, name=name,
                               dependencies=[previous] if previous else None)
        if dryrun:
            exp.dryrun(log=True, delete_exp_dir=False)
        else:
            exp.run(detach=detach, tail_logs=False)
    if not dryrun and not detach:
        failed = {name: str(info["status"]) for name, info in exp.status(return_dict=True).items()
                  if str(info["status"]) != "SUCCEEDED"}
        if failed:
            raise TaskFailedError(f"experiment {exp._id}: task(s) did not succeed: {failed}; logs under "
                                  f"{exp._exp_dir}")
    return exp


class TaskFailedError(RuntimeError):
    pass


def prepare_local_data(names: list[str], partials: list[run.Partial]) -> None:
    """Tiny recipes read the embedded corpus: pack it once before launching (idempotent)."""
    for name, partial in zip(names, partials):
        recipe = registry.get(name)
        if recipe.prepare is not None:
            recipe.prepare(partial.config.data.path)
