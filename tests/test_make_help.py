"""`make help` lists every target of the Makefile, one line each, without setting anything up."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_help_lists_every_target_on_one_line():
    phony = re.search(r"^\.PHONY: (.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    proc = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = {}
    for line in proc.stdout.splitlines():
        target, _, what = line.strip().removeprefix("make ").partition(" ")
        listed[target] = what.strip()
    assert sorted(listed) == sorted(phony), proc.stdout
    assert all(listed.values()), proc.stdout  # each with what it does
