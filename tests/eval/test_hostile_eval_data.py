"""Evaluation data from others is checked, not taken on trust: tag ids outside a dataset's ClassLabel names are
refused naming the file and row (Python's indexing made -1 silently the last tag and 42 an IndexError); a data
root's manifest of the wrong shape is one line and exit 2; its row counts are checked, and a file linked out of the
root or an unlisted shard is refused."""
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_fixtures import evaluate_main
from hub_fixtures import REVISIONS, build_mirror

from mlmclm.eval.data.fetch import fetch_suite, mirror
from mlmclm.eval.finetune.presets import paper_suite
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskDataError, TaskSpec

CONLL_TRAIN = "hgissbkh/conll2003-en/data/train-00000-of-00001.parquet"


def _edit_parquet(path: Path, edit) -> None:
    """Rewrite a shard with `edit(rows)` applied, keeping its schema (and the ClassLabel names in its metadata)."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def _fetched(tmp_path: Path, task: str, edit_mirror=None) -> Path:
    """A data root written by the real fetch from a mirror of the paper repositories, `edit_mirror(mirror)` first."""
    source = build_mirror(tmp_path / "mirror")
    if edit_mirror is not None:
        edit_mirror(source)
    fetch_suite(tmp_path / "data", [task], hub=mirror(source, dict(REVISIONS)), progress=False)
    return tmp_path / "data"


@pytest.mark.parametrize("tag", [-1, 42])
def test_a_tag_id_outside_the_classlabel_names_is_refused_naming_file_and_row(tmp_path, tag):
    def plant(rows):
        rows[2]["ner"][1] = tag

    root = _fetched(tmp_path, "conll2003", lambda m: _edit_parquet(m / CONLL_TRAIN, plant))
    [spec] = paper_suite(root, ["conll2003"])
    with pytest.raises(ValueError, match=rf"{root / CONLL_TRAIN} row 3: tag id {tag} \(token 2\) is outside the "
                                         r"dataset's 9 tag names \(ids 0 to 8\)"):
        load_task(spec)


SST2_TRAIN = "nyu-mll/glue/sst2/train-00000-of-00001.parquet"


@pytest.mark.parametrize("manifest", [
    [], {"repos": []}, {"repos": {"nyu-mll/glue": []}},
    {"repos": {"nyu-mll/glue": {"revision": "a", "complete": True, "files": {"sst2/x.parquet": 3}}}},
])
def test_a_manifest_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path, capsys, manifest):
    """The old code ended in an AttributeError traceback."""
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert evaluate_main()(["grid", "--list", "--task", "sst2", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evaluate: error: {tmp_path / 'manifest.json'}: ") and err.count("\n") == 1, err


def _sst2(root: Path):
    [spec] = paper_suite(root, ["sst2"])
    return spec


def test_the_manifests_row_counts_are_checked(tmp_path):
    root = _fetched(tmp_path, "sst2")
    load_task(_sst2(root))  # as fetched: read
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["repos"]["nyu-mll/glue"]["files"]["sst2/train-00000-of-00001.parquet"]["rows"] = 999_999
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{root / SST2_TRAIN} \(listed in {root / 'manifest.json'}\): holds 16 "
                                         r"rows, the manifest records 999999"):
        load_task(_sst2(root))


def test_a_file_linked_out_of_the_data_root_or_an_unlisted_shard_is_refused(tmp_path):
    root = _fetched(tmp_path, "sst2")
    outside = tmp_path / "elsewhere.parquet"
    shutil.copyfile(root / SST2_TRAIN, outside)           # the same bytes and rows: only the place is wrong
    (root / SST2_TRAIN).unlink()
    (root / SST2_TRAIN).symlink_to(outside)
    with pytest.raises(ValueError, match=rf"{root / SST2_TRAIN} .*: refusing to read it: it leads out of the data "
                                         rf"root {root} \(to {outside}\)"):
        load_task(_sst2(root))
    (root / SST2_TRAIN).unlink()
    shutil.copyfile(outside, root / SST2_TRAIN)
    load_task(_sst2(root))
    extra = root / "nyu-mll/glue/sst2/train-00001-of-00002.parquet"   # would add its rows to train
    shutil.copyfile(outside, extra)
    with pytest.raises(ValueError, match=rf"{extra}: not listed in {root / 'manifest.json'}, yet the suite would "
                                         r"read it"):
        load_task(_sst2(root))


def test_a_qrels_field_over_csvs_limit_is_refused_naming_file_and_line(tmp_path):
    """csv's `field larger than field limit (131072)` came out as a bare _csv.Error naming nothing."""
    from mlmclm.eval.data.hub_files import HubLayoutError, read_qrels

    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\t" + "d" * (200 * 1024) + "\t1\n")
    with pytest.raises(HubLayoutError, match=rf"^{qrels}:3: not a qrels TSV \(field larger than field limit"):
        read_qrels(tmp_path, "test.tsv")
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\tone\n")
    with pytest.raises(HubLayoutError, match=rf"^{qrels}:2: bad qrels row"):
        read_qrels(tmp_path, "test.tsv")


def test_a_row_longer_than_the_bound_is_refused_before_any_tokenizer_sees_it(tmp_path):
    """A 24M-character row took the evaluation's peak memory from 1.4 to 4.3 GB; now refused like prepare_data's
    --max-document-chars, naming the file and line or row. A JSONL line with no end is never read whole."""
    import tracemalloc

    from eval_fixtures import make_task_folder

    folder = make_task_folder(tmp_path / "task", "classification", sizes=(8, 4, 4))
    long_text = "word " * 600_000                                  # 3,000,000 characters
    with open(folder / "validation.jsonl", "a") as f:
        f.write(json.dumps({"text": long_text, "label": "pos"}) + "\n")
    spec = TaskSpec(name="t", family="classification", path=str(folder))
    with pytest.raises(TaskDataError, match=rf"{folder / 'validation.jsonl'}:5: a row of 3,000,0\d\d characters of "
                                            r"text, more than the 2,097,152 a row may hold"):
        load_task(spec)
    assert len(load_task(TaskSpec(name="t", family="classification", path=str(folder),
                                  max_row_chars=4_000_000)).splits["validation"][0]["text"]) > 0  # raised: read
    (folder / "validation.jsonl").write_text("{\"text\": \"" + "x" * 40_000_000)   # one line, no end
    tracemalloc.start()
    with pytest.raises(TaskDataError, match=rf"{folder / 'validation.jsonl'}:1: a row of more characters of text, "
                                            r"more than the 1,000,000"):
        load_task(TaskSpec(name="t", family="classification", path=str(folder), max_row_chars=1_000_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40_000_000, peak                               # the 40 MB line was never held whole (as str)
    (folder / "validation.jsonl").unlink()
    pq.write_table(pa.table({"text": ["fine", long_text], "label": ["pos", "neg"]}), folder / "validation.parquet")
    with pytest.raises(TaskDataError, match=rf"{folder / 'validation.parquet'} row 2: a row of 3,000,0\d\d "
                                            r"characters"):
        load_task(spec)
