"""A save the filesystem refuses says what happened (the OS's words, the directory, the checkpoint's size, the free
space, the last complete checkpoint), writes run_status.json, and the run resumes exactly once there is room.

The small filesystem is a real tmpfs mounted for the test (root only: CI runs as root), filled by another writer
while the run's second checkpoint is being written."""
import json
import os
import subprocess

import pytest

import train_scenarios as sc
from mlmclm.parallel.launch import spawn


@pytest.fixture
def small_filesystem(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _losses(run_dir):
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {k: v for k, v in row.items() if not k.startswith("perf/")}
    return rows


def test_a_full_disk_is_named_and_the_run_resumes_exactly_after_room_is_made(data, tmp_path, small_filesystem):
    reference_dir, run_dir = tmp_path / "reference", small_filesystem / "run"
    reference = sc.config(reference_dir, data, logging={"log_interval": 1})
    cfg = sc.config(run_dir, data, logging={"log_interval": 1})
    spawn(sc.run_filling_the_disk, 1, reference, cfg, str(small_filesystem / "filler"), tmp_path / "report.json")
    filled, still_full, with_room = json.loads((tmp_path / "report.json").read_text())

    last = run_dir / "checkpoints" / "iter_0000003"  # saved before the disk filled
    assert filled["type"] == "CheckpointWriteError", filled
    message = filled["message"]
    assert "No space left on device" in message, message
    assert str(run_dir / "checkpoints" / "iter_0000004") in message  # the phase-end save that failed
    assert "a checkpoint of this run takes" in message and " MB free there" in message, message
    assert f"the last complete checkpoint is {last}" in message, message
    assert filled["status"] == {"status": "save_failed", "step": 4, "detail": message}
    assert not (run_dir / "checkpoints" / ".staging_iter_0000004").exists()

    assert still_full["type"] == "CheckpointWriteError", still_full  # stopped before writing, by the room check
    assert "not enough free space for the next checkpoint" in still_full["message"], still_full
    assert still_full["status"]["status"] == "save_failed"

    assert with_room == {"attempt": "resumed with room", "type": None, "status": "completed"}
    assert _losses(run_dir) == _losses(reference_dir)  # every step, bit for bit, as if the disk had never filled
