"""What `tools/evaluate.py grid` says while it runs and when it stops: progress lines in a log file (no terminal),
one line on Ctrl-C (a real SIGINT to a real process), and a bad --model refused before anything is written."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf

ROOT = Path(__file__).resolve().parents[2]


def _grid(model: Path, out: Path, log: Path, *extra: str, interval: str = "0.3") -> subprocess.Popen:
    """`evaluate.py grid --smoke` with stdout and stderr into `log` (a file, as under nohup or a batch job)."""
    env = {**os.environ, "MLMCLM_PROGRESS_SECONDS": interval}
    with open(log, "w") as stream:
        return subprocess.Popen([sys.executable, "tools/evaluate.py", "grid", "--model", f"tiny={model}", "--smoke",
                                 "--lrs", "1e-3", "--batch-size", "8", "--output", str(out), *extra],
                                cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def test_a_grid_writing_to_a_file_prints_progress_lines_while_it_runs(tiny_model_dir, tmp_path):
    log = tmp_path / "log.txt"
    proc = _grid(tiny_model_dir, tmp_path / "out", log, "--seeds", "0", "1", "--max-steps", "3")
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "\r" not in text, "a progress bar was drawn into the file"
    lines = re.findall(r"^evaluation runs: (\d+)/8 done, (\d+) left, ETA .*$", text, flags=re.M)
    assert lines, text[-3000:]
    # lines came while runs were still left (every 0.3 s here, 30 s by default), each naming the last finished run
    middle = [line for line in re.findall(r"^evaluation runs: [1-7]/8 done.*$", text, flags=re.M)]
    assert middle and all("last finished: tiny/smoke_" in line for line in middle), text[-3000:]
    assert all(int(done) + int(left) == 8 for done, left in lines)
    assert re.search(r"^evaluation runs: 8/8 done in [0-9.]+ (s|min)$", text, flags=re.M), text[-3000:]


def test_ctrl_c_ends_in_one_line_naming_the_saved_runs(tiny_model_dir, tmp_path):
    log, out = tmp_path / "log.txt", tmp_path / "out"
    proc = _grid(tiny_model_dir, out, log, "--seeds", "0", "1", "2", "3", "4", "--max-steps", "40", interval="60")
    try:
        deadline = time.monotonic() + 300
        while not list((out / "runs").glob("*/*/*.json")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        proc.kill()
    text = log.read_text()
    saved = len(list((out / "runs").glob("*/*/*.json")))
    assert 1 <= saved < 20
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert text.splitlines()[-1] == (
        f"evaluate: stopped (Ctrl-C): {saved} finished run{'s' * (saved != 1)} saved in {out / 'runs'}, the one in "
        f"progress lost (finished runs are not run again); the same command resumes"), text[-3000:]


def test_a_training_run_or_a_missing_folder_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    import tools.evaluate as evaluate

    run = tmp_path / "runs" / "mine"
    convert_from_hf(ImportConfig(str(tiny_model_dir), run, progress=False))  # a run folder, as training leaves one
    out = tmp_path / "eval"
    for where, expected in (
            (run, f"evaluate: error: --model bad={run}: {run} is a training run, not an exported model; export it "
                  f"first: python tools/convert_to_hf.py {run} OUT, then --model bad=OUT"),
            (run / "checkpoints", "is a training run, not an exported model; export it first"),
            (tmp_path / "nowhere", f"evaluate: error: --model bad={tmp_path / 'nowhere'}: {tmp_path / 'nowhere'} "
                                   f"does not exist"),
            (tmp_path, "is not a Hugging Face model folder (no config.json)")):
        assert evaluate.main(["grid", "--model", f"bad={where}", "--smoke", "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err, err
        assert not out.exists(), f"{where}: something was written"


def test_a_ctrl_c_that_a_library_swallows_still_stops_the_grid_after_that_unit(tiny_model_dir, tmp_path, monkeypatch,
                                                                               capsys):
    """A real SIGINT lands in the first unit inside code that swallows KeyboardInterrupt (a bare `except:`, as some
    libraries have): that unit finishes and is saved, no other unit starts, and the command still ends as a Ctrl-C
    (exit 130, its one line). The old loop ran every unit to the end and exited 0 (seen once on a loaded CI host)."""
    from eval_fixtures import evaluate_main

    from mlmclm.eval.grid import worker

    real_run_unit, calls = worker.run_unit, []

    def run_unit_with_a_swallowed_interrupt(unit, *args, **kwargs):
        calls.append(unit.id)
        if len(calls) == 1:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler runs here and raises
            except KeyboardInterrupt:
                pass  # what a library's bare `except:` does
        return real_run_unit(unit, *args, **kwargs)

    monkeypatch.setattr(worker, "run_unit", run_unit_with_a_swallowed_interrupt)
    out = tmp_path / "out"
    rc = evaluate_main()(["grid", "--model", f"tiny={tiny_model_dir}", "--smoke", "--lrs", "1e-3", "--seeds", "0", "1",
                          "--max-steps", "2", "--batch-size", "8", "--output", str(out)])
    assert rc == 130, capsys.readouterr().err[-2000:]
    assert len(calls) == 1 and len(list((out / "runs").glob("*/*/*.json"))) == 1
    assert "evaluate: stopped (Ctrl-C): 1 finished run saved in" in capsys.readouterr().err


def test_a_stop_that_lands_while_a_claim_is_taken_gives_the_claim_back(tiny_model_dir, tmp_path, monkeypatch,
                                                                        capsys):
    """A real SIGTERM lands right after a unit's claim file is created, before the unit starts: the command ends as
    a preemption (exit 75) and no claim is left behind for another worker to wait out. The old loop raised there,
    outside the block that gives a claim back, and left it (seen once in CI, where the create's fsync was slow)."""
    from eval_fixtures import evaluate_main

    from mlmclm.eval.grid.claims import ClaimStore

    real_claim, claimed = ClaimStore.claim, []

    def claim_then_a_stop(self, unit, fingerprint):
        taken = real_claim(self, unit, fingerprint)
        if taken and not claimed:
            claimed.append(unit)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        return taken

    monkeypatch.setattr(ClaimStore, "claim", claim_then_a_stop)
    out = tmp_path / "out"
    rc = evaluate_main()(["grid", "--model", f"tiny={tiny_model_dir}", "--smoke", "--lrs", "1e-3", "--seeds", "0",
                          "--max-steps", "2", "--batch-size", "8", "--output", str(out)])
    assert rc == 75, capsys.readouterr().err[-2000:]
    assert claimed and not list((out / "claims").rglob("*.json")), list((out / "claims").rglob("*"))
    assert not list((out / "runs").glob("*/*/*.json"))
