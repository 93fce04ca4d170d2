"""Each phase's data fits the model that phase trains: vocabulary, context, sequence-parallel split, mask token and
the tokenizer the config names. Checked on every rank before the model is built."""
from __future__ import annotations

import functools

from mlmclm.data.manifest import Manifest
from mlmclm.train.config import TrainConfig


def check_data_fits_model(cfg: TrainConfig, manifest: Manifest, phase: int = 0, model=None) -> None:
    """Phase `phase`'s data (`manifest`) fits the model that phase trains (`model`: its θ and context)."""
    tok = manifest.tokenizer
    model = model or cfg.model
    data = cfg.phase_data()[phase]
    if tok.get("vocab_size", 0) > cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size {cfg.model.vocab_size} is smaller than the data's tokenizer vocabulary "
                         f"{tok.get('vocab_size')} ({manifest.location})")
    if data.random_length is None and manifest.seq_length > model.max_position_embeddings:
        raise ValueError(f"data seq_length {manifest.seq_length} ({manifest.location}, phase {phase}) exceeds the "
                         f"max_position_embeddings {model.max_position_embeddings} of that phase "
                         f"(model.max_position_embeddings, or raise it with phases[{phase}].max_position_embeddings)")
    raised = cfg.phases[phase].max_position_embeddings
    longest = manifest.seq_length if data.random_length is None else data.random_length.max_length
    if raised is not None and longest < raised:
        source = (f"the rows of {manifest.location}" if data.random_length is None
                  else "its data.random_length.max_length")
        raise ValueError(f"phases[{phase}].max_position_embeddings {raised}: the phase's longest sample is {longest} "
                         f"tokens ({source}), so the context it claims would never be trained; give the phase data "
                         f"of that length")
    if cfg.parallel.sequence_parallel and data.random_length is None and \
            manifest.seq_length % cfg.parallel.tensor_parallel:
        raise ValueError(f"sequence parallelism needs seq_length {manifest.seq_length} divisible by "
                         f"tensor_parallel {cfg.parallel.tensor_parallel}")
    if any(p.objective.kind == "mlm" for p in cfg.phases) and tok.get("mask_id") is None:
        raise ValueError(f"an MLM phase needs a mask token, but the data's tokenizer {tok.get('name')!r} has none")
    tokenizer = data.tokenizer or cfg.data.tokenizer
    if tokenizer is not None:
        from mlmclm.data.tokenizer import check_same_tokenizer

        check_same_tokenizer(tok, _tokenizer_identity(tokenizer), where=manifest.location)


@functools.lru_cache(maxsize=None)
def _tokenizer_identity(name: str) -> dict:
    """The identity of the tokenizer a config names, once per process (each phase's data checks it); a local
    directory's from the tokenizer-identity cache, so that a rank need not import `transformers` for it."""
    from mlmclm.data.identity_cache import cached_tokenizer_identity

    return cached_tokenizer_identity(name)
