"""The files `sentence-transformers` reads beside a Hugging Face encoder directory, written without importing it, so
`SentenceTransformer(DIR).encode(...)` embeds as our retrieval evaluation does — with no code of ours and no remote
code: the model's own directory is the Transformer module (path ""), then mean (or last-token) pooling over the real
tokens, then L2 normalisation (cosine similarity = dot product).

The layout is the classic one every sentence-transformers release since v2 reads (module types under
`sentence_transformers.models.*`, pooling as `pooling_mode_*` flags, `max_seq_length` in sentence_bert_config.json,
the prompts in config_sentence_transformers.json), read in sentence-transformers 6.3.0: `base/model.py`
(`_load_sbert_model`, `_parse_model_config`), `base/modules/transformer.py` (max_seq_length becomes the tokenizer's
`model_max_length`; inputs are tokenized with the tokenizer's own special tokens, `truncation="longest_first"`,
padded), `sentence_transformer/modules/pooling.py` (`_LEGACY_POOLING_MODE_KWARGS`, the `word_embedding_dimension`
rename), `util/deprecated_import.py` (where 6.x maps the `models.*` names). `encode_query` / `encode_document` apply
the prompts named "query" and "document": the task prefixes our evaluation prepends ("Query: " / "Document: ").

An MLM export's weights hold the MLM head (`lm_head.*`) beside the encoder (`model.*`): loaded as the Transformer
module (`AutoModel`, the bare encoder) they made transformers print an `lm_head.weight UNEXPECTED` load report on
every `SentenceTransformer(DIR)`. Such a directory gets its encoder, without the head, as its own module folder
`0_Transformer/` (a second copy of the encoder's weights, its config and tokenizer), and the top folder stays the
MLM export `AutoModelForMaskedLM` loads. A directory holding an encoder alone (a kept retriever) stays the module."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlmclm.atomic_write import write_atomic

POOLINGS = ("mean", "lasttoken")  # mean: our evaluation's and EncodEval's default; lasttoken: EncodEval's "eos"
MODULES_FILE = "modules.json"
SENTENCE_TRANSFORMER_FILES = (MODULES_FILE, "sentence_bert_config.json", "config_sentence_transformers.json",
                              "1_Pooling/config.json", "2_Normalize")
ENCODER_FOLDER = "0_Transformer"  # sentence-transformers' own naming: index, then module type
ENCODER_PREFIX = "model."  # EuroBertForMaskedLM's encoder (its base_model_prefix); the rest is the MLM head
WEIGHT_INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 2**30


@dataclass(frozen=True)
class SentenceTransformerLayout:
    """How the directory embeds: prompts prepended to queries and documents, the length inputs are cut at, the
    pooling over real tokens. The defaults are the paper's retrieval prefixes and mean pooling; `max_seq_length`
    None takes the model's `max_position_embeddings` (what sentence-transformers, so EncodEval's evaluation, cuts
    at when a model says nothing)."""

    query_prompt: str = "Query: "
    document_prompt: str = "Document: "
    max_seq_length: int | None = None
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"sentence-transformers pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.max_seq_length is not None and (isinstance(self.max_seq_length, bool)
                                                or not isinstance(self.max_seq_length, int)
                                                or self.max_seq_length < 1):
            raise ValueError(f"max_seq_length must be an integer >= 1, got {self.max_seq_length!r}")
        for name in ("query_prompt", "document_prompt"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")


def _json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(payload, indent=2) + "\n")


def write_sentence_transformer_files(model_dir: Path, layout: SentenceTransformerLayout) -> Path:
    """Add the sentence-transformers files to the HF encoder directory `model_dir` (its config.json gives the
    hidden size and, by default, the length); returns `model_dir`. The Transformer module is the directory itself,
    or, when its weights hold an MLM head, the encoder's own folder (`write_encoder_module`)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("hidden_size", "max_position_embeddings"):
        if not isinstance(config.get(key), int):
            raise ValueError(f"{config_path}: {key} must be an integer, got {config.get(key)!r}")
    length = layout.max_seq_length or config["max_position_embeddings"]
    if length > config["max_position_embeddings"]:
        raise ValueError(f"max_seq_length {length} exceeds the model's max_position_embeddings "
                         f"{config['max_position_embeddings']} ({config_path})")
    module = write_encoder_module(model_dir, config)
    _json(model_dir / module / "sentence_bert_config.json", {"max_seq_length": length, "do_lower_case": False})
    _json(model_dir / MODULES_FILE, [
        {"idx": 0, "name": "0", "path": module, "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    _json(model_dir / "1_Pooling" / "config.json", {
        "word_embedding_dimension": config["hidden_size"],
        "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": layout.pooling == "mean",
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": layout.pooling == "lasttoken",
        "include_prompt": True})  # the prefix tokens are pooled too, as our evaluation pools them
    _json(model_dir / "2_Normalize" / "config.json", {})  # Normalize has no settings
    _json(model_dir / "config_sentence_transformers.json", {
        "model_type": "SentenceTransformer",
        "prompts": {"query": layout.query_prompt, "document": layout.document_prompt},
        "default_prompt_name": None, "similarity_fn_name": "cosine"})
    return model_dir


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / WEIGHT_INDEX
    if index.is_file():
        names = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        return [model_dir / name for name in dict.fromkeys(names)]
    return [model_dir / "model.safetensors"] if (model_dir / "model.safetensors").is_file() else []


def write_encoder_module(model_dir: Path, config: dict) -> str:
    """The Transformer module's path in `model_dir`: "" when its weights are an encoder alone, else
    ENCODER_FOLDER, written here with the encoder's tensors (prefix dropped, one tensor in memory at a time), a
    config naming the bare encoder class, and every other file of the directory (the tokenizer's)."""
    from safetensors import safe_open

    from mlmclm.convert.output import SafetensorsStreamWriter

    files = _weight_files(model_dir)
    plan = []  # (file, key, shape) of the encoder's tensors, in the export's order
    head = False
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():
                if not key.startswith(ENCODER_PREFIX):
                    head = True
                    continue
                plan.append((file, key, tuple(weights.get_slice(key).get_shape())))
    if not plan or not head:
        return ""
    target = model_dir / ENCODER_FOLDER
    target.mkdir()
    writer = None
    for file, key, _ in plan:
        with safe_open(str(file), framework="pt") as weights:
            tensor = weights.get_tensor(key)
        if writer is None:  # the export's dtype, kept
            writer = SafetensorsStreamWriter(target, [(k.removeprefix(ENCODER_PREFIX), shape) for _, k, shape in plan],
                                             tensor.dtype, MAX_SHARD_BYTES)
        writer.write(key.removeprefix(ENCODER_PREFIX), tensor)
    writer.close()
    architectures = [name.replace("ForMaskedLM", "Model") for name in config.get("architectures") or []]
    _json(target / "config.json", {**config, "architectures": architectures or None})
    skipped = {file.name for file in files} | {WEIGHT_INDEX, "config.json", "README.md"}
    for item in model_dir.iterdir():  # the tokenizer's files (and anything else but the weights and config)
        if item.is_file() and item.name not in skipped:
            shutil.copy2(item, target / item.name)
    return ENCODER_FOLDER
