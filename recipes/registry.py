"""The recipe registry: named recipes (builder + fixed size), registered as NeMo-Run factories for
`pretrain_entry`, and the Markdown table of them (with the paper-grid runs each one launches, from
`recipes/grid.py`) that `python -m recipes --list-markdown` prints."""
from __future__ import annotations

import inspect
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

import nemo_run as run

from recipes import grid, paper, phase_plan, tiny
from recipes.base import PAPER_RUN_ROOT, PAPER_SEQ_LENGTH, SIZES, tokens_per_sample, validate, world_size
from recipes.entry import pretrain_entry
from recipes.parameter_types import check_parameter_types


@dataclass(frozen=True)
class Recipe:
    name: str
    builder: Callable[..., run.Partial]
    summary: str
    fixed: dict[str, Any] = field(default_factory=dict)  # arguments the name fixes (the size)
    example: dict[str, Any] = field(default_factory=dict)  # for required parameters, when listing/testing
    seq_length: int = PAPER_SEQ_LENGTH  # of the data the recipe expects (tokens per step in the table)
    prepare: Callable[[str], Any] | None = None  # local data preparation before launch (tiny recipes)

    def parameters(self) -> dict[str, Any]:
        """Free parameters and their defaults (what `key=value` on the command line can set)."""
        sig = inspect.signature(self.builder)
        return {n: p.default for n, p in sig.parameters.items() if n not in self.fixed}

    def build(self, **params) -> run.Partial:
        unknown = set(params) - set(self.parameters())
        if unknown:
            raise ValueError(f"recipe {self.name}: unknown parameter(s) {sorted(unknown)}; "
                             f"known: {sorted(self.parameters())}")
        check_parameter_types(self.name, self.builder, params)
        return self.builder(**self.fixed, **params)


def _paper_recipes() -> list[Recipe]:
    recipes = []
    for size in SIZES:
        fixed = {"size": size}
        # The paper ran biphasic and continued pretraining at 610m only; at other sizes they are our extension.
        extension = "" if size == "610m" else " — our extension (the paper: 610m only)"
        common = dict(fixed=fixed, seq_length=paper.SEQ_LENGTH)
        recipes += [
            Recipe(f"mlm_{size}", paper.mlm, f"MLM from scratch, {size}", **common),
            Recipe(f"clm_{size}", paper.clm, f"CLM from scratch, {size}", **common),
            Recipe(f"clm_mlm_{size}", paper.clm_mlm,
                   f"CLM then MLM in one job (in-process switch), {size}{extension}", **common),
            Recipe(f"cpt_{size}", paper.cpt, f"continued MLM pretraining from a checkpoint, {size}{extension}",
                   example={"init_from": f"{PAPER_RUN_ROOT}/{paper.clm_name(size, 42_000)}"}, **common),
            Recipe(f"clm_mlm_long_{size}", phase_plan.clm_mlm_long,
                   f"beyond the paper: CLM 50 % → MLM 30→15 % → 8k-context MLM (θ 160k, own data), {size}",
                   **common),
        ]
    return recipes


def _tiny_recipes() -> list[Recipe]:
    common = dict(seq_length=tiny.TINY_SEQ_LENGTH, prepare=tiny.prepare_tiny_data)
    return [
        Recipe("tiny_clm_mlm", tiny.tiny_clm_mlm, "CPU demo: tiny model, CLM 25 % then MLM, 2 processes", **common),
        Recipe("tiny_clm", tiny.tiny_clm, "CPU demo: tiny model, CLM only, 2 processes", **common),
        Recipe("tiny_mlm", tiny.tiny_mlm, "CPU demo: tiny model, MLM only (init_from= makes it CPT), 2 processes",
               **common),
        Recipe("tiny_phase_plan", tiny.tiny_phase_plan, "CPU twin of clm_mlm_long: CLM → MLM 30→15 % → 256-token "
               "MLM (θ 40k, own rows), 2 processes", seq_length=tiny.TINY_SEQ_LENGTH,
               prepare=tiny.prepare_tiny_phase_plan_data),
    ]


RECIPES: dict[str, Recipe] = {r.name: r for r in _paper_recipes() + _tiny_recipes()}


