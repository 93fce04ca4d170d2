"""Temporary files are created exclusively under a random name: a symlink planted at the old fixed temporary name
(`shard-000000.tar.tmp`, `run_status.json.tmp`, ...) in a shared folder is never followed, and what is written is
as open as the user's umask asks."""
import json
import os
import stat

import numpy as np
import pytest

from mlmclm.atomic_write import atomic_file, current_umask, file_mode, write_atomic


@pytest.fixture
def umask():
    """Set a umask for the test, restored after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


def test_write_atomic_replaces_whole_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a.json"
    write_atomic(target, '{"a": 1}')
    write_atomic(target, b'{"a": 2}')
    assert target.read_text() == '{"a": 2}'
    with pytest.raises(RuntimeError):
        with atomic_file(target) as stream:
            stream.write("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == '{"a": 2}' and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_mode_is_what_the_umask_asks(tmp_path, umask, mask, expected):
    umask(mask)
    assert current_umask() == mask and file_mode() == expected
    write_atomic(tmp_path / "f", "x")
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == expected


def _plant(folder, name):
    """A victim file outside `folder` and a link to it at `folder/name` (what someone else could plant)."""
    victim = folder.parent / f"victim-{name}"
    victim.write_text("precious\n")
    (folder / name).symlink_to(victim)
    return victim


def _shard(folder):
    from mlmclm.data.shards import write_shard

    write_shard(folder / "shard-000000.tar", [(np.ones((2, 4), np.int32), np.zeros(0, np.int64))], None)


def _tails(folder):
    from mlmclm.data.partition import write_tails

    write_tails(folder, [(0, np.ones(3, np.int32), np.zeros(0, np.int64))])


def _status(folder):
    from mlmclm.train.run_status import write_status

    class Cfg:
        run_dir = str(folder)

    write_status(Cfg(), "completed", 3)


def _metrics(folder):
    from mlmclm.train.logger import rewind_metrics as _rewind_metrics

    (folder / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    _rewind_metrics(folder / "metrics.jsonl", 1)


def _lock(folder):
    from mlmclm.train.run_lock import RunLock

    RunLock(folder).release()


def _checkpoint_json(folder):
    from mlmclm.train.checkpoint import _write_json_atomic

    _write_json_atomic(folder / "train_state.json", {"iteration": 3})


def _eval_record(folder):
    from mlmclm.eval.finetune.protocol import write_json_atomic

    write_json_atomic(folder / "lr0.0001_seed0.json", {"a": 1})


@pytest.mark.parametrize("write, old_temp_name", [
    (_shard, "shard-000000.tar.tmp"), (_tails, "tails.npz.tmp.npz"), (_status, "run_status.json.tmp"),
    # the id without the pid: one list of test ids from every collection (tools/test_ids.py compares them)
    (_metrics, "metrics.jsonl.tmp"), pytest.param(_lock, f".writer.lock.{os.getpid()}", id="_lock-.writer.lock.PID"),
    (_checkpoint_json, "train_state.json.tmp"), (_eval_record, "lr0.0001_seed0.json.tmp"),
])
def test_a_link_planted_at_the_old_temporary_name_is_not_followed(tmp_path, write, old_temp_name):
    """The old code opened the fixed name for writing and so wrote through the link into the victim."""
    folder = tmp_path / "shared"
    folder.mkdir()
    victim = _plant(folder, old_temp_name)
    write(folder)
    assert victim.read_text() == "precious\n"
    assert (folder / old_temp_name).is_symlink()   # left as it was, not written through


def test_the_written_files_read_back(tmp_path):
    from mlmclm.data.partition import TAILS_NAME

    _tails(tmp_path)
    with np.load(tmp_path / TAILS_NAME) as data:
        assert data["tokens"].tolist() == [1, 1, 1]
    _status(tmp_path)
    assert json.loads((tmp_path / "run_status.json").read_text())["step"] == 3


def test_a_manifest_is_no_more_open_than_the_umask_asks(tmp_path, umask):
    """It records the inputs and the command line: the old save forced 0644 under any umask."""
    from mlmclm.data.manifest import Manifest

    umask(0o077)
    path = Manifest(seq_length=4, num_samples=0, num_tokens=0, tokenizer={}, shards=[]).save(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
