"""The evaluation protocol: LR grid x seeds per (model, task), one JSON per run, resumable, then selection of the
learning rate on validation and reporting on test."""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlmclm.atomic_write import write_atomic
from mlmclm.bounded_read import open_regular_file, read_regular_json
from mlmclm.eval.data.data_files import MAX_ROW_CHARS
from mlmclm.eval.finetune.record_check import RunRecordError, check_record
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.finetune.training import FinetuneConfig
from mlmclm.path_names import check_path_component
from mlmclm.pickled_weights import load_plain_tensors
from mlmclm.tokenizer_probe import probe_tokenizer

PAPER_LEARNING_RATES = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
PAPER_SEEDS = (0, 1, 2, 3, 4)
# EncodEval's budgets per family: (max_steps, max_epochs); None = no cap of that kind.
PAPER_BUDGETS = (("classification", 1000, None), ("qa", 1000, None), ("retrieval", 1000, None),
                 ("token_classification", None, 1))
# Tasks whose budget differs from their family's: EncodEval's configs/QA/qed_*.yaml train one epoch (max_steps -1)
# where the other QA configs take 1000 steps (about 6.5 epochs of QED's train split); configs/TC/ontonotes_*.yaml
# set max_steps 1000 beside num_train_epochs 1, and transformers' Trainer lets max_steps win: 1000 steps (CoNLL and
# UNER keep max_steps -1: one epoch).
PAPER_TASK_BUDGETS = (("qed", None, 1), ("ontonotes5", 1000, None))
# EncodEval's micro-batches per family: configs/{SC,TC,QA}/*.yaml set per_device_train_batch_size 4 with
# train_batch_size 32 (8 accumulated micro-batches on one GPU); configs/IR/msmarco_pairs_*.yaml set
# per_device_train_batch_size 32 and no train_batch_size (one loss over the 32 pairs: CachedMNRL's mini-batches of
# 4 only split its forward passes).
PAPER_MICRO_BATCHES = (("classification", 4), ("token_classification", 4), ("qa", 4))
RUNS_FOLDER = "runs"
# User tasks: at least this many optimizer steps per run (small sets are repeated for more epochs), and a warning
# (console and summary) for any run with fewer than FEW_STEPS — a score from a handful of updates says little about
# the model (a 48-row task at batch 32 and one epoch got 2 steps and chance scores).
CUSTOM_MIN_STEPS = 100
SEEDED_HALVES_NOTE = ("validation / test = halves of the test queries drawn with seed {seed} (splits.py); EncodEval "
                      "draws its NQ halves unseeded, so these are not its halves")
FEW_STEPS = 50
# TaskSpec fields added after runs were recorded, with their defaults: a spec at these defaults fingerprints as
# before them, so finished runs of standard tasks are not re-run.
_LATER_FIELDS = {"rules": "standard", "tag_scheme": "IOB2", "max_row_chars": MAX_ROW_CHARS}


