"""The README's demo paragraph is generated from the demo's figures.json, and `check` fails when they differ."""
import json

from pathlib import Path

from mlmclm.demo_figures import BEGIN, END, gaps, main, render

FIGURES = {
    "steps": 400, "entropy": 6.337, "train_loss": {"clm": 5.721, "mlm": 5.700}, "validation_works": 5,
    "validation": {"first": {"step": 25, "clm": 7.41, "mlm": 7.48}, "clm_end": {"step": 100, "clm": 5.98, "mlm": 6.77},
                   "last": {"step": 400, "clm": 6.73, "mlm": 6.31}},
    "passages": 60, "mask_ratio": 0.15,
    "fill_mask": {"unigram": {"loss": 6.75, "top1": 0.096}, "random init": {"loss": 9.07, "top1": 0.0},
                  "clm_end": {"loss": 7.00, "top1": 0.057}, "final": {"loss": 6.35, "top1": 0.154}},
    "smoke_steps": 100, "smoke_lr": 3e-3,
    "smoke": {"smoke_named_character": {"random init": 0.850, "CLM25": 0.833, "CLM25→MLM75": 0.854},
              "smoke_speaker_names": {"random init": 0.817, "CLM25": 0.861, "CLM25→MLM75": 0.859}},
}


def test_the_paragraph_says_what_the_numbers_support():
    text = render(FIGURES)
    assert "**0.64 nats below the entropy**, so the model uses context" in text
    assert "the final model is 0.40 nats better than the frequency baseline" in text
    # comparisons are made from the numbers: 83.3 vs 85.0 is behind; 85.4 vs 85.0 level (< 1 point); 86.1 ahead
    assert "F1 85.0 random / 83.3 CLM / 85.4 final: the CLM-phase export behind random init, the final one level " \
           "with it" in text
    assert "entity F1 81.7 random / 86.1 CLM / 85.9 final: the CLM-phase export ahead of random init" in text
    worse = {**FIGURES, "fill_mask": {**FIGURES["fill_mask"], "final": {"loss": 7.0, "top1": 0.1}},
             "train_loss": {"clm": 6.0, "mlm": 6.2}}
    text = render(worse)
    assert "0.25 nats worse than the frequency baseline" in text and "uses context" not in text


def test_check_fails_on_other_numbers_and_write_fixes_it(tmp_path, capsys):
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps(FIGURES))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nintro\n{BEGIN}\nWhat the demo measured: CLM loss 5.697 (stale)\n{END}\nafter\n")
    args = ["--readme", str(readme), "--figures", str(figures), "--reference", str(tmp_path / "reference.json")]
    assert main(["check", *args]) == 1
    assert "demo figures are not what" in capsys.readouterr().err
    assert main(["write", *args]) == 0 and main(["check", *args]) == 0
    text = readme.read_text()
    assert text.startswith("# x\n\nintro\n") and text.endswith(f"{END}\nafter\n") and render(FIGURES) in text
    readme.write_text("no markers")
    assert main(["check", *args]) == 2 and "markers" in capsys.readouterr().err
    assert main(["check", "--readme", str(readme), "--figures", str(tmp_path / "none.json")]) == 2


def test_the_readme_has_one_generated_block():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1


def test_the_block_names_its_host_and_a_failed_check_names_both(tmp_path, capsys):
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps({**FIGURES, "host": "GenuineIntel, Xeon (family 6 model 207), 2 CPUs"}))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold\n{END}\n")
    args = ["--readme", str(readme), "--figures", str(figures), "--reference", str(tmp_path / "reference.json")]
    assert main(["write", *args]) == 0
    assert f"{render(FIGURES)}\n<!-- measured on: GenuineIntel, Xeon (family 6 model 207), 2 CPUs -->\n{END}" \
        in readme.read_text()
    # the same figures from another host pass: the host note is not compared
    figures.write_text(json.dumps({**FIGURES, "host": "AuthenticAMD, EPYC (family 25 model 17), 2 CPUs"}))
    assert main(["check", *args]) == 0
    # on the README's own host any other figure fails, however small the change
    figures.write_text(json.dumps({**FIGURES, "train_loss": {"clm": 5.721, "mlm": 5.694},
                                   "host": "GenuineIntel, Xeon (family 6 model 207), 2 CPUs"}))
    assert main(["check", *args]) == 1
    err = capsys.readouterr().err
    assert "on the same host (GenuineIntel, Xeon (family 6 model 207), 2 CPUs), where they must be equal" in err
    assert "MLM loss 5.694" in err


