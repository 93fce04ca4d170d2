"""Keep the retriever the evaluation fine-tuned as a sentence-transformers directory: the pipeline's end product is
an embedding model a person can use (`tools/evaluate.py grid … --keep-retriever DIR`).

After the grid, the learning rate is selected on validation as the summary selects it (protocol.py
`select_learning_rate`), and, at that rate, the seed with the best validation score; that run is trained again
(the same config, so on CPU the same model — fine-tuning is deterministic there; on a GPU it may differ in the last
digits) and its encoder and tokenizer are saved with the files sentence-transformers reads, set up as the
evaluation embedded: the task's prefixes as the "query"/"document" prompts, its evaluation length, its pooling,
normalised vectors. `retriever.json` beside them records the run (task, LR, seed, rules) and its scores from the
retraining next to the grid's record of the same run."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.convert.output import check_output, staged_output
from mlmclm.convert.remote_code_hooks import strip_remote_code_hooks
from mlmclm.eval.finetune.encodeval_heads import pooling_of
from mlmclm.eval.finetune.encodeval_inputs import encodeval_tokenizer, retrieval_lengths
from mlmclm.eval.finetune.protocol import ProtocolConfig, RunRecord, select_learning_rate
from mlmclm.eval.finetune.retrieval import run_retrieval
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.finetune.training import load_tokenizer, max_length_of
from mlmclm.export.sentence_transformers import SentenceTransformerLayout, write_sentence_transformer_files

RECORD_FILE = "retriever.json"


def retrieval_layout(spec: TaskSpec, model_dir: Path) -> SentenceTransformerLayout:
    """The sentence-transformers setup that embeds as retrieval.py's evaluation of `spec` does: its prefixes as
    prompts; its evaluation length (standard rules: the task's `max_length`, else 99 % of the model's positions;
    EncodEval's: the task's, else min(max positions, tokenizer length), encodeval_inputs.retrieval_lengths); mean
    pooling, or under EncodEval's rules the last token where the config's `retrieval_pooling` says "eos"."""
    pooling = "mean"
    if spec.rules == "encodeval":
        length = spec.max_length or retrieval_lengths(encodeval_tokenizer(model_dir), model_dir)[1]
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        pooling = "lasttoken" if pooling_of(_Attributes(config), "retrieval_pooling") == "eos" else "mean"
    else:
        length = max_length_of(spec, model_dir)
    return SentenceTransformerLayout(spec.query_prefix, spec.document_prefix, length, pooling)


class _Attributes:
    """A config.json dict read through attributes, as `pooling_of` reads a model config."""

    def __init__(self, values: dict):
        self.__dict__.update(values)


def retrieval_tokenizer(spec: TaskSpec, model_dir: Path):
    """The tokenizer retrieval.py embeds with under the task's rules (pad token and special ids as it sets them)."""
    return encodeval_tokenizer(model_dir) if spec.rules == "encodeval" else load_tokenizer(model_dir)


def save_sentence_transformer(encoder, tokenizer, layout: SentenceTransformerLayout, output: Path,
                              record: dict) -> None:
    """Write an in-memory encoder (`AutoModel`) and its tokenizer as a sentence-transformers directory at `output`,
    with `record` as retriever.json (refused when `output` exists; written in a staging sibling, published by one
    rename)."""
    with staged_output(output, force=False) as staging:
        encoder.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        write_sentence_transformer_files(staging, layout)
        strip_remote_code_hooks(staging)  # the evaluated model's config and tokenizer save its auto_map back out
        write_atomic(staging / RECORD_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class KeptRetriever:
    directory: Path
    learning_rate: float
    seed: int
    metrics: dict  # the retraining's scores per split ("validation", "test", "test:nq", ...)
    recorded: dict  # the grid's record of the same run: {"validation": ..., "test": ...}

    def text(self) -> str:
        main = "ndcg@10"
        now = self.metrics.get("test", {}).get(main)
        then = self.recorded.get("test", {}).get(main)
        same = "" if then is None or now == then else f" (the grid recorded {then:.4f}: retrained on another device?)"
        return (f"kept the retriever (lr={self.learning_rate:g}, seed={self.seed}, test {main} {now:.4f}{same}) as a "
                f"sentence-transformers model: {self.directory}")


def keep_retriever(records: list[RunRecord], data: TaskData, label: str, model_dir: Path,
                   protocol: ProtocolConfig, output: Path) -> KeptRetriever:
    """Retrain the selected run of (`label`, `data`) among `records` and keep it at `output` (see the module)."""
    if data.spec.family != "retrieval":
        raise ValueError(f"task {data.spec.name!r} is {data.spec.family}, not retrieval: no retriever to keep")
    check_output(output, force=False)  # before the retraining, not after
    runs = [r for r in records if r.model == label and r.task == data.spec.name]
    if not runs:
        raise ValueError(f"no finished runs of {label}/{data.spec.name} to choose a retriever from")
    learning_rate = select_learning_rate(runs)
    best = max((r for r in runs if r.learning_rate == learning_rate),
               key=lambda r: (r.validation_score if math.isfinite(r.validation_score) else -math.inf, -r.seed))
    config = protocol.finetune_config(learning_rate, best.seed, data.spec.family, data.spec.name)
    layout = retrieval_layout(data.spec, model_dir)
    trained = {}
    outcome = run_retrieval(Path(model_dir), data, config,
                            on_trained=lambda encoder, tokenizer: trained.update(encoder=encoder, tokenizer=tokenizer))
    kept = KeptRetriever(Path(output), learning_rate, best.seed, outcome.metrics,
                         {"validation": best.validation, "test": best.test})
    record = {"model": label, "source_model_dir": str(model_dir), "task": data.spec.name, "rules": data.spec.rules,
              "learning_rate": learning_rate, "seed": best.seed, "steps": outcome.log.steps,
              "metrics": outcome.metrics, "grid_record": kept.recorded,
              "prompts": {"query": layout.query_prompt, "document": layout.document_prompt},
              "max_seq_length": layout.max_seq_length, "pooling": layout.pooling}
    save_sentence_transformer(trained["encoder"], trained["tokenizer"], layout, output, record)
    return kept


def _retrieval_specs(tasks: list[TaskSpec | TaskData]) -> list[TaskSpec]:
    return [t.spec if isinstance(t, TaskData) else t for t in tasks
            if (t.spec if isinstance(t, TaskData) else t).family == "retrieval"]


def check_kept_outputs(root: Path, models: dict[str, Path], tasks: list[TaskSpec | TaskData]) -> None:
    """Refuse, before any fine-tuning, a grid whose retrievers cannot be kept: no retrieval task, or a directory
    under `root` that exists already."""
    specs = _retrieval_specs(tasks)
    if not specs:
        raise ValueError("--keep-retriever: none of the tasks is a retrieval task")
    for label in models:
        for spec in specs:
            check_output(Path(root) / label / spec.name, force=False)


def keep_retrievers(records: list[RunRecord], models: dict[str, Path], tasks: list[TaskSpec | TaskData],
                    protocol: ProtocolConfig, root: Path) -> list[str]:
    """Keep every (model, retrieval task)'s retriever under `root/LABEL/TASK`; one line each saying where."""
    lines = []
    for spec in _retrieval_specs(tasks):
        data = next((t for t in tasks if isinstance(t, TaskData) and t.spec is spec), None) or load_task(spec)
        for label, model_dir in models.items():
            lines.append(keep_retriever(records, data, label, model_dir, protocol, Path(root) / label / spec.name)
                         .text())
    return lines
