"""Tokenizers: the embedded demo BPE (built from the embedded corpus at first use) and tokenizer identity.

The embedded tokenizer is a byte-level BPE with EuroBERT's special-token roles. It is trained by our own code,
deterministically, and cached under `$MLMCLM_CACHE` (default `~/.cache/mlmclm/`) in a directory named by a hash of
its training settings and of the corpus text. Build it (or print where it is) with:

    python -m mlmclm.data.tokenizer
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

BOS, EOS, MASK, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, MASK, PAD)  # ids 0..3 in the embedded tokenizer
EMBEDDED_VOCAB_SIZE = 8192
_FORMAT = 1  # bump when the training recipe below changes


def cache_root() -> Path:
    return Path(os.environ.get("MLMCLM_CACHE") or Path.home() / ".cache" / "mlmclm")


def _settings_key(texts: list[str], vocab_size: int) -> str:
    import tokenizers

    digest = hashlib.sha256()
    digest.update(json.dumps([_FORMAT, vocab_size, SPECIAL_TOKENS, tokenizers.__version__]).encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()[:12]


def train_bpe(texts: list[str], vocab_size: int, out_dir: Path) -> None:
    """Train a byte-level BPE on `texts` and save it as a Hugging Face fast-tokenizer directory in `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # Like EuroBERT's tokenizer: plain encode() wraps a text in BOS ... EOS.
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B {EOS}", special_tokens=[(BOS, bos_id), (EOS, eos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, mask_token=MASK, pad_token=PAD,
        model_max_length=1 << 20,
    )
    fast.save_pretrained(str(out_dir))


def embedded_tokenizer_dir(vocab_size: int = EMBEDDED_VOCAB_SIZE) -> Path:
    """The cached embedded tokenizer directory; trained from the embedded corpus if missing.

    Safe when several processes race: each builds in a temporary directory and renames it into place; a loser
    of the race discards its copy (the builds are identical).
    """
    from mlmclm.data.corpus import load_works

    texts = [work.text for work in load_works()]
    final = cache_root() / f"tokenizer-bpe{vocab_size}-{_settings_key(texts, vocab_size)}"
    if (final / "tokenizer.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        train_bpe(texts, vocab_size, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_tokenizer(name_or_path: str | os.PathLike):
    """A Hugging Face tokenizer by local path or hub name; "embedded" means the embedded demo tokenizer.

    A hub name is read from the local cache when it is there; otherwise the hub must answer. When it cannot be
    reached the error comes at once, not after the minute of retries `transformers` spends first."""
    from transformers import AutoTokenizer

    if str(name_or_path) == "embedded":
        name_or_path = embedded_tokenizer_dir()
    if not Path(name_or_path).exists():
        try:
            return AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True, trust_remote_code=False)
        except OSError:  # not cached: only the hub has it
            _check_hub_reachable(str(name_or_path))
    return AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)


def _check_hub_reachable(name: str, timeout: float = 5.0) -> None:
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    where = (f"tokenizer {name!r} is neither a local directory nor in the Hugging Face cache "
             f"({constants.HF_HUB_CACHE})")
    if constants.HF_HUB_OFFLINE:
        raise OSError(f"{where}, and HF_HUB_OFFLINE is set: pass a local tokenizer directory")
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
    except OSError as err:
        raise OSError(f"{where}, and the hub ({constants.ENDPOINT}) cannot be reached: {err}. Pass a local tokenizer "
                      f"directory, or fetch it where the hub is reachable (`hf download {name}`) and copy the "
                      f"cache") from None


def vocab_hash(tokenizer) -> str:
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def tokenizer_identity(tokenizer) -> dict:
    """What makes token ids comparable: compare `vocab_hash` (and the special ids), not `name`.

    A BERT-style tokenizer without BOS/EOS tokens (ModernBERT's: [CLS] opens, [SEP] closes) gives its CLS and SEP
    ids those roles: documents are then packed [CLS] … [SEP], as ModernBERT frames its inputs."""
    name = identity_name(str(getattr(tokenizer, "name_or_path", "") or ""))
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return {
        "name": name,
        "vocab_hash": vocab_hash(tokenizer),
        "vocab_size": len(tokenizer),
        "bos_id": bos if bos is not None else getattr(tokenizer, "cls_token_id", None),
        "eos_id": eos if eos is not None else getattr(tokenizer, "sep_token_id", None),
        "mask_id": tokenizer.mask_token_id,
        "pad_id": tokenizer.pad_token_id,
    }


def identity_name(name_or_path: str) -> str:
    """The `name` of a tokenizer's identity: a local directory's last part (a cache path differs between machines;
    its last part does not), else the name as given."""
    if name_or_path and Path(name_or_path).is_dir():
        return Path(name_or_path).name
    return name_or_path


SPECIAL_ROLES = ("bos_id", "eos_id", "mask_id", "pad_id")


def check_token_ids(identity: dict, where: str) -> None:
    """A tokenizer identity from others (a manifest's) is usable: `vocab_size` a positive integer, and each special
    id absent (None) or inside [0, vocab_size). Checked when data is opened, so a bad `mask_id` stops a run at its
    start, not when its MLM phase begins hours later (ValueError naming `where` and the field)."""
    vocab = identity.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"{where}: tokenizer.vocab_size {vocab!r} is not a positive integer: the token ids of its "
                         "data cannot be checked")
    for role in SPECIAL_ROLES:
        value = identity.get(role)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab):
            raise ValueError(f"{where}: tokenizer.{role} {value!r} is outside the vocabulary [0, {vocab}) "
                             "(tokenizer.vocab_size)")


def check_same_tokenizer(found: dict, expected: dict, where: str) -> None:
    """Raise if `found` (e.g. a manifest's tokenizer) is not `expected` (the model's)."""
    keys = ("vocab_hash", "vocab_size") + SPECIAL_ROLES
    diff = {k: (found.get(k), expected.get(k)) for k in keys if k in expected and found.get(k) != expected.get(k)}
    if diff:
        detail = ", ".join(f"{k}: {a!r} (data) != {b!r} (model)" for k, (a, b) in diff.items())
        raise ValueError(
            f"{where}: tokenizer mismatch between data ({found.get('name')!r}) and model "
            f"({expected.get('name')!r}): {detail}"
        )


if __name__ == "__main__":
    print(embedded_tokenizer_dir())
