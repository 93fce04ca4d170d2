"""`torchrun -m mlmclm.train CONFIG key=value ...`: the documented entry point, for real, and its config errors."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import train_scenarios as sc


def _torchrun() -> str:
    return str(Path(sys.executable).with_name("torchrun"))


def test_torchrun_entry_trains_with_overrides(tmp_path, data):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sc.config(tmp_path / "run", data, tp=1)))
    proc = subprocess.run(
        [_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "mlmclm.train", str(config),
         "total_steps=3", "phases.0.steps=1", "phases.1.steps=2", "schedule.style=constant",
         "phases.1.objective.mask_ratio=0.25"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((tmp_path / "run" / "checkpoints" / "iter_0000003" / "run_config.json").read_text())
    assert saved["total_steps"] == 3 and saved["phases"][1]["objective"]["mask_ratio"] == 0.25
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["clm", "mlm", "mlm"]
    assert _noise(proc.stderr) == [], proc.stderr[-3000:]
    # and the export a user runs next, with its verification in a fresh process: as quiet
    export = subprocess.run([sys.executable, "tools/convert_to_hf.py", str(tmp_path / "run"), str(tmp_path / "hf"),
                             "--verify"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).resolve().parents[2])
    assert export.returncode == 0, export.stderr[-3000:]
    assert _noise(export.stderr) == [], export.stderr[-3000:]


def _noise(stderr: str) -> list[str]:
    """Third-party warning lines a user would see at run time (the console should be as quiet as at --help)."""
    return [line for line in stderr.splitlines()
            if any(word in line for word in ("Warning:", "DEPRECATED", "deprecated", "warnings.warn"))]


def test_invalid_config_exits_2_naming_the_problem(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sc.config(tmp_path / "run", tmp_path / "data", tp=1)))
    proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), "optimizer.lr=-1"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "optimizer" in proc.stderr and "lr" in proc.stderr
    assert not (tmp_path / "run").exists()


def _alias_bomb(depth: int = 9) -> str:
    """A YAML config of ~500 bytes whose aliases, nested `depth` deep, stand for 10**depth strings."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, depth)]
    return "\n".join(lines + [f"model: {{note: *a{depth - 1}}}"]) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """yaml.safe_load shares aliased subtrees, but the overrides' JSON copy expands them: the old code grew to
    MemoryError (28 s here, 524 bytes of config). Now refused before anything expands, exit 2, naming the file."""
    config = tmp_path / "bomb.yaml"
    config.write_text(_alias_bomb())
    assert len(config.read_bytes()) < 1024
    proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{config}: refused: it expands to more than 100000 values" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_recursive_yaml_alias_and_a_fifo_config_are_refused(tmp_path):
    import os

    import pytest

    from mlmclm.config_io import ConfigFileError, load_file

    cyclic = tmp_path / "cycle.yaml"
    cyclic.write_text("model: &m {inner: *m}\n")
    with pytest.raises(ConfigFileError, match="cycle"):
        load_file(cyclic)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigFileError, match="a FIFO"):
        load_file(fifo)  # the old code blocked here, waiting for a writer
    assert load_file(_write(tmp_path / "ok.yaml", "a: &x [1, 2]\nb: *x\n")) == {"a": [1, 2], "b": [1, 2]}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_special_ids_outside_the_vocabulary_stop_the_run_at_its_start(tmp_path, data):
    """A manifest whose mask_id lies outside its vocabulary, validation off and no tokenizer named: the old run
    trained its CLM phase (and saved) and failed only when the MLM phase began. Now refused before step 1, exit 2,
    one line naming the manifest and the field; nothing trained or saved (the run is marked refused).
    The other special ids too."""
    data = shutil.copytree(data, tmp_path / "data")  # the session's dataset, copied: this test edits its manifest
    manifest = json.loads((data / "manifest.json").read_text())
    vocab = manifest["tokenizer"]["vocab_size"]
    for role, value in (("mask_id", vocab + 5), ("pad_id", -1), ("bos_id", vocab)):
        bad = dict(manifest, tokenizer=dict(manifest["tokenizer"], **{role: value}))
        (data / "manifest.json").write_text(json.dumps(bad))
        cfg = sc.config(tmp_path / "run", data, tp=1)
        cfg["data"].pop("tokenizer")
        config = tmp_path / "config.json"
        config.write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert (f"error: {data / 'manifest.json'}: tokenizer.{role} {value} is outside the vocabulary [0, {vocab})"
                in proc.stderr), proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        # Nothing trained or saved: the checkpoint folder holds at most the run's marker (run_lock.RUN_MARKER), which
        # keeps the folder ours so that the same command, its data fixed, is not refused as someone else's folder.
        checkpoints = tmp_path / "run" / "checkpoints"
        assert not checkpoints.exists() or sorted(p.name for p in checkpoints.iterdir()) == [".mlmclm-run"]
        assert json.loads((tmp_path / "run" / "run_status.json").read_text())["status"] == "refused"
        assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_non_empty_folder_that_holds_no_run_of_ours_is_refused(tmp_path, data):
    """run_dir pointing at someone else's folder (here one with its own metrics.jsonl): the old code trained there,
    wrote checkpoints among its files and rewrote its metrics.jsonl. Now exit 2 naming the folder and the field that
    allows it, nothing written; with checkpoint.allow_foreign_run_dir=true it trains there."""
    foreign = tmp_path / "someone"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    (foreign / "metrics.jsonl").write_text('{"step": 99, "theirs": true}\n')
    before = {p.name: p.read_bytes() for p in foreign.iterdir()}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sc.config(foreign, data, tp=1)))
    short = ["total_steps=3", "phases.0.steps=1", "phases.1.steps=2", "schedule.style=constant"]
    proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), *short], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (f"error: run_dir {foreign} is not empty (metrics.jsonl, notes.txt) and holds no run of ours"
            in proc.stderr and "checkpoint.allow_foreign_run_dir=true" in proc.stderr), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in foreign.iterdir()} == before
    allowed = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), *short,
                              "checkpoint.allow_foreign_run_dir=true"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=300)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert (foreign / "notes.txt").read_text() == "mine\n" and (foreign / "checkpoints").is_dir()


