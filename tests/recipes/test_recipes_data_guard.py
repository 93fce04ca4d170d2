"""A recipe's data_path is never invented nor written into unless asked: the embedded corpus is packed only at the
tiny recipes' own default path or with --prepare-data, and a non-empty directory that is not a dataset is refused."""
import pytest

from recipes import launch
from recipes.__main__ import main


def _tiny(data_path, tmp_path):
    partial, _ = launch.build("tiny_clm_mlm", [f"data_path={data_path}", f"run_dir={tmp_path / 'run'}"])
    return partial


def test_missing_data_path_is_refused_not_prepared(tmp_path, capsys):
    missing = tmp_path / "typo_data"
    with pytest.raises(ValueError, match="typo_data does not exist.*--prepare-data"):
        launch.prepare_local_data(["tiny_clm_mlm"], [_tiny(missing, tmp_path)])
    assert not missing.exists()

    rc = main(["tiny_clm_mlm", f"data_path={missing}", f"run_dir={tmp_path / 'run'}"])
    assert rc == 2
    assert f"data_path {missing} does not exist" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "run").exists()


def test_a_users_directory_is_never_written_into(tmp_path, capsys):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "shard-000000.tar").write_bytes(b"the user's own file")
    with pytest.raises(ValueError, match="mine is a non-empty directory that is not a dataset"):
        launch.prepare_local_data(["tiny_clm_mlm"], [_tiny(users, tmp_path)])
    with pytest.raises(ValueError, match="mine is not empty and not a dataset"):  # not even when asked to prepare
        launch.prepare_local_data(["tiny_clm_mlm"], [_tiny(users, tmp_path)], prepare=True)
    rc = main(["tiny_clm_mlm", f"data_path={users}", f"run_dir={tmp_path / 'run'}", "--prepare-data"])
    assert rc == 2
    assert str(users) in capsys.readouterr().err
    assert [p.name for p in users.iterdir()] == ["shard-000000.tar"]
    assert (users / "shard-000000.tar").read_bytes() == b"the user's own file"


def test_prepare_data_packs_the_embedded_corpus_when_asked(tmp_path, tiny_data):
    target = tmp_path / "asked"
    launch.prepare_local_data(["tiny_clm_mlm"], [_tiny(target, tmp_path)], prepare=True)
    assert (target / "manifest.json").exists()
    # An existing dataset is used as it is, with or without the flag.
    before = (target / "manifest.json").stat().st_mtime_ns
    launch.prepare_local_data(["tiny_clm_mlm", "tiny_mlm"], [_tiny(target, tmp_path), _tiny(tiny_data, tmp_path)])
    assert (target / "manifest.json").stat().st_mtime_ns == before