def get(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; `python -m recipes --list` shows the {len(RECIPES)} recipes")
    return RECIPES[name]


def _register_with_nemo_run() -> None:
    """Each recipe as a NeMo-Run factory of `pretrain_entry`: `run.cli.resolve_factory(pretrain_entry, NAME)()`."""
    for recipe in RECIPES.values():
        def factory(recipe: Recipe = recipe, **params) -> run.Partial:
            return recipe.build(**params)

        factory.__name__ = factory.__qualname__ = recipe.name
        run.cli.factory(factory, target=pretrain_entry, name=recipe.name)


_register_with_nemo_run()


# --- the generated documentation table ----------------------------------------------------------------------

def _layout(cfg) -> str:
    p = cfg.parallel
    parts = [f"TP{p.tensor_parallel}", f"PP{p.pipeline_parallel}"]
    if p.virtual_pipeline_parallel:
        parts.append(f"VPP{p.virtual_pipeline_parallel}")
    parts.append(f"CP{p.context_parallel}")
    if p.sequence_parallel:
        parts.append("SP")
    if cfg.optimizer.distributed_optimizer:
        parts.append("dist-opt")
    if cfg.precision.fp8:
        parts.append(f"FP8 {cfg.precision.fp8}")
    return " ".join(parts)


def _phases(cfg) -> str:
    steps = cfg.phase_steps()
    return " → ".join(f"{p.name} {s}" + (f" (mask {p.objective.mask_ratio})" if p.objective.kind == "mlm" else "")
                      for p, s in zip(cfg.phases, steps))


def paper_runs_by_recipe() -> dict[str, list[str]]:
    """Names of the paper-grid runs (recipes/grid.py) each recipe launches."""
    runs: dict[str, list[str]] = {}
    for entry in grid.paper_grid():
        runs.setdefault(entry.recipe, []).append(entry.name)
    return runs


def markdown_table() -> str:
    """One row per registered recipe, built with its defaults (and example values for required parameters)."""
    paper_runs = paper_runs_by_recipe()
    lines = ["| Recipe | What it runs | Model | Phases (steps) | Schedule | Layout | Nodes × GPUs | "
             "Micro × accum × DP | Tokens/step | Paper-grid runs | Parameters |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for recipe in RECIPES.values():
        partial = recipe.build(**recipe.example)
        cfg = validate(partial)
        dp = cfg.parallel.data_parallel_size(world_size(partial))
        accum = cfg.num_microbatches(dp)
        sched = cfg.schedule
        grid_runs = ", ".join(f"`{n}`" for n in paper_runs.get(recipe.name, [])) or "—"
        params = ", ".join(f"`{k}`" for k in recipe.parameters())
        lines.append(
            f"| `{recipe.name}` | {recipe.summary} | {cfg.model.name} | {_phases(cfg)} | "
            f"{sched.style} warmup {sched.warmup_steps}, decay {sched.decay_steps} | {_layout(cfg)} | "
            f"{partial.nodes} × {partial.gpus_per_node} | {cfg.micro_batch_size} × {accum} × {dp} | "
            f"{_tokens_per_step(cfg, recipe.seq_length)} | {grid_runs} | {params} |")
    return "\n".join(lines) + "\n"


def _tokens_per_step(cfg, seq_length: int) -> str:
    tokens = f"{round(cfg.global_batch_size * tokens_per_sample(cfg, seq_length)):,}"
    lengths = cfg.data.random_length
    return tokens if lengths is None else f"{tokens} (mean; samples {lengths.min_length}-{lengths.max_length})"


README = Path(__file__).with_name("README.md")
TABLE_START, TABLE_END = "<!-- recipe-table:start (python -m recipes --update-readme) -->", "<!-- recipe-table:end -->"


def readme_table(text: str) -> str:
    """The generated part of a README: what lies between the two markers."""
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{README} lacks the table markers {TABLE_START!r} ... {TABLE_END!r}")
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip("\n") + "\n"


def write_readme_table(path: Path = README) -> Path:
    text = path.read_text()
    readme_table(text)  # markers present
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    path.write_text(f"{head}{TABLE_START}\n{markdown_table()}{TABLE_END}{tail}")
    return path
