"""A grid's plan: every run built and validated, with its steps per phase, tokens, GPU-hours (`mlmclm.flops` at a
stated MFU), estimated peak memory per GPU and state (new, partial, finished); which runs to launch; the table."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import nemo_run as run

from mlmclm import flops
from mlmclm.model.memory import GIB, H100_80GB_BYTES, MemoryEstimate, RankLayout, estimate_peak_memory
from mlmclm.train.branch import check_branch_plan
from recipes import grid as grids
from recipes import registry
from recipes.base import PAPER_RUN_ROOT, tokens_per_sample, validate, world_size
from recipes.progress import checkpointed_step
from recipes.tiny import TINY_RUN_ROOT

DEFAULT_MFU = 0.40  # assumed model-FLOPs utilisation for the GPU-hours estimate (not measured)
DEFAULT_PEAK = "H100"  # dense bf16 peak of this GPU (mlmclm/flops.py)
RUN_ROOTS = {"paper": PAPER_RUN_ROOT, "tiny": f"{TINY_RUN_ROOT}/grid", "mini": "runs/mini/runs"}



@dataclass
class PlannedRun:
    entry: grids.GridRun
    partial: run.Partial
    phases: list[tuple[str, int]]  # (objective, steps)
    total_steps: int
    tokens: float
    gpu_hours: float  # the whole run's, as if trained from step 0
    own_gpu_hours: float  # the steps this run trains itself: after the branch step for a branch
    state: str  # "new", "partial N/M", "finished", "unknown" (run dir not visible from here)
    checkpointed: int | None = None  # its latest checkpoint's step, where visible
    host_dir: Path | None = None
    memory: "MemoryPlan | None" = None  # estimated peak GPU memory per rank (mean and worst micro-batch)

    @property
    def finished(self) -> bool:
        return self.state == "finished"


@dataclass(frozen=True)
class MemoryPlan:
    layout: str  # e.g. "tp1 pp1 dp192"
    mean: MemoryEstimate
    worst: MemoryEstimate


def memory_plan(cfg, world: int, seq_length: int, capacity: int = H100_80GB_BYTES) -> MemoryPlan:
    """The estimate (mlmclm.model.memory) at the mean and at the worst micro-batch of this run, for its most
    memory-hungry phase; refuses a layout whose worst case does not fit `capacity` (an 80 GB H100)."""
    par = cfg.parallel
    dp = par.data_parallel_size(world)
    layout = RankLayout(par.tensor_parallel, par.pipeline_parallel, par.sequence_parallel, dp,
                        cfg.optimizer.distributed_optimizer, cfg.num_microbatches(dp), bool(cfg.precision.fp8))
    mean_tokens = worst_tokens = 0
    for phase, data, model in zip(cfg.phases, cfg.phase_data(), cfg.phase_models()):
        # a phase's own prepared rows are at most its context long (checked when the run starts)
        rows = seq_length if phase.data is None else model.max_position_embeddings
        lengths = data.random_length
        if lengths is not None:  # one row of micro_batch samples; at worst every sample is max_length long
            mean, worst = round(cfg.micro_batch_size * lengths.mean), cfg.worst_row_tokens(rows, data)
        else:
            mean = worst = cfg.micro_batch_size * rows
        mean_tokens, worst_tokens = max(mean_tokens, mean), max(worst_tokens, worst)
    predicted = max(1.0 if p.objective.kind == "clm" or not cfg.sparse_mlm_head else p.objective.max_ratio
                    for p in cfg.phases)
    plan = MemoryPlan(f"tp{par.tensor_parallel} pp{par.pipeline_parallel} dp{dp}",
                      estimate_peak_memory(cfg.model, layout, mean_tokens, predicted, cfg.head_chunk_tokens),
                      estimate_peak_memory(cfg.model, layout, worst_tokens, predicted, cfg.head_chunk_tokens))
    if plan.worst.total > capacity:
        raise ValueError(f"{cfg.run_dir}: layout {plan.layout} does not fit an {capacity / GIB:.1f} GiB GPU at the "
                         f"worst-case micro-batch: {plan.worst.summary()} (mean case {plan.mean.total / GIB:.1f} "
                         f"GiB); use tensor/pipeline parallelism or fewer samples per forward")
    return plan


def host_run_dir(run_dir: str, checkpoint_dir: str | None) -> Path | None:
    """Where this machine sees a run directory: container paths under /checkpoints map to the executor's
    checkpoint_dir; None when it cannot be seen from here."""
    from cluster.executors import CHECKPOINT_MOUNT_TARGET

    if run_dir == CHECKPOINT_MOUNT_TARGET or run_dir.startswith(CHECKPOINT_MOUNT_TARGET + "/"):
        if not checkpoint_dir:
            return None
        return Path(checkpoint_dir) / run_dir.removeprefix(CHECKPOINT_MOUNT_TARGET).lstrip("/")
    return Path(run_dir)


def run_state(run_dir: Path | None, total_steps: int) -> str:
    if run_dir is None:
        return "unknown"
    step = checkpointed_step(run_dir)
    if step is None:
        return "new"
    return "finished" if step >= total_steps else f"partial {step}/{total_steps}"


def _step_flops(cfg, seq_length: int, causal: bool) -> float:
    """Expected model FLOPs of one step: random-length samples each attend within themselves (E[L] and E[L²] of
    the uniform lengths), fixed rows over the whole row."""
    lengths = cfg.data.random_length
    if lengths is None:
        return flops.flops_per_step(cfg.model, seq_length, cfg.global_batch_size, causal=causal)
    return flops.mean_flops_for_uniform_lengths(cfg.model, lengths.min_length, lengths.max_length,
                                                cfg.global_batch_size, causal=causal)


def _flops_after(cfg, seq_length: int, phases: list[tuple[str, int]], start: int) -> float:
    """Model FLOPs of the steps from `start` on."""
    total, begin = 0.0, 0
    for kind, steps in phases:
        end = begin + steps
        total += max(0, end - max(begin, start)) * _step_flops(cfg, seq_length, kind == "clm")
        begin = end
    return total


def build_plan(grid_name: str, *, params: dict | None = None,
               run_root: str | None = None, data_path: str | None = None, checkpoint_dir: str | None = None,
               mfu: float = DEFAULT_MFU, peak: str = DEFAULT_PEAK,
               grid_options: dict | None = None) -> list[PlannedRun]:
    """Every run of the grid, built and validated, with its cost and state; `grid_options` are the grid
    function's arguments (the mini grid's steps and seeds)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
    entries = grids.get_grid(grid_name, **(grid_options or {}))
    params = dict(params or {})
    unused = set(params) - {p for e in entries for p in registry.get(e.recipe).parameters()}
    if unused:
        raise ValueError(f"parameter(s) {sorted(unused)} are taken by no recipe of grid {grid_name!r}")
    root = (run_root or RUN_ROOTS[grid_name]).rstrip("/")
    peak_flops = flops.peak_flops("bf16", peak)
    run_dirs = {e.name: f"{root}/{e.name}" for e in entries}
    planned = []
    for entry in entries:
        recipe = registry.get(entry.recipe)
        accepted = recipe.parameters()
        values = {**entry.params, **{k: v for k, v in params.items() if k in accepted}, "run_dir": run_dirs[entry.name]}
        if data_path:
            values["data_path"] = data_path
        if entry.after:
            values["init_from"] = run_dirs[entry.after]
        partial = recipe.build(**values)
        if entry.branch_of:
            partial.config.checkpoint.branch_from = run_dirs[entry.branch_of]
            partial.config.checkpoint.branch_step = entry.branch_step
        cfg = validate(partial)
        steps = cfg.phase_steps()
        phases = [(p.objective.kind, s) for p, s in zip(cfg.phases, steps)]
        seq = recipe.seq_length
        to_hours = 1 / (mfu * peak_flops) / 3600
        host_dir = host_run_dir(cfg.run_dir, checkpoint_dir)
        planned.append(PlannedRun(entry, partial, phases, cfg.total_steps, cfg.total_steps * cfg.global_batch_size
                                  * tokens_per_sample(cfg, seq), _flops_after(cfg, seq, phases, 0) * to_hours,
                                  _flops_after(cfg, seq, phases, entry.branch_step or 0) * to_hours,
                                  run_state(host_dir, cfg.total_steps),
                                  None if host_dir is None else checkpointed_step(host_dir), host_dir,
                                  memory_plan(cfg, world_size(partial), seq)))
    _plan_branches(planned)
    return planned