HOSTS = Path(__file__).parent / "fixtures" / "demo_figures"
AMD, INTEL = HOSTS / "amd-epyc-family26-model2.json", HOSTS / "intel-xeon-family6-model207-as-printed.json"


def _readme_from(tmp_path, measured: Path) -> list[str]:
    """A README and reference written from `measured`; the check's arguments for them."""
    tmp_path.mkdir(exist_ok=True)
    readme, reference = tmp_path / "README.md", tmp_path / "reference.json"
    readme.write_text(f"intro\n{BEGIN}\nold\n{END}\n")
    assert main(["write", "--readme", str(readme), "--figures", str(measured), "--reference", str(reference)]) == 0
    return ["--readme", str(readme), "--reference", str(reference)]


def test_the_repository_readme_passes_on_the_amd_host_or_names_only_figures_outside_the_spread(capsys):
    # the figures a clean-clone `make demo` wrote on an AMD EPYC (family 26 model 2), against the README as it is
    root = Path(__file__).resolve().parents[1]
    code = main(["check", "--readme", str(root / "README.md"), "--reference", str(root / "docs/demo_figures.json"),
                 "--figures", str(AMD)])
    if code == 0:
        return
    assert code == 1
    named = {line.split(":")[0].strip() for line in capsys.readouterr().err.splitlines() if line.startswith("  ")
             and "README " in line}
    reference = json.loads((root / "docs/demo_figures.json").read_text())
    truly_outside = {gap.name for gap in gaps(reference, json.loads(AMD.read_text())) if not gap.within}
    assert named and named == truly_outside


def test_intel_and_amd_figures_pass_each_others_readme_within_the_spread(tmp_path, capsys):
    assert main(["check", *_readme_from(tmp_path / "intel", INTEL), "--figures", str(AMD)]) == 0
    out = capsys.readouterr().out
    assert "within the spread allowed between hosts" in out and "validation/last/clm: README 6.7, this run 6.852" in out
    assert main(["check", *_readme_from(tmp_path / "amd", AMD), "--figures", str(INTEL)]) == 0


def test_a_figure_outside_the_spread_fails_on_another_host_naming_only_it(tmp_path, capsys):
    args = _readme_from(tmp_path, INTEL)
    broken = json.loads(AMD.read_text())
    broken["train_loss"]["mlm"] += 0.3  # 5.751 → 6.005: a quarter nat further than any host moved it
    broken["passages"] = 59  # counted from the data: no host may move it
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert main(["check", *args, "--figures", str(tmp_path / "broken.json")]) == 1
    err = capsys.readouterr().err
    named = [line for line in err.splitlines() if line.startswith("  ") and "README " in line]
    assert len(named) == 2 and "2 of" in err
    assert named[0].startswith("  passages: README 60, this run 59") and "must be equal" in named[0]
    assert named[1].startswith("  train_loss/mlm: README 5.751, this run 6.005") and "bound 0.25 nats" in named[1]


def test_another_host_needs_the_reference_and_it_must_be_the_readmes(tmp_path, capsys):
    args = _readme_from(tmp_path, INTEL)
    reference = Path(args[-1])
    reference.rename(tmp_path / "moved.json")
    assert main(["check", *args, "--figures", str(AMD)]) == 2
    assert "is missing" in capsys.readouterr().err
    stale = json.loads(INTEL.read_text())
    stale["train_loss"]["mlm"] = 5.7
    reference.write_text(json.dumps(stale))
    assert main(["check", *args, "--figures", str(AMD)]) == 1
    err = capsys.readouterr().err
    assert "demo paragraph is not" in err and "write both from one run" in err
