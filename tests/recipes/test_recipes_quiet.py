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
