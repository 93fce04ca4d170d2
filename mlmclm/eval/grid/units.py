"""A unit of the grid: one (model, task, LR, seed) — for retrieval the tower's training and the evaluations on its
own and its extra test sets — with its fingerprint, estimated cost, and the records it writes when it ends.

The plan is every unit of the grid, ordered longest first (by estimated FLOPs; ties in the grid's own order), so
the units that would otherwise end a grid late start early. A unit is finished when its record, and each extra
set's, holds the unit's fingerprint (protocol.run_fingerprint); it is then read back, never run again.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from mlmclm.eval.finetune.protocol import (SEEDED_HALVES_NOTE, ProtocolConfig, RunRecord, data_identity,
                                           read_finished, run_fingerprint, run_path, write_json_atomic)
from mlmclm.eval.finetune.runner import finetune_and_score
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.finetune.training import FinetuneConfig, budget_steps, max_length_of
from mlmclm.eval.grid.cost import EncoderShape, forward_flops, tokens_of, training_flops

# Texts a row feeds the encoder, per family (for the length estimate of the cost).
_TEXT_FIELDS = {"classification": ("text", "text_pair"), "token_classification": ("tokens",),
                "qa": ("question", "context"), "retrieval": ("query",)}


@dataclass
class Unit:
    model: str
    model_dir: Path
    data: TaskData
    learning_rate: float
    seed: int
    config: FinetuneConfig
    fingerprint: str
    flops: float  # estimated model FLOPs (cost.py): the order, the ETA's weights, --list's hours
    index: int = 0  # place in the grid's model x task x LR x seed order (records are returned in it)

    @property
    def id(self) -> str:
        """`<model>/<task>/lr<lr>_seed<seed>`: its record's path under runs/, its claim's under claims/."""
        return f"{self.model}/{self.data.spec.name}/lr{self.learning_rate:g}_seed{self.seed}"

    @property
    def task(self) -> str:
        return self.data.spec.name

    def record_paths(self, output_dir: Path) -> dict[str, Path]:
        """Task name -> record path: the unit's own task first, then each extra test set trained by it."""
        names = [self.task, *self.data.extra_tests]
        return {name: run_path(output_dir, self.model, name, self.learning_rate, self.seed) for name in names}


def _row_texts(rows: list[dict], family: str) -> list[str]:
    texts = []
    for row in rows:
        if family == "retrieval":
            texts += [row["query"], *row.get("positives", [])[:1]]
        else:
            texts.append(" ".join(" ".join(v) if isinstance(v, list) else str(v)
                                  for v in (row.get(f) for f in _TEXT_FIELDS[family]) if v))
    return texts


def estimated_flops(shape: EncoderShape, data: TaskData, config: FinetuneConfig, length: int) -> float:
    """Training (a QA run of EncodEval's rules trains two models) plus the forward passes over its evaluation
    rows — retrieval: both towers' inputs and each set's corpus."""
    family, rows = data.spec.family, data.splits.get("train", [])
    train_rows = len(rows) if family != "retrieval" else sum(len(r.get("positives", [])) for r in rows)
    steps = budget_steps(max(1, train_rows), config)
    texts = _row_texts(rows, family)
    per_row = tokens_of(texts, length) * (2 if family == "retrieval" else 1)  # a pair: query and passage
    models = 2 if family == "qa" and data.spec.rules == "encodeval" else 1
    total = models * training_flops(shape, steps, config.batch_size, per_row)
    evaluated = [r for split in ("validation", "test") for r in data.splits.get(split, [])]
    for extra in data.extra_tests.values():
        evaluated += [r for rows_ in extra.splits.values() for r in rows_]
    total += models * forward_flops(shape, len(evaluated), tokens_of(_row_texts(evaluated, family), length))
    corpora = [data.corpus or {}] + [extra.corpus or {} for extra in data.extra_tests.values()]
    documents = [text for corpus in corpora for text in corpus.values()]
    return total + forward_flops(shape, len(documents), tokens_of(documents, length))


