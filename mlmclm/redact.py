"""Credentials kept out of what we record or print.

A dataset location may carry a secret: `pipe:curl -H 'Authorization: Bearer …' https://…/manifest.json`, a presigned
URL (`?X-Amz-Signature=…`, `?sig=…`, `?token=…`), a URL with user-info (`https://user:pass@host/…`), a Hugging Face
token (`hf_…`). The run uses the real value; every copy that is written down (run_config.json, TensorBoard's config
text, run_status.json, log lines, error messages) goes through `redact` first, which replaces each secret with
`<redacted>` and leaves the rest readable, so a person can still tell which location was meant.
"""
from __future__ import annotations

import logging
import re

REDACTED = "<redacted>"

# Query parameters whose value is a credential (presigned S3 / GCS / Azure SAS URLs, API keys, tokens).
_SECRET_QUERY_KEYS = (r"x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential|"
                      r"sig|signature|token|access_token|api_key|apikey|key|password|secret|credential|auth")
_PATTERNS = (
    # scheme://user:password@host → scheme://<redacted>@host (any user-info: a bare token is a secret too)
    (re.compile(r"(?P<keep>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@"), lambda m: f"{m['keep']}{REDACTED}@"),
    # Authorization / Proxy-Authorization / X-Api-Key / Cookie headers: the whole value up to the quote or line end
    (re.compile(r"(?P<keep>\b(?:proxy-)?authorization\s*:\s*|\bx-api-key\s*:\s*|\bcookie\s*:\s*)[^'\"\n]+", re.I),
     lambda m: f"{m['keep']}{REDACTED}"),
    (re.compile(rf"(?P<keep>[?&;](?:{_SECRET_QUERY_KEYS})=)[^&#\s'\"]+", re.I), lambda m: f"{m['keep']}{REDACTED}"),
    # Hugging Face user access tokens
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), lambda m: REDACTED),
    # Environment-style assignments whose name has a secret word as one of its parts: HF_TOKEN=…,
    # AWS_SECRET_ACCESS_KEY=…, DB_PASSWORD=… (not TOKENIZERS_PARALLELISM=…); then --token …
    (re.compile(r"(?P<keep>\b(?:[A-Z0-9]+_)*(?:TOKENS?|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY)(?:_[A-Z0-9]+)*=)\S+"),
     lambda m: f"{m['keep']}{REDACTED}"),
    (re.compile(r"(?P<keep>--(?:token|password|secret|api-key)[= ])\S+", re.I), lambda m: f"{m['keep']}{REDACTED}"),
)


def redact(text: str) -> str:
    """`text` with every credential-looking part replaced by `<redacted>`."""
    if not isinstance(text, str) or not text:
        return text
    for pattern, replace in _PATTERNS:
        text = pattern.sub(replace, text)
    return text


def redact_tree(value):
    """A copy of a JSON-like tree (dicts, lists, strings) with every string redacted, keys too (a blend's weights
    are keyed by their datasets' locations)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_tree(key): redact_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(item) for item in value]
    return value


class RedactingFilter(logging.Filter):
    """Redacts each record's final message (its arguments merged in), whichever logger made it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_log_redaction() -> None:
    """Redact what every handler of the root logger writes (call after `logging.basicConfig`). Handler filters see
    every record that reaches them, also those of other libraries' loggers (a shard's URL in a loader warning)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
