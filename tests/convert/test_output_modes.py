"""An export is no more open than the user's umask asks: the old code forced its folder to 0755."""
import os
import stat

from test_weight_index import _sharded_llama

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf


def test_the_output_folder_follows_the_umask(tmp_path):
    src, _ = _sharded_llama(tmp_path / "src")
    saved = os.umask(0o077)
    try:
        out = tmp_path / "out"
        convert_from_hf(ImportConfig(str(src), out, progress=False))
    finally:
        os.umask(saved)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    opened = [p for p in out.rglob("*") if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert opened == []
