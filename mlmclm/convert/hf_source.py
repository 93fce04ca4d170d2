"""Read a Hugging Face model directory safely: config via transformers (no remote code), tensors lazily via
safetensors (or `torch.load(weights_only=True)` for legacy .bin files), one tensor at a time."""
from __future__ import annotations

from pathlib import Path

import torch

from mlmclm.bounded_read import FileRefusedError, check_regular_file, read_regular_json
from mlmclm.convert.architecture_config import model_config_from_hf
from mlmclm.convert.hf_config import SourceModel, UnsupportedModelError
from mlmclm.pickled_weights import load_plain_tensors

INDEX_NAME = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old Llama checkpoints saved; recomputed anyway


class SourceError(ValueError):
    pass


def resolve_source(source: str) -> Path:
    """A local directory as is; otherwise a hub name, downloaded (config, tokenizer, weights) when online."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or source.startswith((".", "/")) or source.count("/") != 1:
        raise SourceError(f"{source}: not a model directory (and not a hub name like 'org/model')")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "tokenizer*",
                                                              "*.model", "*.txt"]))
    except Exception as err:
        raise SourceError(f"{source}: no such local directory, and downloading it from the hub failed: "
                          f"{type(err).__name__}: {err}") from err


def _indexed_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> its file, from the sharded checkpoint's index (read bounded). Every file it names must be a
    plain relative name inside `directory` (the index is someone else's: `../x` or `/etc/x` would read elsewhere)."""
    index_path = directory / INDEX_NAME
    try:
        index = read_regular_json(index_path, what="weight index")
    except ValueError as err:   # refused (FIFO, too large) or not JSON
        raise SourceError(str(err) if isinstance(err, FileRefusedError) else f"{index_path}: not JSON: {err}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise SourceError(f"{index_path}: no 'weight_map' object")
    files = {}
    for name, file in weight_map.items():
        parts = file.split("/") if isinstance(file, str) else []
        if not parts or file.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            raise SourceError(f"{index_path}: weight_map[{name!r}] names {file!r}, not a file inside {directory} "
                              "(an absolute path or '..' is refused)")
        files[name] = directory / file
    return files


class HFWeights:
    """Tensors of an HF checkpoint by name; names of a headless base model get the `model.` prefix."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._files: dict[str, Path] = {}
        if (self.directory / INDEX_NAME).exists():
            self._files = _indexed_files(self.directory)
        elif (self.directory / "model.safetensors").exists():
            from safetensors import safe_open

            with safe_open(str(self.directory / "model.safetensors"), framework="pt") as f:
                self._files = {k: self.directory / "model.safetensors" for k in f.keys()}
        elif (self.directory / "pytorch_model.bin").exists():
            self._files = {k: self.directory / "pytorch_model.bin" for k in self._bin(self.directory /
                                                                                       "pytorch_model.bin")}
        else:
            raise SourceError(f"{self.directory}: no model.safetensors(.index.json) or pytorch_model.bin")
        missing = {p for p in self._files.values() if not p.exists()}
        if missing:
            raise SourceError(f"{self.directory}: weight files listed in the index are missing: "
                              f"{sorted(p.name for p in missing)}")
        for path in set(self._files.values()):   # a FIFO would block the reader (links are followed: hub caches)
            try:
                check_regular_file(path, "weight file")
            except FileRefusedError as err:
                raise SourceError(str(err)) from None
        if "model.embed_tokens.weight" not in self._files and "embed_tokens.weight" in self._files:
            self._files = {f"model.{k}": v for k, v in self._files.items()}
        self._bins: dict[Path, dict] = {}

    @staticmethod
    def _bin(path: Path) -> dict:
        # plain tensors only, never arbitrary pickled objects; a refusal is one line (pickled_weights.py)
        return load_plain_tensors(path)

    def names(self) -> list[str]:
        return list(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def get(self, name: str) -> torch.Tensor:
        if name not in self._files:
            raise SourceError(f"{self.directory}: tensor {name!r} is missing")
        path = self._files[name]
        if path.suffix == ".bin":
            state = self._bins.setdefault(path, self._bin(path))
            return state[name if name in state else name.removeprefix("model.")]
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            raw = name if name in f.keys() else name.removeprefix("model.")
            return f.get_tensor(raw)

    def shape(self, name: str) -> tuple[int, ...]:
        path = self._files[name]
        if path.suffix == ".bin":
            return tuple(self.get(name).shape)
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            raw = name if name in f.keys() else name.removeprefix("model.")
            return tuple(f.get_slice(raw).get_shape())


def load_source(directory: Path, make_vocab_divisible_by: int = 128) -> tuple[SourceModel, HFWeights, list[str]]:
    """The source's model config and weights, checked; also the tensor names that will be ignored."""
    from transformers import AutoConfig

    if not (directory / "config.json").exists():
        raise SourceError(f"{directory}: no config.json (not a Hugging Face model directory)")
    try:
        hf_config = AutoConfig.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as err:
        raise SourceError(f"{directory}/config.json cannot be read by transformers without remote code: "
                          f"{type(err).__name__}: {err}") from err
    source = model_config_from_hf(hf_config, directory.name, make_vocab_divisible_by)
    weights = HFWeights(directory)
    from mlmclm.model.architectures import mapping_table
    from mlmclm.model.hf_mapping import iter_mappings

    table = mapping_table(source.model)
    wanted = {h for _, hs, _ in iter_mappings(source.model.num_layers, table) for h in hs}
    biases = sorted(n for n in weights.names() if n.endswith(".bias") and n not in wanted)
    if biases:
        raise UnsupportedModelError(f"{directory}: attention/MLP biases are not supported (our blocks have no linear "
                                    f"biases); found {len(biases)} bias tensors, e.g. {biases[0]}")
    if source.tied_embeddings:
        wanted.discard("lm_head.weight")
    missing = sorted(wanted - set(weights.names()))
    if missing:
        hint = " (a base model without an LM head?)" if missing in (["lm_head.weight"], ["decoder.bias"]) else ""
        raise SourceError(f"{directory}: {len(missing)} tensors are missing, e.g. {missing[:3]}{hint}")
    embedding = next(hs[0] for name, hs, _ in iter_mappings(source.model.num_layers, table)
                     if name == "embedding.word_embeddings.weight")
    rows = weights.shape(embedding)[0]
    if rows != source.model.vocab_size:
        raise SourceError(f"{directory}: {embedding} has {rows} rows but config vocab_size is "
                          f"{source.model.vocab_size}")
    # a tied decoder's weight, when a file carries it, is the embedding: not read
    ignored = sorted(n for n in set(weights.names()) - wanted - {"lm_head.weight", "decoder.weight"}
                     if not n.endswith(_IGNORED_SUFFIXES))
    return source, weights, ignored
