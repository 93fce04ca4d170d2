"""prepare_data's raw inputs are files from others too: a document longer than the bound — a .txt file, a .jsonl line
with no end, a parquet value, a gzip bomb — is refused naming where it is, with memory held near the bound, never the
whole input. Real files (gzip, pyarrow parquet) read by mlmclm.data.sources."""
import gzip
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlmclm.data import sources
from mlmclm.data.sources import PrepareError, iter_documents


def _texts(path, max_chars):
    return [text for _, text in iter_documents([path], max_chars=max_chars)]


def test_documents_within_the_bound_are_read_as_before(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 100)
    (tmp_path / "b.jsonl").write_text('{"text": "short"}\n\n{"text": "' + "y" * 80 + '"}\n')
    assert _texts(tmp_path / "a.txt", 100) == ["x" * 100]
    assert _texts(tmp_path / "b.jsonl", 100) == ["short", "y" * 80]


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz"])
def test_a_txt_document_over_the_bound_is_refused(tmp_path, suffix):
    path = tmp_path / f"corpus{suffix}"
    data = ("z" * 101).encode()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(PrepareError, match=f"{path}: a document longer than 100 characters"):
        _texts(path, 100)


def test_a_jsonl_line_without_an_end_is_refused_without_reading_it_whole(tmp_path):
    """A gzip bomb: 64 MiB of one line, compressed to a few hundred KiB; the reader holds about the bound, not it."""
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"text": "ok"}\n{"text": "')
        for _ in range(64):
            f.write(b"a" * (1 << 20))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PrepareError, match=f"{path}:2: a document longer than 1,000,000 characters"):
            _texts(path, 1_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB for a 1 MB bound"


def test_a_parquet_value_over_the_bound_and_a_parquet_gzip_bomb_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["fine", "w" * 101]}), path)
    with pytest.raises(PrepareError, match=f"{path} row 1: a document longer than 100 characters"):
        _texts(path, 100)
    packed = tmp_path / "rows.parquet.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert _texts(packed, 1000) == ["fine", "w" * 101]
    monkeypatch.setattr(sources, "MAX_GZIP_PARQUET_BYTES", path.stat().st_size - 1)  # the bound, made small
    with pytest.raises(PrepareError, match="decompresses to more than"):
        _texts(packed, 1000)


def test_prepare_data_takes_the_bound_and_refuses_in_one_line(tmp_path, capsys):
    from tools.prepare_data import main

    (tmp_path / "big.txt").write_text("q" * 5000)
    out = tmp_path / "out"
    assert main(["--input", str(tmp_path / "big.txt"), "--output", str(out), "--seq-length", "16",
                 "--max-document-chars", "4096", "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a document longer than 4,096 characters" in err, err
    assert not (out / "manifest.json").exists()
