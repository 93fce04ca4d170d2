"""Hugging Face EuroBERT, ModernBERT or Llama-family model → megatron dist checkpoint at a chosen TP/PP(/VPP) layout.

The result is a run-shaped directory (`OUTPUT/checkpoints/iter_0000000/` + `latest_checkpointed_iteration.txt`)
that `checkpoint.init_from: OUTPUT` (continued pretraining) and `convert_to_hf` accept. Its `run_config.json` holds
the model shape (`model`, what init_from checks) and the provenance (`converted_from`); it is not a full
TrainConfig (there is no data or schedule to record). Writing a TP×PP-sharded checkpoint takes TP×PP processes.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mlmclm.convert.hf_source import SourceError, load_source, resolve_source
from mlmclm.convert.output import check_output, dir_size, staged_output
from mlmclm.convert.remote_code_hooks import strip_remote_code_hooks
from mlmclm.convert.to_hf import TOKENIZER_SUBDIR
from mlmclm.data.tokenizer import tokenizer_identity
from mlmclm.model.config import ModelConfig
from mlmclm.output_apart import check_output_apart
from mlmclm.parallel.launch import spawn
from mlmclm.parallel.runtime import ParallelConfig
from mlmclm.train import checkpoint as ckpt

ITERATION = 0
log = logging.getLogger(__name__)


@dataclass
class ImportConfig:
    source: str  # local HF model directory (or a hub name, when online)
    output: Path  # becomes a run-shaped directory holding one checkpoint
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    virtual_pipeline_parallel: int | None = None
    dtype: str = "fp32"  # parameter dtype saved: "fp32" | "bf16"
    make_vocab_divisible_by: int = 128
    force: bool = False
    progress: bool = True

    def __post_init__(self):
        self.output = Path(self.output)
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype must be fp32 or bf16, got {self.dtype!r}")

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(tensor_parallel=self.tensor_parallel, pipeline_parallel=self.pipeline_parallel,
                              virtual_pipeline_parallel=self.virtual_pipeline_parallel)


@dataclass
class ImportSummary:
    source: str
    output: str
    checkpoint: str
    model_type: str
    num_parameters: int
    dtype: str
    layout: dict
    seconds: float
    output_bytes: int
    ignored_tensors: list[str] = field(default_factory=list)
    tokenizer: str | None = None

    def text(self) -> str:
        lines = [f"converted {self.source} ({self.model_type})", f"  -> {self.checkpoint}",
                 f"  parameters: {self.num_parameters:,}  dtype: {self.dtype}  layout: {self.layout}",
                 f"  tokenizer: {self.tokenizer or 'none found in the source'}",
                 f"  output size: {self.output_bytes / 2**20:.1f} MiB  time: {self.seconds:.1f} s"]
        if self.ignored_tensors:
            lines.append(f"  ignored tensors: {self.ignored_tensors}")
        return "\n".join(lines)


@torch.no_grad()
def load_streaming(chunks, get_hf, model: ModelConfig, tied: bool, progress: bool) -> int:
    """Fill this rank's chunks from HF tensors, one full tensor at a time; returns the parameters loaded.

    Driven by the mapping's order (not the chunks'), so each full tensor is built once; HF tensors this rank does
    not hold are stood in for by meta tensors and never read. A tied copy this rank holds (ModernBERT's decoder
    weight on a last pipeline stage: `Architecture.tied`) is filled from the tensor it copies.
    """
    from megatron.core import parallel_state
    from tqdm import tqdm

    from mlmclm.model.architectures import architecture, split_of
    from mlmclm.model.hf_mapping import hf_to_megatron, iter_mappings, shard
    from mlmclm.model.weights import named_parameters_global

    arch = architecture(model)
    params = dict(named_parameters_global(chunks))
    copies = {source: copy for copy, source in arch.tied.items() if copy in params}
    needed = {h for name, hf_names, _ in iter_mappings(model.num_layers, arch.mappings)
              if name in params or name in copies for h in hf_names}

    def get(name: str) -> torch.Tensor:
        # Untie: the LM head starts as a copy of the input embedding.
        source = "model.embed_tokens.weight" if tied and name == "lm_head.weight" else name
        if name in needed:
            return get_hf(source)
        return torch.empty(get_hf.shape(source), device="meta")

    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    loaded = 0
    total = sum(1 for _ in iter_mappings(model.num_layers, arch.mappings))
    stream = hf_to_megatron(get, model, model.padded_vocab_size(tp_size), arch.mappings)
    for name, full in tqdm(stream, total=total, desc="import", unit="tensor", disable=not progress):
        for target in (name, copies.get(name)):
            param = params.pop(target, None) if target is not None else None
            if param is None:
                continue
            piece = shard(full, split_of(target), tp_size, tp_rank)
            if piece.shape != param.shape:
                raise ValueError(f"{target}: expected a TP slice of shape {tuple(param.shape)}, got "
                                 f"{tuple(piece.shape)}")
            param.copy_(piece.to(param.dtype))
            loaded += param.numel()
    if params:
        raise ValueError(f"parameters not filled from the source: {sorted(params)[:5]}")
    return loaded


class _Getter:
    """An HF tensor getter that also answers shapes without reading data."""

    def __init__(self, weights):
        self.weights = weights

    def __call__(self, name: str) -> torch.Tensor:
        return self.weights.get(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.weights.shape(name)


def _write_worker(source_dir: str, model_dict: dict, parallel_dict: dict, dtype: str, tied: bool, iter_dir: str,
                  progress: bool) -> None:
    import torch.distributed as dist

    from mlmclm.convert.hf_source import HFWeights
    from mlmclm.model import build_model
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.parallel import destroy_parallel, init_parallel

    parallel = ParallelConfig(**parallel_dict)
    init_parallel(parallel, seed=0)
    try:
        model = ModelConfig.from_dict(model_dict)
        chunks = build_model(model, parallel, PrecisionConfig(dtype=dtype), causal=False, use_te=False)
        rank0 = dist.get_rank() == 0
        load_streaming(chunks, _Getter(HFWeights(Path(source_dir))), model, tied, progress and rank0)
        # The same sharded state dict training saves (model part), so load_weights/init_from read it at any layout.
        ckpt.save_sharded(ckpt.model_sharded_state_dict(chunks), iter_dir)
        dist.barrier()
    finally:
        destroy_parallel()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_source_tokenizer(directory: Path):
    """The source's tokenizer (loaded without remote code), or None when the directory ships none.

    No tokenizer files is legitimate (weights-only repositories exist; `init_from` reads only the weights and
    convert_to_hf takes --tokenizer), so it is a warning. Tokenizer files that do not load are an error: carrying
    on would silently drop the tokenizer the user expects to travel with the checkpoint (and its identity check).
    """
    present = [f for f in TOKENIZER_FILES if (directory / f).exists()]
    if not present:
        log.warning("%s has no tokenizer (none of %s): the checkpoint is written without one; pass --tokenizer to "
                    "convert_to_hf when exporting it", directory, ", ".join(TOKENIZER_FILES))
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as err:
        raise SourceError(f"{directory}: the tokenizer ({', '.join(present)}) cannot be loaded without remote code: "
                          f"{type(err).__name__}: {err}") from err


def convert_from_hf(cfg: ImportConfig) -> ImportSummary:
    start = time.time()
    check_output(cfg.output, cfg.force)
    directory = resolve_source(cfg.source)
    check_output_apart(cfg.output, {"source": directory})  # before anything is read or the output replaced
    source, weights, ignored = load_source(directory, cfg.make_vocab_divisible_by)
    model = source.model
    model.validate_layout(cfg.parallel)
    tokenizer = load_source_tokenizer(directory)  # before the (long) weight conversion: fail fast
    world = cfg.tensor_parallel * cfg.pipeline_parallel
    provenance = {"source": str(cfg.source), "resolved_path": str(directory.absolute()),
                  "model_type": source.model_type,
                  "tied_embeddings_untied": source.tied_embeddings and not _tied(model),
                  "source_dtype": source.dtype, "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "tool": "mlmclm.convert.from_hf"}
    with staged_output(cfg.output, cfg.force) as staging:
        root = staging / "checkpoints"
        iter_dir = ckpt.iteration_dir(root, ITERATION)
        iter_dir.mkdir(parents=True)
        spawn(_write_worker, world, str(directory), model.to_dict(), asdict(cfg.parallel), cfg.dtype,
              source.tied_embeddings, str(iter_dir), cfg.progress)
        identity = tok_class = None
        if tokenizer is not None:
            tokenizer.save_pretrained(str(iter_dir / TOKENIZER_SUBDIR))
            strip_remote_code_hooks(iter_dir / TOKENIZER_SUBDIR)  # the source's auto_map comes back out of the save
            identity, tok_class = tokenizer_identity(tokenizer), tokenizer.__class__.__name__
        final_tok = cfg.output.absolute() / "checkpoints" / iter_dir.name / TOKENIZER_SUBDIR
        run_config = {"model": model.to_dict(), "parallel": asdict(cfg.parallel), "precision": {"dtype": cfg.dtype},
                      "data": {"tokenizer": str(final_tok) if identity else None},
                      "run_dir": str(cfg.output.absolute()), "converted_from": provenance}
        train_state = {"iteration": ITERATION, "consumed_tokens": 0, "phase_index": None, "phase_name": None,
                       "tokenizer": identity, "seq_length": None, "converted_from": provenance,
                       "layout": {"tp": cfg.tensor_parallel, "pp": cfg.pipeline_parallel, "dp": 1,
                                  "vpp": cfg.virtual_pipeline_parallel}}
        (iter_dir / ckpt.RUN_CONFIG).write_text(json.dumps(run_config, indent=2, sort_keys=True))
        (iter_dir / ckpt.TRAIN_STATE).write_text(json.dumps(train_state, indent=2, sort_keys=True))
        (root / ckpt.LATEST_FILE).write_text(str(ITERATION))
        size = dir_size(staging)
    # Every HF tensor once, plus an untied LM head (a copy of the embedding when the source tied them).
    num_params = sum(int(torch.Size(weights.shape(n)).numel()) for n in _hf_names(model))
    if not _tied(model):
        num_params += model.vocab_size * model.hidden_size
    return ImportSummary(
        source=str(cfg.source), output=str(cfg.output), checkpoint=str(cfg.output / "checkpoints" / iter_dir.name),
        model_type=source.model_type, num_parameters=num_params, dtype=cfg.dtype,
        layout={"tp": cfg.tensor_parallel, "pp": cfg.pipeline_parallel, "vpp": cfg.virtual_pipeline_parallel},
        seconds=time.time() - start, output_bytes=size, ignored_tensors=ignored,
        tokenizer=tok_class)


def _hf_names(model: ModelConfig) -> list[str]:
    from mlmclm.model.architectures import mapping_table
    from mlmclm.model.hf_mapping import iter_mappings

    return [h for _, hs, _ in iter_mappings(model.num_layers, mapping_table(model)) for h in hs
            if h != "lm_head.weight"]


def _tied(model: ModelConfig) -> bool:
    from mlmclm.model.architectures import architecture

    return architecture(model).tied_embeddings
