"""The GPU session's memory and comparison sections:

- `worst_case_memory`: two CLM steps at the paper's worst-case micro-batch (12 samples of 2048 tokens: 24,576),
  with the training default's chunked head and with megatron's whole head, each peak next to `python -m
  recipes.sweep paper --plan`'s estimate (mlmclm.model.memory) for this one GPU (data parallel 1);
- `feature_table`: the defaults against each speed feature switched off (sparse MLM head, fused kernels, manual
  GC), in interleaved rounds, on the training default's batches;
- `precision_agreement`: bf16 and fp32 from the same initial weights on the same MLM batches, step by step.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

from gpu_trainer import (Trainer, copy_weights, free_memory, peak_memory_gib, precision_for, random_length_inputs,
                         reset_peak_memory, synchronize)
from mlmclm.data.random_length import SampleLengths
from mlmclm.flops import flops_for_lengths, lm_head_fraction, mfu
from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS
from mlmclm.model.memory import GIB, RankLayout, estimate_peak_memory

# The training default (chunked) and megatron's whole head, whose [tokens, vocab] logits the chunked one avoids.
WORST_CASE_HEADS = {"chunked": DEFAULT_CHUNK_TOKENS, "whole": 0}


@dataclass
class ExtrasConfig:
    worst_case_model: str = "eurobert-610m"
    worst_case_samples: int = 12
    worst_case_length: int = 2048
    feature_model: str = "eurobert-210m"
    feature_samples: int = 8
    feature_rounds: int = 3
    feature_steps: int = 4
    warmup_steps: int = 2
    agreement_model: str = "eurobert-210m"
    agreement_samples: int = 4
    agreement_steps: int = 6
    agreement_rtol: float = 0.01  # |bf16 - fp32| / fp32 per step
    max_length: int = 2048
    seed: int = 1234

    @classmethod
    def smoke(cls) -> "ExtrasConfig":
        return cls(worst_case_model="tiny-test", worst_case_samples=3, worst_case_length=32, feature_model="tiny-test",
                   feature_samples=3, feature_rounds=2, feature_steps=2, warmup_steps=1, agreement_model="tiny-test",
                   agreement_samples=2, agreement_steps=3, max_length=32)


def worst_case_memory(cfg: ExtrasConfig, dtype: str, on_head=None) -> dict:
    """`on_head(out)` after each head's figures (the session writes them at once)."""
    tokens = cfg.worst_case_samples * cfg.worst_case_length
    out = {"model": cfg.worst_case_model, "tokens": tokens, "samples": cfg.worst_case_samples, "heads": {}}
    trainer = None
    try:
        trainer = Trainer(cfg.worst_case_model, precision_for(dtype), cfg.seed, max_row_tokens=tokens)
        out["attention"] = trainer.attention
        trainer.use("clm")
        lengths = SampleLengths(cfg.worst_case_length, cfg.worst_case_length)  # every sample at its longest
        (item,) = random_length_inputs(trainer.objectives["clm"], trainer.model_cfg.vocab_size,
                                       cfg.worst_case_samples, lengths, 1, cfg.seed)
        for head, chunk in WORST_CASE_HEADS.items():
            estimate = estimate_peak_memory(trainer.model_cfg, RankLayout(data_parallel=1), tokens,
                                            predicted_fraction=1.0, head_chunk_tokens=chunk)
            figures = {"head_chunk_tokens": chunk, "estimated_gib": estimate.total / GIB,
                       "estimate": estimate.summary(), "measured_gib": None}
            try:
                reset_peak_memory()
                for _ in range(2):
                    trainer.step(item, head_chunk_tokens=chunk)
                synchronize()
                figures["measured_gib"], figures["memory_kind"] = peak_memory_gib()
                figures["status"] = "ok"
            except Exception as err:  # an OOM here is the finding: the estimate said it fits
                figures["status"] = f"failed: {type(err).__name__}: {str(err)[:300]}"
                free_memory()
            out["heads"][head] = figures
            if on_head is not None:
                on_head(out)
    except ValueError as err:  # refused by the library (local layers on rows too long for their mask)
        out["refused"] = f"{type(err).__name__}: {str(err)[:300]}"
    except Exception as err:  # the model did not even build
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
    finally:
        if trainer is not None:
            trainer.close()
    out["ok"] = "error" not in out and all(h["status"] == "ok" for h in out["heads"].values())
    return out


# Speed features compared on vs off: name -> Trainer keyword arguments of the "off" side. Nothing that needs data
# parallelism (overlapped gradient reduction) can be measured on one GPU.
FEATURES = {"sparse MLM head": {"sparse_head": False}, "fused kernels": {"fused_kernels": False},
            "manual GC (interval 100)": {"manual_gc_interval": 0}}