@dataclass(frozen=True)
class ProtocolConfig:
    """Grid and budget shared by every task (6 LRs, 5 seeds, batch 32, 10 % warmup then linear decay; the budget
    is min(max_steps, max_epochs) unless `budgets` sets it per family or `task_budgets` per task — `paper()` has
    EncodEval's)."""

    learning_rates: tuple[float, ...] = PAPER_LEARNING_RATES
    seeds: tuple[int, ...] = PAPER_SEEDS
    max_steps: int | None = 1000
    max_epochs: int | None = 1
    batch_size: int = 32
    warmup_fraction: float = 0.1
    budgets: tuple[tuple[str, int | None, int | None], ...] = ()  # (family, max_steps, max_epochs)
    task_budgets: tuple[tuple[str, int | None, int | None], ...] = ()  # (task, ...): wins over its family's
    dtype: str = "float32"  # fine-tuning precision (precision.DTYPES); the paper's is bf16
    min_steps: int | None = None  # floor under the epoch cap (training.budget_steps); custom suites: CUSTOM_MIN_STEPS
    micro_batches: tuple[tuple[str, int], ...] = ()  # (family, rows per micro-batch); others: the whole batch
    device: str = "cpu"  # where every run computes (finetune/device.py; `--device`): not part of a run's fingerprint

    @classmethod
    def paper(cls, **overrides) -> ProtocolConfig:
        return cls(**{"budgets": PAPER_BUDGETS, "task_budgets": PAPER_TASK_BUDGETS, "dtype": "bfloat16",
                      "micro_batches": PAPER_MICRO_BATCHES, **overrides})

    def __post_init__(self) -> None:
        if not self.learning_rates or any(not lr > 0 for lr in self.learning_rates):
            raise ValueError(f"learning_rates must be a non-empty list of positive values, got {self.learning_rates}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be non-empty and distinct, got {self.seeds}")
        FinetuneConfig(learning_rate=self.learning_rates[0], max_steps=self.max_steps, max_epochs=self.max_epochs,
                       batch_size=self.batch_size, warmup_fraction=self.warmup_fraction,
                       dtype=self.dtype, min_steps=self.min_steps, device=self.device)  # validates them
        for family, rows in self.micro_batches:  # refused here, before any run, naming the family
            if rows < 1 or self.batch_size % min(rows, self.batch_size):
                raise ValueError(f"batch size {self.batch_size} is not a whole number of {family} micro-batches "
                                 f"of {rows} rows (EncodEval's per-device batch): use a multiple of {rows}")

    def finetune_config(self, learning_rate: float, seed: int, family: str | None = None,
                        task: str | None = None) -> FinetuneConfig:
        max_steps, max_epochs = self.max_steps, self.max_epochs
        for name, steps, epochs in self.budgets:
            if name == family:
                max_steps, max_epochs = steps, epochs
        for name, steps, epochs in self.task_budgets:
            if name == task:
                max_steps, max_epochs = steps, epochs
        # a batch at or under the micro-batch is one pass, as EncodEval's accumulation (never below 1 step)
        micro = next((min(rows, self.batch_size) for name, rows in self.micro_batches if name == family), None)
        return FinetuneConfig(learning_rate=learning_rate, seed=seed, max_steps=max_steps, max_epochs=max_epochs,
                              batch_size=self.batch_size, warmup_fraction=self.warmup_fraction, dtype=self.dtype,
                              min_steps=self.min_steps, micro_batch_size=micro, device=self.device)


@dataclass
class RunRecord:
    """What one run writes (`runs/<model>/<task>/lr<lr>_seed<seed>.json`)."""

    model: str
    task: str
    family: str
    main_metric: str
    learning_rate: float
    seed: int
    validation: dict[str, float]
    test: dict[str, float]
    diverged: bool
    steps: int
    train_loss_first: float
    train_loss_last: float
    fingerprint: str
    model_dir: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def validation_score(self) -> float:
        return _score(self.validation.get(self.main_metric, float("nan")))

    @property
    def test_score(self) -> float:
        return _score(self.test.get(self.main_metric, float("nan")))

    @classmethod
    def from_json(cls, path: Path) -> RunRecord:
        try:
            raw = read_regular_json(path, what="run record")  # bounded: a planted FIFO must not block the grid
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RunRecordError(f"{path}: not a run record: not valid JSON ({err})") from None
        raw = check_record(raw, path)  # every field the summary reads, with its type (record_check.py)
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


def _score(value: float | None) -> float:
    return float("nan") if value is None else float(value)


_HASH_CACHE: dict[tuple[str, int, int, int], str] = {}
# A model directory comes from others: its JSON files (config, tokenizer: the largest real tokenizer.json is about
# 35 MB) are capped, its weights only refused when not regular files (a 2.1B model is GBs, and its size is no sign
# of harm). Every file the fine-tuning reads is hashed here first, so a FIFO or device is refused before anything
# (transformers included) would block on it.
JSON_FILE_LIMIT = 128 << 20
WEIGHT_FILE_LIMIT = 1 << 50


def file_digest(path: Path, limit: int = WEIGHT_FILE_LIMIT) -> str:
    """SHA-256 of a regular file's content, cached per (path, size, mtime_ns, inode) so a grid hashes each model
    once (anything but a regular file of at most `limit` bytes is refused, bounded_read)."""
    with open_regular_file(path, limit, "model file") as handle:
        stat = os.fstat(handle.fileno())
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
        if key not in _HASH_CACHE:
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            _HASH_CACHE[key] = digest.hexdigest()
    return _HASH_CACHE[key]


def model_fingerprint(model_dir: Path) -> list[tuple[str, str]]:
    """Content hashes of what defines the model: weights, config and tokenizer files."""
    model_dir = Path(model_dir)
    files = sorted({*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin"), *model_dir.glob("*.json"),
                    *model_dir.glob("*.model")})
    return [(p.name, file_digest(p, JSON_FILE_LIMIT if p.suffix == ".json" else WEIGHT_FILE_LIMIT))
            for p in files if not p.is_dir()]


