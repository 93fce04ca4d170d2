"""mlmclm.redact: credentials in data locations and commands become <redacted>; the rest stays readable."""
import logging

import pytest

from mlmclm.redact import REDACTED, RedactingFilter, install_log_redaction, redact, redact_tree

CASES = [
    ("https://alice:s3cr3t@data.example.com/fw/manifest.json", "https://<redacted>@data.example.com/fw/manifest.json"),
    ("pipe:curl -s -H 'Authorization: Bearer abc.def' https://h/x/manifest.json",
     "pipe:curl -s -H 'Authorization: <redacted>' https://h/x/manifest.json"),
    ('curl -H "X-Api-Key: k-123" https://h/m', 'curl -H "X-Api-Key: <redacted>" https://h/m'),
    ("https://b.s3.amazonaws.com/m.json?X-Amz-Credential=AKIA%2F&X-Amz-Signature=ab12&X-Amz-Expires=60",
     "https://b.s3.amazonaws.com/m.json?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&X-Amz-Expires=60"),
    ("https://a.blob.core.windows.net/c/manifest.json?sv=2022&sig=Zm9v%3D",
     "https://a.blob.core.windows.net/c/manifest.json?sv=2022&sig=<redacted>"),
    ("https://h/m.json?token=t0k&x=1", "https://h/m.json?token=<redacted>&x=1"),
    ("pipe:HF_TOKEN=hf_abcdefghijklmnopqrstuvwx cat m.json", "pipe:HF_TOKEN=<redacted> cat m.json"),
    ("using hf_abcdefghijklmnopqrstuvwx now", "using <redacted> now"),
    ("AWS_SECRET_ACCESS_KEY=wJalr aws s3 cp", "AWS_SECRET_ACCESS_KEY=<redacted> aws s3 cp"),
    ("hf download org/m --token abc123", "hf download org/m --token <redacted>"),
]
UNTOUCHED = ["/lustre/fineweb/manifest.json", "pipe:cat /data/manifest.json", "https://h/x/manifest.json?x=1",
             "TOKENIZERS_PARALLELISM=false", "tokenizer embedded, seed 1234", "user@example.com wrote it"]


@pytest.mark.parametrize("text, expected", CASES)
def test_credentials_are_redacted_and_the_rest_kept(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected   # idempotent


@pytest.mark.parametrize("text", UNTOUCHED)
def test_ordinary_locations_are_untouched(text):
    assert redact(text) == text


def test_trees_are_redacted_keys_included_and_left_unchanged():
    secret = "https://u:p@h/a/manifest.json"
    tree = {"data": {"path": secret, "blend": {secret: 1.0}, "seed": 3}, "phases": [{"data": {"path": secret}}]}
    cleaned = redact_tree(tree)
    assert "u:p" not in repr(cleaned) and cleaned["data"]["seed"] == 3 and REDACTED in cleaned["data"]["path"]
    assert tree["data"]["path"] == secret   # the run keeps the real value


def test_log_records_are_redacted_by_the_handlers(caplog):
    record = logging.LogRecord("mlmclm.data.loader", logging.WARNING, __file__, 1, "skipping %s: %s",
                               ("shard-1.tar", "pipe:curl -H 'Authorization: Bearer zzz' x"), None)
    assert RedactingFilter().filter(record) and record.getMessage() == \
        "skipping shard-1.tar: pipe:curl -H 'Authorization: <redacted>' x"
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        install_log_redaction()
        install_log_redaction()   # once per handler
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
    finally:
        root.removeHandler(handler)
