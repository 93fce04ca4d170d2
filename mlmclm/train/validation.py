"""Held-out loss during pretraining: the CLM loss and the MLM loss at a reference mask ratio, whatever the run trains.

Training losses do not compare across objectives or mask ratios (20 % and 50 % masking are different tasks), and a
CLM model's MLM ability is otherwise invisible until fine-tuning. So every evaluation measures both on the same
held-out samples: the first `validation.samples` of the split `prepare_data` holds out (its manifest records it),
cut into samples exactly as training's (fixed rows, or random-length samples with per-sample attention), MLM masks
at `validation.mask_ratio` keyed on the split's sample indices. The batches are made once, on the host, at start:
every evaluation (and every resume, and every layout: each DP rank takes its slice of the same samples) sees the
same tokens and masks. Each objective is one forward-only pass of megatron's schedule with the attention switched
to that objective's, then switched back; losses are token sums reduced over DP and divided by the count, as in
training, so they agree across layouts to float rounding.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from mlmclm.data.blend import build_loader
from mlmclm.data.manifest import Manifest
from mlmclm.data.random_length import sample_lengths
from mlmclm.model import set_causal
from mlmclm.model.document_attention import attention_layout
from mlmclm.model.sparse_head import flat_positions
from mlmclm.objectives import ObjectiveConfig, objective_for_tokenizer
from mlmclm.parallel import to_device
from mlmclm.train.config import TrainConfig
from mlmclm.train.optim import params_in_sync
from mlmclm.train.step import forward_backward

log = logging.getLogger("mlmclm.train")


def validation_path(cfg: TrainConfig, manifest: Manifest) -> str | None:
    """The held-out dataset to evaluate on, or None when validation is off (a ValueError naming the field when it
    is asked for and there is none)."""
    val = cfg.validation
    if val.enabled is False:
        return None
    if val.path is not None:
        return val.path
    recorded = getattr(manifest, "validation", None)
    if recorded:
        return manifest.shard_url(recorded["path"])
    if val.enabled:
        raise ValueError(f"validation.enabled is true but {manifest.location or 'the data'} records no validation "
                         "split: prepare the data with --validation-every K, or give validation.path")
    return None


class Validator:
    def __init__(self, cfg: TrainConfig, path: str, tokenizer: dict, dp_rank: int, dp_size: int, device,
                 pad_multiple: int, same_length: bool):
        self.cfg, self.device = cfg, device
        samples = cfg.validation.samples or cfg.global_batch_size
        if samples % (cfg.micro_batch_size * dp_size):
            raise ValueError(f"validation.samples {samples} is not a multiple of micro_batch_size "
                             f"{cfg.micro_batch_size} x data-parallel size {dp_size}")
        data = replace(cfg.data, path=path, blend=None)
        loader = build_loader(data, samples, cfg.micro_batch_size, dp_rank, dp_size, expected_tokenizer=tokenizer,
                              pad_multiple=pad_multiple, same_length=same_length)
        try:
            available = loader.manifest.num_samples if data.random_length is None else loader.manifest.num_tokens
            wanted = samples if data.random_length is None else int(
                sample_lengths(data.seed, 0, samples, data.random_length).sum())
            if wanted > available:
                unit = "samples" if data.random_length is None else "tokens"
                raise ValueError(f"validation.samples {samples} needs {wanted} {unit}, but the validation split "
                                 f"{loader.manifest.location} holds {available}: lower validation.samples or hold "
                                 f"out more documents")
            micro = loader.next_global_batch()
        finally:
            loader.close()
        self.samples = samples
        self.layouts = None
        if data.random_length is not None or cfg.per_document_attention:
            self.layouts = [attention_layout(mb, cfg.per_document_attention) for mb in micro]
        references = {"clm": ObjectiveConfig("clm"),
                      "mlm": ObjectiveConfig("mlm", mask_ratio=cfg.validation.mask_ratio, mask_mode="mask_only")}
        self.batches = {}
        for kind, objective_cfg in references.items():
            objective = objective_for_tokenizer(objective_cfg, tokenizer, cfg.seed)
            batches = [objective.prepare(mb["tokens"], mb["sample_ids"], mb.get("positions")) for mb in micro]
            predicted = None
            if cfg.sparse_mlm_head and not objective.causal:
                predicted = flat_positions([batch.loss_mask for batch in batches])
            self.batches[kind] = (objective.causal, batches, predicted)
        log.info("validation: %d held-out samples from %s, CLM and MLM at mask ratio %g, every %d steps and at each "
                 "phase end", samples, path, cfg.validation.mask_ratio, cfg.validation.interval)

    def due(self, step: int, phase_end: bool) -> bool:
        return phase_end or step % self.cfg.validation.interval == 0

    def evaluate(self, ddp_chunks, model_chunks, causal_now: bool) -> dict[str, float]:
        """Both losses on the held-out samples; the attention is left as the current phase needs it."""
        start = time.perf_counter()
        results: dict[str, float] = {}
        layouts = [layout.to(self.device) for layout in self.layouts] if self.layouts else None
        try:
            with torch.no_grad(), params_in_sync(ddp_chunks):
                for kind, (causal, batches, predicted) in self.batches.items():
                    set_causal(model_chunks, causal)
                    stats = forward_backward(
                        ddp_chunks, [batch.to(self.device) for batch in batches], forward_only=True,
                        sparse_head=self.cfg.sparse_mlm_head, documents=layouts,
                        predicted_positions=None if predicted is None else [to_device(p, self.device)
                                                                            for p in predicted],
                        head_chunk_tokens=self.cfg.head_chunk_tokens)
                    loss_sum, count, correct = stats.tolist()
                    results[f"val/{kind}/loss"] = loss_sum / max(count, 1)
                    results[f"val/{kind}/accuracy"] = correct / max(count, 1)
        finally:
            set_causal(model_chunks, causal_now)
        results["perf/validation_s"] = time.perf_counter() - start
        return results