def feature_table(cfg: ExtrasConfig, dtype: str, peak: float | None, deadline: float) -> dict:
    """Every variant is its own Trainer (same seed: the same initial weights), alive together so that the rounds
    alternate between them; tokens/s is the median of the rounds."""
    variants = {"defaults": {}, **{f"{name} off": off for name, off in FEATURES.items()}}
    out = {"model": cfg.feature_model, "objective": "mlm", "samples": cfg.feature_samples,
           "rounds": cfg.feature_rounds, "steps_per_round": cfg.feature_steps, "rows": []}
    trainers: dict[str, Trainer] = {}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for name, kwargs in variants.items():
            if time.monotonic() > deadline:
                raise TimeoutError("the section's time budget was spent building the variants")
            trainers[name] = Trainer(cfg.feature_model, precision_for(dtype), cfg.seed,
                                     max_row_tokens=cfg.feature_samples * cfg.max_length, **kwargs)
        first = trainers["defaults"]
        inputs = random_length_inputs(first.objectives["mlm"], first.model_cfg.vocab_size, cfg.feature_samples,
                                      SampleLengths(12 if cfg.max_length > 12 else 2, cfg.max_length), 3, cfg.seed)
        for trainer in trainers.values():
            trainer.use("mlm")
            for i in range(cfg.warmup_steps):
                trainer.step(inputs[i % len(inputs)])
        for _ in range(cfg.feature_rounds):
            for name, trainer in trainers.items():
                if time.monotonic() > deadline:
                    raise TimeoutError("the section's time budget was spent in the feature table")
                synchronize()
                start, tokens = time.perf_counter(), 0
                for i in range(cfg.feature_steps):
                    trainer.step(inputs[i % len(inputs)])
                    tokens += sum(inputs[i % len(inputs)].lengths)
                synchronize()
                samples[name].append(tokens / (time.perf_counter() - start))
        base = sorted(samples["defaults"])[len(samples["defaults"]) // 2]
        for name, trainer in trainers.items():
            tokens_per_s = sorted(samples[name])[len(samples[name]) // 2]
            fraction = lm_head_fraction(trainer.objective_configs["mlm"]) if trainer.sparse_head else 1.0
            item = inputs[0]
            per_token = flops_for_lengths(trainer.model_cfg, item.lengths, lm_head_fraction=fraction) / sum(item.lengths)
            out["rows"].append({"variant": name, "tokens_per_s": tokens_per_s, "rounds": samples[name],
                                "flops_per_token": per_token,
                                "mfu": None if peak is None else mfu(tokens_per_s, per_token, peak),
                                "defaults_speedup": base / tokens_per_s})
    except TimeoutError as err:  # the rounds measured so far stay in "rounds_done"
        out["skipped"] = str(err)
        out["rounds_done"] = samples
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
    finally:
        for trainer in trainers.values():
            trainer.close()
    return out


def precision_agreement(cfg: ExtrasConfig, deadline: float = float("inf")) -> dict:
    """Stops at `deadline` (time.monotonic()) between builds and steps, with the losses so far ("not_reached")."""
    out = {"model": cfg.agreement_model, "steps": cfg.agreement_steps, "rtol": cfg.agreement_rtol,
           "fp32_losses": [], "bf16_losses": [], "max_rel_diff": None, "passed": False, "error": None}
    trainers = []

    def in_time(what: str) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the section's deadline came before {what}")

    try:
        row_tokens = cfg.agreement_samples * cfg.max_length
        in_time("the fp32 model was built")
        reference = Trainer(cfg.agreement_model, precision_for("fp32"), cfg.seed, max_row_tokens=row_tokens)
        trainers.append(reference)
        in_time("the bf16 model was built")
        low = Trainer(cfg.agreement_model, precision_for("bf16"), cfg.seed, max_row_tokens=row_tokens)
        trainers.append(low)
        copy_weights(reference, low)
        lengths = SampleLengths(12 if cfg.max_length > 12 else 2, cfg.max_length)
        for trainer, key in ((reference, "fp32_losses"), (low, "bf16_losses")):
            trainer.use("mlm")
            inputs = random_length_inputs(trainer.objectives["mlm"], trainer.model_cfg.vocab_size,
                                          cfg.agreement_samples, lengths, cfg.agreement_steps, cfg.seed + 1)
            for item in inputs:
                in_time(f"step {len(out[key]) + 1} of {key}")
                out[key].append(trainer.step(item).loss)
        diffs = [abs(a - b) / abs(a) for a, b in zip(out["fp32_losses"], out["bf16_losses"])]
        out["max_rel_diff"] = max(diffs)
        out["passed"] = out["max_rel_diff"] <= cfg.agreement_rtol
    except TimeoutError as err:  # not a failure: what was measured stays
        out["not_reached"] = str(err)
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
    finally:
        for trainer in trainers:
            trainer.close()
    return out
