"""Loading a task: its source rows (task_rows.py) made into train / validation / test by its split protocol
(missing splits derived deterministically), capped, its label inventory checked, and its retrieval extra test sets."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlmclm.eval.data.splits import paper_validation_split, shuffled
from mlmclm.eval.finetune.tags import TagError, tag_inventory
from mlmclm.eval.finetune.task_rows import (normalise_rows, provenance_of, read_hf_splits, read_local_split,
                                            read_splits, source_splits)
from mlmclm.eval.finetune.task_spec import EvalSet, TaskData, TaskDataError, TaskSpec


def load_extra_tests(spec: TaskSpec) -> dict[str, EvalSet]:
    """The eval-only sets of a retrieval task. Split protocol "official": its validation and test files (both
    needed); "seeded_halves": its test file, halved per seed at run time; otherwise its test (else validation) file
    alone, or the HF split — then the LR is chosen on the training task's validation."""
    out = {}
    for name, fields in spec.extra_tests.items():
        sub = TaskSpec.from_dict({"name": name, "family": "retrieval", **fields})
        if sub.split_protocol in ("official", "seeded_halves"):
            wanted = ("validation", "test") if sub.split_protocol == "official" else ("test",)
            raw = read_splits(sub)
            missing = [split for split in wanted if split not in raw]
            if missing:
                raise TaskDataError(f"task {spec.name!r}: extra set {name!r} has no {' / '.join(missing)} split in "
                                    f"{sub.path or 'hf:' + str(sub.hf_name)} (split protocol {sub.split_protocol!r})")
            sources = {split: raw[split] for split in wanted}
        elif sub.path is not None:
            folder = Path(sub.path)
            source = sub.split_names.get("test")
            rows = None
            for candidate in ([source] if source else ["test", "validation"]):
                rows = read_local_split(folder, candidate, sub.max_row_chars)
                if rows is not None:
                    break
            if rows is None:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} has no test/validation file in {folder}")
            sources = {"test": rows}
        else:
            raw = read_hf_splits(TaskSpec(**{**sub.__dict__, "split_protocol": "paper"}))
            if "test" not in raw:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} has no such split in hf:{sub.hf_name}")
            sources = {"test": raw["test"]}
        splits = {}
        for split, rows in sources.items():
            splits[split] = normalise_rows(sub, rows)
            if not splits[split]:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} in {rows.source} has no rows")
        corpus = next((rows.corpus for rows in sources.values() if rows.corpus is not None), None)
        out[name] = EvalSet(splits, seeded_halves=sub.split_protocol == "seeded_halves", corpus=corpus,
                            provenance=provenance_of(sources, sub))
        if out[name].seeded_halves:
            try:
                out[name].for_seed(0)  # refuse a set that cannot be halved now, not at the first run
            except ValueError as err:
                raise TaskDataError(f"task {spec.name!r}: extra set {name!r}: {err}") from err
    return out



def load_task(spec: TaskSpec) -> TaskData:
    """Load, validate and normalise a task; derive missing validation/test splits deterministically."""
    if spec.split_protocol == "seeded_halves":
        raise TaskDataError(f"task {spec.name!r}: split protocol 'seeded_halves' is for eval-only sets (extra_tests)")
    raw = read_splits(spec)
    origin = spec.path if spec.path is not None else f"hf:{spec.hf_name}"
    if "train" not in raw:
        raise TaskDataError(f"task {spec.name!r}: no train split in {origin} (expected train.jsonl or train.parquet)")

    splits: dict[str, list[dict[str, Any]]] = {}
    notes = []
    locations: dict[int, str] = {}  # id(row) -> file:line, for errors found after the splits are rearranged
    for split, rows in raw.items():
        if not rows.rows:  # an empty file is a mistake to report; only a missing one is derived (below)
            derivable = split != "train" and spec.split_protocol == "given"
            raise TaskDataError(f"task {spec.name!r}: {rows.source} is empty (no rows)"
                                + ("; fill it, or remove it to have the split derived" if derivable else ""))
        normalised = normalise_rows(spec, rows, locations)
        if normalised:
            splits[split] = normalised
        else:  # e.g. GLUE's test splits, whose labels are all -1
            notes.append(f"{rows.source} has no labeled rows; ignored")
    if "train" not in splits:
        raise TaskDataError(f"task {spec.name!r}: the train split in {origin} has no labeled rows")

    if spec.split_protocol == "paper":
        if "test" not in splits:
            raise TaskDataError(f"task {spec.name!r}: no '{source_splits(spec)['test']}' split in {origin} "
                                f"(the paper protocol tests on the official validation split)")
        try:
            splits["train"], splits["validation"] = paper_validation_split(splits["train"])
        except ValueError as err:
            raise TaskDataError(f"task {spec.name!r}: {err}") from err
        notes.append(f"validation = 5 % of train (seed 42); test = the official "
                     f"'{source_splits(spec)['test']}' split")
    elif spec.split_protocol == "official":
        missing = [split for split in ("validation", "test") if split not in splits]
        if missing:
            raise TaskDataError(f"task {spec.name!r}: no {' / '.join(source_splits(spec)[m] for m in missing)} split "
                                f"in {origin} (the 'official' protocol reads every split from its own file)")
        notes.append("validation and test are the source's own splits (none derived)")
    elif "validation" not in splits and "test" not in splits:
        rows = shuffled(splits["train"])
        tenth = max(1, len(rows) // 10)
        splits["validation"], splits["test"], splits["train"] = rows[:tenth], rows[tenth:2 * tenth], rows[2 * tenth:]
        notes.append("validation and test are each 10 % of train (shuffled with seed 0)")
    elif "test" not in splits or "validation" not in splits:
        present = "validation" if "validation" in splits else "test"
        rows = shuffled(splits[present])
        half = len(rows) // 2
        if half == 0:
            raise TaskDataError(f"task {spec.name!r}: {present} has one row, too few to derive the missing split")
        splits["validation"], splits["test"] = rows[:half], rows[half:]
        notes.append(f"validation and test are the two halves of the labeled {present} split (seed 0)")

    if spec.max_train_examples is not None and len(splits["train"]) > spec.max_train_examples:
        splits["train"] = shuffled(splits["train"])[: spec.max_train_examples]
    if spec.max_eval_examples is not None:
        for split in ("validation", "test"):
            if len(splits[split]) > spec.max_eval_examples:
                splits[split] = shuffled(splits[split])[: spec.max_eval_examples]

    labels: list[Any] = []
    if spec.family == "classification":
        labels = sorted({row["label"] for row in splits["train"]}, key=lambda v: (str(type(v)), v))
        if len(labels) < 2:
            raise TaskDataError(f"task {spec.name!r}: train has fewer than two distinct labels ({labels})")
        for split in ("validation", "test"):
            unseen = {row["label"] for row in splits[split]} - set(labels)
            if unseen:
                raise TaskDataError(f"task {spec.name!r}: {split} has labels never seen in train: {sorted(unseen)}")
    elif spec.family == "token_classification":
        try:
            labels = tag_inventory(spec.name, splits, locations, raw["train"].label_names, spec.tag_scheme)
        except TagError as err:
            raise TaskDataError(str(err)) from err
    extra = load_extra_tests(spec) if spec.extra_tests else {}
    corpus = next((rows.corpus for rows in raw.values() if rows.corpus is not None), None)
    return TaskData(spec=spec, splits=splits, labels=labels, notes=notes, extra_tests=extra, corpus=corpus,
                    provenance=provenance_of(raw, spec))