def _plan_branches(planned: list[PlannedRun]) -> None:
    """Each parent keeps its children's branch checkpoints; each branch is checked against its parent now (the
    trainer checks again against the checkpoint): a grid whose branches would not be exact is refused here."""
    by_name = {p.entry.name: p for p in planned}
    for name, points in branch_points(planned).items():
        by_name[name].partial.config.checkpoint.keep_steps = points
    for child in planned:
        if child.entry.branch_of:
            parent = by_name[child.entry.branch_of]
            check_branch_plan(validate(parent.partial), validate(child.partial), child.entry.branch_step,
                              f"{child.entry.name} (a branch of {parent.entry.name})")


def branch_points(planned: list[PlannedRun]) -> dict[str, list[int]]:
    """parent name → the sorted steps its runs in `planned` branch from."""
    points: dict[str, set[int]] = {}
    for p in planned:
        if p.entry.branch_of:
            points.setdefault(p.entry.branch_of, set()).add(p.entry.branch_step)
    return {name: sorted(steps) for name, steps in points.items()}


def select(planned: list[PlannedRun], only: list[str] | None) -> list[PlannedRun]:
    """The runs whose names match one of the `only` shell patterns (all when None)."""
    if not only:
        return planned
    unmatched = [pattern for pattern in only if not any(fnmatch.fnmatchcase(p.entry.name, pattern) for p in planned)]
    if unmatched:  # a mistyped name among others would otherwise drop its run without a word
        raise ValueError(f"--only {' '.join(unmatched)}: matches no run of the grid (its runs: `--plan`)")
    return [p for p in planned if any(fnmatch.fnmatchcase(p.entry.name, pattern) for pattern in only)]


