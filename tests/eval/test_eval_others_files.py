"""Files under an evaluation output that the evaluation did not write are never deleted or replaced without being
asked (issue 56): `fetch --out` deleted the user's files under OUT/<repo>/ and OUT/.partial/."""
import json

import pytest
from hub_fixtures import REVISIONS, build_mirror

from mlmclm.eval.data.fetch import FetchError, fetch_suite, mirror

REPO = "nyu-mll/glue"  # what the sst2 task reads


@pytest.fixture
def hub(tmp_path):
    return mirror(build_mirror(tmp_path / "mirror"), dict(REVISIONS))


def _fetch(out, hub):
    return fetch_suite(out, ["sst2"], hub=hub, progress=False)


def test_fetch_never_replaces_a_repository_folder_holding_files_it_did_not_write(tmp_path, hub):
    out = tmp_path / "data"
    (out / REPO).mkdir(parents=True)
    (out / REPO / "notes.txt").write_text("mine\n")  # a folder fetch never wrote (no manifest records it)
    with pytest.raises(FetchError, match=rf"{REPO} holds 'notes.txt' that fetch did not write"):
        _fetch(out, hub)
    assert (out / REPO / "notes.txt").read_text() == "mine\n"

    (out / REPO / "notes.txt").unlink()
    (out / REPO).rmdir()
    _fetch(out, hub)  # a fetch of ours, then the user's file beside its files, then another revision to fetch
    (out / REPO / "notes.txt").write_text("mine\n")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["repos"][REPO]["revision"] = "0" * 40
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FetchError, match="'notes.txt' that fetch did not write"):
        _fetch(out, hub)
    assert (out / REPO / "notes.txt").read_text() == "mine\n"
    (out / REPO / "notes.txt").unlink()
    assert _fetch(out, hub)["repos"][REPO]["revision"] == REVISIONS[REPO]  # ours alone: replaced


def test_fetch_leaves_a_partial_folder_it_did_not_make(tmp_path, hub):
    out = tmp_path / "data"
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "mine.txt").write_text("mine\n")
    with pytest.raises(FetchError, match=r"\.partial exists and was not made by fetch"):
        _fetch(out, hub)
    assert (out / ".partial" / "mine.txt").read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir()) == [".partial"]


def test_grid_refuses_a_summary_it_did_not_write_before_any_run(tmp_path, tiny_model_dir, capsys):
    """`grid --output` replaced someone's summary.md / summary.json without asking, after the whole grid."""
    from tools.evaluate import main as evaluate

    out = tmp_path / "eval"
    out.mkdir()
    (out / "summary.md").write_text("# my notes\n")
    argv = ["grid", "--model", f"m={tiny_model_dir}", "--smoke", "--lrs", "1e-3", "--seeds", "0", "--max-steps", "1",
            "--output", str(out)]
    assert evaluate(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.md exists and is not a summary this tool wrote: pass --force" in err
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]  # nothing run, nothing written
    assert (out / "summary.md").read_text() == "# my notes\n"