def plan_units(model_dirs: dict[str, Path], tasks: list[TaskData], protocol: ProtocolConfig) -> list[Unit]:
    """Every unit, longest first (stable: the grid's model x task x LR x seed order among equals)."""
    units = []
    for label, directory in model_dirs.items():
        shape = EncoderShape.of_model_dir(directory)
        for data in tasks:
            for lr in protocol.learning_rates:
                for seed in protocol.seeds:
                    config = protocol.finetune_config(lr, seed, data.spec.family, data.spec.name)
                    fingerprint = run_fingerprint(directory, data.spec, config, data_identity(data))
                    cost = estimated_flops(shape, data, config, max_length_of(data.spec, directory))
                    units.append(Unit(label, Path(directory), data, lr, seed, config, fingerprint, cost, len(units)))
    return sorted(units, key=lambda unit: (-unit.flops, unit.index))


def finished_records(unit: Unit, output_dir: Path) -> list[RunRecord] | None:
    """The unit's records when every one of them is there with its fingerprint; None otherwise."""
    records = [read_finished(path, unit.fingerprint) for path in unit.record_paths(output_dir).values()]
    return None if any(r is None for r in records) else records


def run_unit(unit: Unit, output_dir: Path, worker: str = "", keep: callable = lambda: True) -> list[RunRecord]:
    """Fine-tune and score the unit, then write its records atomically, the extra sets' first and the unit's own
    last (its own record is what marks the unit finished). `keep()` is asked just before writing: a worker that
    lost its claim meanwhile (taken over after it stopped beating) writes nothing."""
    started = time.perf_counter()
    data, spec = unit.data, unit.data.spec
    outcome = finetune_and_score(unit.model_dir, data, unit.config)
    record = RunRecord(model=unit.model, task=spec.name, family=spec.family, main_metric=spec.main_metric,
                       learning_rate=unit.learning_rate, seed=unit.seed, validation=outcome.metrics["validation"],
                       test=outcome.metrics["test"], diverged=outcome.log.diverged, steps=outcome.log.steps,
                       train_loss_first=outcome.log.first_loss, train_loss_last=outcome.log.last_loss,
                       fingerprint=unit.fingerprint, model_dir=str(unit.model_dir),
                       seconds=round(time.perf_counter() - started, 3),
                       extra={"notes": data.notes, "data": data.provenance, **rules_of(spec),
                              **_where(unit, worker, outcome.log.stopped_at)})
    records = []
    paths = unit.record_paths(output_dir)
    for name, path in list(paths.items())[1:]:
        # trained once, tested on another set: its own task, its LR chosen on its own validation split when it has
        # one (EncodEval's NQ and MLDR), else on the training task's
        extra_set = data.extra_tests[name]
        notes = [SEEDED_HALVES_NOTE.format(seed=unit.seed)] if extra_set.seeded_halves else []
        records.append(replace(record, task=name, test=outcome.metrics[f"test:{name}"],
                               validation=outcome.metrics.get(f"validation:{name}", record.validation),
                               extra={"notes": notes, "data": extra_set.provenance, "trained_on": spec.name,
                                      **rules_of(spec), **_where(unit, worker, outcome.log.stopped_at)}))
    if not keep():
        return []
    for extra_record in records:
        write_json_atomic(paths[extra_record.task], asdict(extra_record))
    write_json_atomic(paths[spec.name], asdict(record))
    return [record, *records]


def _where(unit: Unit, worker: str, stopped_at: int | None) -> dict:
    """Where and by whom the unit ran (not part of its fingerprint), and where an all-NaN run stopped stepping."""
    # threads: on CPU a run's last bits depend on them (reductions split across threads), so the record says
    where = {"device": unit.config.device, "threads": torch.get_num_threads(), **({"worker": worker} if worker else {})}
    if stopped_at is not None:
        where["stopped_at_step"] = stopped_at  # every weight NaN: the later steps could change nothing
    return where


def rules_of(spec: TaskSpec) -> dict[str, str]:
    """What a run record says of its rules: `{"rules": "encodeval"}` for runs under EncodEval's (the paper suite's:
    only those are compared with the paper's released scores, paper_report.py); nothing for standard runs."""
    return {"rules": spec.rules} if spec.rules != "standard" else {}
