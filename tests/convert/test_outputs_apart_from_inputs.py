"""An output that is its own input, lies inside it, or holds it is refused before anything is read or deleted: the
old `convert_to_hf RUN RUN --force` replaced the whole training run with the export, and `convert_from_hf HF HF
--force` deleted its source, then failed reading it (issue 56)."""
import shutil

import pytest
from convert_fixtures import make_random_eurobert, make_tokenizer, tool_main


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def _refused(tool, argv, capsys, relation: str, what: str):
    capsys.readouterr()  # what came before (a progress bar of the fixture)
    assert tool(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f" {relation} the {what} " in err and "choose an output outside it" in err, err


@pytest.mark.parametrize("output, relation", [("run", "is"), ("run/hf", "is inside"), (".", "holds")])
def test_convert_to_hf_refuses_an_output_over_its_run(tp2pp2_run, tmp_path, capsys, output, relation):
    work = tmp_path / "work"
    run = shutil.copytree(tp2pp2_run.run_dir, work / "run")
    before = _snapshot(work)
    iteration = f"run/checkpoints/iter_{tp2pp2_run.iteration:07d}"
    for given in ("run", iteration):  # the run, or one of its checkpoints: the run is what is read
        _refused(tool_main("convert_to_hf"), [str(work / given), str(work / output), "--force"], capsys, relation,
                 "training run")
    assert _snapshot(work) == before and run.is_dir()


@pytest.mark.parametrize("output, relation", [("hf", "is"), ("hf/megatron", "is inside"), (".", "holds")])
def test_convert_from_hf_refuses_an_output_over_its_source(tmp_path, capsys, output, relation):
    work = tmp_path / "work"
    source = make_random_eurobert(work / "hf")
    make_tokenizer(source)
    before = _snapshot(work)
    _refused(tool_main("convert_from_hf"), [str(source), str(work / output), "--force"], capsys, relation, "source")
    assert _snapshot(work) == before