def test_a_credential_in_the_data_location_is_used_but_never_recorded(tmp_path, data):
    """data.path carries a secret (an HF token set for the pipe's command): the run reads its data with it, and no
    file of the run (every checkpoint's run_config.json, TensorBoard's config text, metrics, run_status.json) nor
    its console holds it; the old code copied it into all of them. A run that fails prints and records the
    location redacted too."""
    token = "hf_" + "Zq7" * 10
    cfg = sc.config(tmp_path / "run", f"pipe:HF_TOKEN={token} cat {data}/manifest.json", tp=1)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    short = ["total_steps=3", "phases.0.steps=1", "phases.1.steps=2", "schedule.style=constant"]
    proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), *short], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "run_config.json" for p in written) and any("tfevents" in p.name for p in written)
    assert [p for p in written if token.encode() in p.read_bytes()] == []
    assert token not in proc.stdout + proc.stderr
    saved = json.loads(next(p for p in written if p.name == "run_config.json").read_text())
    assert saved["data"]["path"] == f"pipe:HF_TOKEN=<redacted> cat {data}/manifest.json"
    assert any(b"HF_TOKEN=<redacted>" in p.read_bytes() for p in written if "tfevents" in p.name)
    # the same command again resumes from the checkpoint whose recorded location is redacted (a location may move)
    again = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), *short], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "resumed" in again.stderr, again.stderr[-3000:]

    cfg = sc.config(tmp_path / "failed", f"pipe:HF_TOKEN={token} cat {tmp_path}/nowhere/manifest.json", tp=1)
    config.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, "-m", "mlmclm.train", str(config), *short], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "error: cannot read dataset manifest pipe:HF_TOKEN=<redacted> cat" in proc.stderr
    assert token not in proc.stdout + proc.stderr
    status = (tmp_path / "failed" / "run_status.json").read_text()
    assert "HF_TOKEN=<redacted>" in status and token not in status
