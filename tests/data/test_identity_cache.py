"""A training rank checks its data's tokenizer against the config's from the tokenizer-identity cache: the same
answer as loading the tokenizer, without importing `transformers` once a process has computed it; a changed file is
a new answer; an entry that is not a well-formed identity, or a directory the cache cannot key, loads as before."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.data import identity_cache
from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tokenizer(tmp_path, tok_dir, monkeypatch):
    """A copy of the session's small BPE (so that its files can change) and an empty cache."""
    monkeypatch.setenv("MLMCLM_CACHE", str(tmp_path / "cache"))
    return Path(shutil.copytree(tok_dir, tmp_path / "small-bpe"))


def _loaded(path) -> dict:
    return tokenizer_identity(load_tokenizer(str(path)))


def _entries(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / "tokenizer-identity").glob("*.json"))


def test_a_later_process_reads_the_same_identity_without_importing_transformers(tokenizer, tmp_path):
    first = identity_cache.cached_tokenizer_identity(str(tokenizer))
    assert first == _loaded(tokenizer) and first["name"] == "small-bpe"
    (entry,) = _entries(tmp_path)
    assert "name" not in json.loads(entry.read_text())  # the name comes from the path asked for, not the cache
    for spelling in (f"{tokenizer}/", str(tokenizer.parent / "." / tokenizer.name)):
        assert identity_cache.cached_tokenizer_identity(spelling) == _loaded(spelling), spelling
    # what a rank runs: the data check's identity, in a fresh process
    code = ("import json, sys; from mlmclm.train.data_fit import _tokenizer_identity; "
            "print(json.dumps([_tokenizer_identity(sys.argv[1]), 'transformers' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tokenizer)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    identity, imported = json.loads(proc.stdout.splitlines()[-1])
    assert identity == first and imported is False


def test_a_changed_file_is_a_new_answer_not_a_stale_one(tokenizer, tmp_path, monkeypatch):
    before = identity_cache.cached_tokenizer_identity(str(tokenizer))
    config = tokenizer / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "pad_token": settings["eos_token"]}))
    after = identity_cache.cached_tokenizer_identity(str(tokenizer))
    assert after == _loaded(tokenizer) and after["pad_id"] == before["eos_id"] != before["pad_id"]
    assert len(_entries(tmp_path)) == 2
    # a file over the hashed size (a model's weights beside its tokenizer) counts by its size and time
    monkeypatch.setattr(identity_cache, "HASHED_FILE_LIMIT", 16)
    (tokenizer / "model.safetensors").write_bytes(b"x" * 64)
    key = identity_cache.directory_key(tokenizer)
    os.utime(tokenizer / "model.safetensors", ns=(1, 1))
    assert identity_cache.directory_key(tokenizer) != key


@pytest.mark.parametrize("entry", ["not json", json.dumps({"vocab_hash": "a", "vocab_size": 10}),
                                   "fifo", "mask beyond the vocabulary"])
def test_an_entry_that_is_not_a_well_formed_identity_is_computed_again(tokenizer, tmp_path, entry):
    identity_cache.cached_tokenizer_identity(str(tokenizer))
    (path,) = _entries(tmp_path)
    good = json.loads(path.read_text())
    path.unlink()
    if entry == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif entry == "mask beyond the vocabulary":
        path.write_text(json.dumps({**good, "mask_id": good["vocab_size"]}))
    else:
        path.write_text(entry)
    assert identity_cache.cached_tokenizer_identity(str(tokenizer)) == _loaded(tokenizer)
    assert json.loads(path.read_text()) == good  # replaced by the loaded answer


def test_a_directory_the_cache_cannot_key_loads_the_tokenizer(tokenizer, tmp_path):
    os.mkfifo(tokenizer / "notes")
    assert identity_cache.directory_key(tokenizer) is None
    assert identity_cache.cached_tokenizer_identity(str(tokenizer)) == _loaded(tokenizer)
    assert _entries(tmp_path) == []


def test_a_cache_folder_that_cannot_be_written_still_gives_the_identity(tokenizer, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("MLMCLM_CACHE", str(blocked))
    assert identity_cache.cached_tokenizer_identity(str(tokenizer)) == _loaded(tokenizer)
    assert blocked.read_text() == "a file where the cache folder would be"
