"""The processes that only read and launch configs — `python -m recipes ... --help` or `--dryrun`, the sweep's plan and
dry run, the launcher that waits on its ranks — import no megatron-core: only the ranks, the exports and the
trainer's own tools need it, and its import costs every such command ~2.5 CPU-s (docs/performance.md)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Each command as its module's `main`, one after the other in one fresh interpreter; then what it imported.
CHILD = """
import contextlib, io, json, sys
from recipes import __main__ as recipes_cli, sweep
runs = {
    "help": lambda: recipes_cli.main(["tiny_clm_mlm", "--help"]),
    "recipe dry run": lambda: recipes_cli.main(["tiny_clm_mlm", "steps=10", "run_dir=" + sys.argv[1], "--dryrun"]),
    "sweep plan": lambda: sweep.main(["paper", "--plan"]),
    "sweep dry run": lambda: sweep.main(["paper", "--only", "610m-clm-42k", "610m-clm-21k-mlm40-42k", "--executor",
                                         "slurm", "--dryrun", "executor.account=acct"]),
}
imported = {}
for name, run in runs.items():
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            run()
        except SystemExit as exit:
            assert exit.code in (0, None), (name, exit.code)
    imported[name] = sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "transformers"))
print(json.dumps(imported))
"""


def test_reading_and_launching_a_config_imports_no_megatron(tmp_path):
    env = {"NEMORUN_HOME": str(tmp_path / "nemo_run"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "MLMCLM_CONTAINER_IMAGE": "/images/mlmclm-test.sqsh", "MLMCLM_DATA_DIR": "/lustre/test-data",
           "MLMCLM_CHECKPOINT_DIR": "/lustre/test-checkpoints"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "run")], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(imported) == ["help", "recipe dry run", "sweep plan", "sweep dry run"]
    assert imported == {name: [] for name in imported}, imported