def to_launch(planned: list[PlannedRun], all_runs: list[PlannedRun] | None = None) -> list[PlannedRun]:
    """The unfinished runs, refusing one whose parent is neither finished (its branch checkpoint written, for a
    branch) nor launched with it."""
    launching = [p for p in planned if not p.finished]
    names = {p.entry.name for p in launching}
    states = {p.entry.name: p for p in (all_runs or planned)}
    for p in launching:
        parent = p.entry.after
        if parent and parent not in names and not (parent in states and states[parent].finished):
            raise ValueError(f"{p.entry.name} continues {parent}, which has not finished and is not selected; "
                             f"add it to --only (or let it finish first)")
        parent = p.entry.branch_of
        if parent and parent not in names and not _branch_checkpoint_written(states.get(parent), p):
            raise ValueError(f"{p.entry.name} branches from {parent} at step {p.entry.branch_step}, whose checkpoint "
                             f"is not written and which is not selected; add it to --only")
    return launching


def _branch_checkpoint_written(parent: PlannedRun | None, child: PlannedRun) -> bool:
    if parent is None or parent.host_dir is None:
        return False
    return (parent.host_dir / "checkpoints" / f"iter_{child.entry.branch_step:07d}" / "train_state.json").exists()


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def plan_table(planned: list[PlannedRun], mfu: float, peak: str) -> str:
    lines = [f"{'run':<30} {'phases (steps)':<26} {'tokens':>9} {'GPU-h':>8} {'own GPU-h':>9} "
             f"{'after / branch of':<24} {'layout':<16} {'GiB mean/worst':>14}  state"]
    for p in planned:
        phases = " → ".join(f"{kind} {steps}" for kind, steps in p.phases)
        source = p.entry.after or (f"{p.entry.branch_of}@{p.entry.branch_step}" if p.entry.branch_of else "-")
        memory = "-" if p.memory is None else f"{p.memory.mean.total / GIB:.1f}/{p.memory.worst.total / GIB:.1f}"
        layout = "-" if p.memory is None else p.memory.layout
        lines.append(f"{p.entry.name:<30} {phases:<26} {p.tokens / 1e9:>8.1f}B {_hours(p.gpu_hours):>8} "
                     f"{_hours(p.own_gpu_hours):>9} {source:<24} {layout:<16} {memory:>14}  {p.state}")
    todo = [p for p in planned if not p.finished]
    branches = [p for p in planned if p.entry.branch_of]
    lines.append(f"{len(planned)} runs, {sum(p.tokens for p in planned) / 1e9:,.1f}B tokens, "
                 f"{_hours(sum(p.own_gpu_hours for p in planned))} GPU-hours at {mfu:.0%} MFU of the {peak} bf16 peak "
                 f"(assumed, not measured) with branching ({len(branches)} runs branch off their parent's stable "
                 f"phase and train only their own steps), {_hours(sum(p.gpu_hours for p in planned))} without; "
                 f"to launch: {len(todo)} runs, {_hours(sum(p.own_gpu_hours for p in todo))} GPU-hours")
    sized = [p for p in planned if p.memory is not None]
    if sized:
        worst = max(sized, key=lambda p: p.memory.worst.total)
        lines.append(f"peak GPU memory per rank, estimated (mlmclm/model/memory.py, unverified on a GPU): mean "
                     f"micro-batch vs the worst (every sample at its longest); the largest is {worst.entry.name}: "
                     f"{worst.memory.worst.summary()}")
    return "\n".join(lines)
