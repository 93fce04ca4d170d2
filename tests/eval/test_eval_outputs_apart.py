"""Evaluation outputs are apart from what the evaluation reads: `fetch --out` is never the mirror it copies from (its
repositories would be replaced by their copies), `grid --output` and `--keep-retriever` are never a model or the
data root, `curve --output` never the training run (issue 56). Each is refused, naming both, before anything is
written; the inputs stay byte for byte."""
import shutil

import pytest
from hub_fixtures import REVISIONS, build_mirror

from mlmclm.eval.data.fetch import fetch_suite, mirror
from mlmclm.output_apart import OutputOverlapError
from tools.evaluate import main as evaluate


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out, relation", [("mirror", "is"), ("mirror/data", "is inside"), (".", "holds")])
def test_fetch_refuses_an_output_over_its_mirror(tmp_path, out, relation):
    folder = build_mirror(tmp_path / "mirror")
    before = _snapshot(tmp_path)
    with pytest.raises(OutputOverlapError, match=rf"output .* {relation} the mirror .*choose an output outside it"):
        fetch_suite(tmp_path / out, ["sst2"], hub=mirror(folder, dict(REVISIONS)), progress=False)
    assert _snapshot(tmp_path) == before


def test_grid_and_curve_refuse_an_output_over_what_they_read(tmp_path, tiny_model_dir, capsys):
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = _snapshot(tmp_path)
    quick = ["--smoke", "--lrs", "1e-3", "--seeds", "0", "--max-steps", "1"]
    cases = [(["grid", "--model", f"m={model}", *quick, "--output", str(model)], "is the model m"),
             (["grid", "--model", f"m={model}", *quick, "--output", str(model / "eval")], "is inside the model m"),
             (["grid", "--model", f"m={model}", *quick, "--output", str(tmp_path / "eval"), "--keep-retriever",
               str(model)], "is the model m"),
             (["curve", "--run-dir", str(run), *quick, "--output", str(run)], "is the training run")]
    for argv, said in cases:
        assert evaluate(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "choose an output outside it" in err, err
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "run"]
