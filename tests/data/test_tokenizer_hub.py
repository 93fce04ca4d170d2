"""A hub tokenizer that is not cached and cannot be fetched fails at once with a clear error (it took ~57 s of
`transformers`' retries). The hub here is a closed port on this machine (loopback only)."""
import time

import pytest


def test_an_unreachable_hub_fails_fast_and_says_what_to_do(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from mlmclm.data.tokenizer import load_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port here
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    started = time.monotonic()
    with pytest.raises(OSError, match=r"'someone/missing-tokenizer' is neither a local directory nor in the Hugging "
                                      r"Face cache .* the hub \(http://127\.0\.0\.1:9\) cannot be reached"):
        load_tokenizer("someone/missing-tokenizer")
    assert time.monotonic() - started < 10


def test_offline_mode_says_so(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from mlmclm.data.tokenizer import load_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(OSError, match="HF_HUB_OFFLINE is set: pass a local tokenizer directory"):
        load_tokenizer("someone/missing-tokenizer")