def data_identity(data: TaskData) -> dict[str, Any]:
    """What a run read: per source split its origin (file, or repo@revision), row count and rows' digest, for the
    task and each extra test set (task_rows.provenance_of)."""
    return {"task": data.provenance, "extra_tests": {name: s.provenance for name, s in data.extra_tests.items()}}


def run_fingerprint(model_dir: Path, spec: TaskSpec, config: FinetuneConfig, data: dict | None = None) -> str:
    """Changes when anything that affects the result changes — the model files' *content* included, so a
    re-export into the same directory is never mistaken for the model that was evaluated, and the data read
    (`data_identity`): the same task path or data root holding another revision or other rows is other data."""
    fields = asdict(spec)
    for name, default in _LATER_FIELDS.items():  # at their defaults, later fields leave fingerprints as they were
        if fields[name] == default:
            del fields[name]
    settings = asdict(config)
    del settings["device"]  # where a run computed is not what it is: a grid begun on CPUs is finished on GPUs
    content = {"spec": fields, "config": settings, "model": model_fingerprint(model_dir)}
    if data is not None:
        content["data"] = data
    payload = json.dumps(content, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_pickled_weights(model_dir: Path) -> None:
    """A model directory without safetensors is loaded from its pickled `*.bin` files: read each with the
    weights-only loader now, so that one holding more than tensors is refused in one line before any run, not in
    transformers' traceback (which advises `weights_only=False`) after the first fine-tune started."""
    if not any(model_dir.glob("*.safetensors")):
        for path in sorted(model_dir.glob("*.bin")):
            load_plain_tensors(path)


def run_path(output_dir: Path, model: str, task: str, learning_rate: float, seed: int) -> Path:
    """Where a run's record goes: always inside `output_dir` (label and task are single path components)."""
    return (Path(output_dir) / RUNS_FOLDER / check_path_component(model, "model label")
            / check_path_component(task, "task name") / f"lr{learning_rate:g}_seed{seed}.json")


def write_json_atomic(path: Path, payload: Any, allow_nan: bool = True) -> None:
    """Write to a temporary sibling then rename, so a crash never leaves a half-written file under the final name.
    `allow_nan=False` refuses NaN/Infinity, which `json` would otherwise write although they are not JSON."""
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=allow_nan)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def read_finished(path: Path, fingerprint: str) -> RunRecord | None:
    """The record at `path` when it is a run record with this fingerprint (a finished run); None otherwise — absent,
    damaged or not ours (run again, written anew under that name), or another configuration's."""
    if not path.exists():
        return None
    try:
        record = RunRecord.from_json(path)
    except RunRecordError:
        return None
    return record if record.fingerprint == fingerprint else None


def check_models(model_dirs: dict[str, Path]) -> None:
    """Each model folder checked before any run: a plain label, a config.json, weights that are tensors only, a
    tokenizer that loads (a hostile tokenizer.json: one line now, not a hang or a panic later)."""
    for label, directory in model_dirs.items():
        check_path_component(label, "model label")
        if not (Path(directory) / "config.json").exists():
            raise FileNotFoundError(f"model {label!r}: {directory} is not a Hugging Face model directory (no config.json)")
        check_pickled_weights(Path(directory))
        probe_tokenizer(Path(directory))


def budget_text(config: FinetuneConfig) -> str:
    parts = [f"max {config.max_steps} steps" if config.max_steps else "",
             f"{config.max_epochs} epoch(s)" if config.max_epochs else "", f"batch {config.batch_size}",
             f"at least {config.min_steps} steps" if config.min_steps else ""]
    return ", ".join(p for p in parts if p)


def load_records(output_dir: Path) -> list[RunRecord]:
    """All run JSONs under `output_dir/runs` (sorted by path)."""
    return [RunRecord.from_json(p) for p in sorted((Path(output_dir) / RUNS_FOLDER).glob("*/*/*.json"))]


def select_learning_rate(records: list[RunRecord]) -> float:
    """The LR with the best mean *validation* score over seeds (non-finite scores count as worst; ties -> smaller LR).
    Test scores are never looked at here."""
    if not records:
        raise ValueError("select_learning_rate: no runs")
    by_lr: dict[float, list[float]] = defaultdict(list)
    for record in records:
        score = record.validation_score
        by_lr[record.learning_rate].append(score if math.isfinite(score) else -math.inf)
    return max(sorted(by_lr), key=lambda lr: (float(np.mean(by_lr[lr])), -lr))


def group_runs(records: list[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    groups: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for record in records:
        groups[(record.model, record.task)].append(record)
    return dict(groups)
