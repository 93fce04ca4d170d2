"""The recipe modules a user runs directly (`python -m recipes.sweep`, `python -m recipes.detour_run`) print no
third-party warning walls: megatron's "TE/apex not installed" lines and torch's "No CUDA runtime" log come at import,
before `main` runs, so each module quiets them first when it is the command."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("Warning:", "warnings.warn", "No CUDA runtime", "is not installed")


@pytest.mark.parametrize("command", [["recipes.sweep", "tiny", "--plan"], ["recipes.detour_run", "--help"]],
                         ids=["sweep-plan", "detour-help"])
def test_a_recipe_module_run_as_a_command_prints_no_warning_wall(command, tmp_path):
    proc = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    noise = [line for line in proc.stderr.splitlines() if any(word in line for word in NOISE)]
    assert noise == [], proc.stderr[-3000:]
    assert proc.stdout.strip()  # it did print its plan or its help


def test_nemo_runs_wait_for_its_log_tail_is_not_printed_and_its_other_warnings_are(caplog):
    """A local task that ends while NeMo-Run's log-tail thread still reads made NeMo-Run warn "Waiting for <task>'s
    log thread to complete for 10 seconds..." on stderr, by timing, before a refusal's one line (a CI run failed on
    it). The recipes' `quiet.install()` drops that line; the same logger's warning that logs went missing stays."""
    import inspect
    import logging

    from nemo_run.run.torchx_backend import launcher

    from mlmclm import quiet

    assert "Waiting for {app_id}'s log thread to complete for" in inspect.getsource(launcher.wait_and_exit)
    quiet.install(children=False)
    with caplog.at_level(logging.WARNING):
        launcher.logger.warning("Waiting for eval-1765000000's log thread to complete for 10 seconds...")
        launcher.logger.warning("Log thread did not complete within timeout, some logs may be missing")
    assert [r.getMessage() for r in caplog.records] == [
        "Log thread did not complete within timeout, some logs may be missing"]
