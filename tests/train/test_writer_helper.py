"""The checkpoint writer's helper (`signals.start_checkpoint_writer_helper`) is a spawned interpreter per rank and per
start: it must load neither torch nor the parent's `__main__` module (NeMo-Run's runner, when NeMo-Run launched
the rank), and must still ignore the stop signals. Checked on the real helper of a real process started with
`python -m`, as NeMo-Run starts ranks."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

MAIN = '''
import os, sys, time
from pathlib import Path
import torch  # what a rank has loaded when it starts the helper
if __name__ != "__main__":  # re-imported by a spawned child
    Path(os.environ["MARKER"]).write_text(__name__)
else:
    from mlmclm.train import signals
    signals.start_checkpoint_writer_helper()
    print(signals._writer_manager._process.pid, flush=True)
    sys.stdin.read()  # keep the helper's parent alive until the test is done
'''


def test_the_helper_loads_neither_torch_nor_the_main_module_and_ignores_stop_signals(tmp_path):
    (tmp_path / "rank_main.py").write_text(MAIN)
    marker = tmp_path / "main_imported_by_child"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])]),
           "MARKER": str(marker)}
    rank = subprocess.Popen([sys.executable, "-m", "rank_main"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        helper = psutil.Process(int(rank.stdout.readline()))
        maps = Path(f"/proc/{helper.pid}/maps").read_text()
        assert "libtorch" not in maps, "the helper imported torch"
        assert not marker.exists(), f"the helper re-imported the rank's __main__ as {marker.read_text()}"
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            helper.send_signal(sig)
        time.sleep(0.5)
        assert helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE, "a stop signal killed the helper"
    finally:
        rank.stdin.close()
        rank.wait(timeout=60)
    time.sleep(0.5)
    assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE, "the helper outlived its rank"
