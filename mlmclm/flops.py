"""Model FLOPs of one training step (EuroBERT, ModernBERT), GPU peak throughput, and MFU.

What is counted (per token, per layer; MAC = one multiply-add = 2 FLOPs):
    QKV projection (GQA)   h·h + 2·h·(kv_heads·head_dim)
    attention output       h·h
    gated MLP              3·h·ffn                  (SwiGLU / GeGLU: gate, up, down)
    attention scores+mix   2·K·h                    (QK^T and A·V over the K keys a query sees, below)
  once per token:
    LM head                h·V × f                  (V = padded vocabulary, f = fraction of positions, below)
    head transform         h·h                      (ModernBERT's dense layer before the decoder, at every position)

Keys per query K: S on a global layer (bidirectional). ModernBERT's local layers see the keys within
w = local_attention // 2 of the query, so K is the mean over the S queries of how many of the S keys lie within w
(2w + 1 inside the row, fewer at its ends; S when S <= w + 1): a windowed layer's attention term stops growing with
S. Causal attention counts the keys at or before the query (see below).
Norms, RoPE, softmax, SiLU and the embedding lookup are element-wise or gathers and are not counted (the usual
"model FLOPs" convention, so MFU is comparable with published figures).

Forward = 2·MACs. Training = 3 × forward (backward = 2 × forward; no activation recompute is counted, since
recompute is not useful model work).

Causal attention: a kernel that skips fully masked blocks (flash attention, TE fused attention) does about half
the QK^T/AV work of bidirectional attention, and only that half is useful model work. `causal_attention_half=True`
(the default) counts S/2 keys per query for causal attention (a local layer: the window's left half, at most w + 1).
Pass False to count every key a bidirectional layer of the same shape would (hardware FLOPs, not model FLOPs).

LM head: CLM computes logits at every position (`lm_head_fraction=1.0`, the default). MLM runs the output layer
and cross entropy only at the masked positions (`mlmclm.model.sparse_head`), so the head costs
`lm_head_fraction = predicted / total positions`, which is the mask ratio in expectation (special tokens are never
masked, so slightly less on real text): `lm_head_fraction(objective)` gives it for an objective config.

Random-length samples (`mlmclm.data.random_length`) attend within themselves, so S is each sample's own length:
`flops_for_lengths` sums a step over its samples, `mean_flops_for_uniform_lengths` is its expectation (plans).
Without local layers a token's FLOPs are linear in S (closed forms); with them, each distinct length is counted.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing mlmclm.model pulls in megatron; the arithmetic needs only the config's fields
    from mlmclm.model.config import ModelConfig

TRAINING_MULTIPLIER = 3  # forward + backward (grad wrt inputs and wrt weights, each ≈ forward)


@dataclass(frozen=True)
class FlopBreakdown:
    """Forward multiply-adds per token for the whole model, by component."""

    qkv: float
    attention_output: float
    mlp: float
    attention: float  # QK^T and A·V (the term quadratic in sequence length on global layers)
    lm_head: float
    head_transform: float = 0.0  # ModernBERT's dense layer before the decoder

    @property
    def forward_macs(self) -> float:
        return self.qkv + self.attention_output + self.mlp + self.attention + self.lm_head + self.head_transform

    @property
    def forward_flops(self) -> float:
        return 2 * self.forward_macs

    @property
    def training_flops(self) -> float:
        return TRAINING_MULTIPLIER * self.forward_flops


def flop_breakdown(model: ModelConfig, seq_length: int, *, causal: bool = False, causal_attention_half: bool = True,
                   lm_head_fraction: float = 1.0, vocab_size: int | None = None) -> FlopBreakdown:
    """Per-token forward MACs of `model` at `seq_length`. `vocab_size` defaults to the padded vocabulary (TP=1),
    which is the width the LM head really computes."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    if not 0.0 <= lm_head_fraction <= 1.0:
        raise ValueError(f"lm_head_fraction must be in [0, 1], got {lm_head_fraction}")
    h, layers = model.hidden_size, model.num_layers
    kv_width = model.num_kv_heads * model.head_dim
    vocab = model.padded_vocab_size(1) if vocab_size is None else vocab_size
    # Query heads × head_dim = h, whatever the KV grouping: GQA shrinks K/V projections, not the score matrix.
    half = causal and causal_attention_half
    local = sum(model.local_layers())
    keys = (layers - local) * (seq_length / 2 if half else seq_length)
    if local:
        keys += local * windowed_keys_per_query(seq_length, model.half_window, causal=half)
    return FlopBreakdown(
        qkv=layers * (h * h + 2 * h * kv_width),
        attention_output=layers * h * h,
        mlp=layers * 3 * h * model.ffn_hidden_size,
        attention=2 * keys * h,
        lm_head=h * vocab * lm_head_fraction,
        head_transform=h * h if model.is_modernbert else 0.0,
    )


def windowed_keys_per_query(seq_length: int, half_window: int, causal: bool = False) -> float:
    """Mean keys a query sees on a layer whose queries see keys within `half_window` positions (the row's ends
    cut the window): bidirectional, or only those at or before the query (`causal`)."""
    s, w = seq_length, half_window
    # Σ over queries q of min(q, w): the keys on one side, the row's start cutting the window
    one_side = s * (s - 1) / 2 if s - 1 <= w else w * (w + 1) / 2 + (s - 1 - w) * w
    return 1 + (1 if causal else 2) * one_side / s


def flops_per_token(model: ModelConfig, seq_length: int, *, causal: bool = False, training: bool = True,
                    causal_attention_half: bool = True, lm_head_fraction: float = 1.0,
                    vocab_size: int | None = None) -> float:
    """Model FLOPs per token: training (forward + backward) by default, forward only with `training=False`."""
    b = flop_breakdown(model, seq_length, causal=causal, causal_attention_half=causal_attention_half,
                       lm_head_fraction=lm_head_fraction, vocab_size=vocab_size)
    return b.training_flops if training else b.forward_flops


def lm_head_fraction(objective) -> float:
    """Fraction of positions the LM head runs at for an `ObjectiveConfig`: all for CLM, the mask ratio for MLM
    (the sparse head predicts masked positions only; under a mask-rate schedule, its mean over the phase)."""
    return 1.0 if objective.kind == "clm" else float(objective.mean_ratio)


def flops_per_step(model: ModelConfig, seq_length: int, sequences_per_step: int, **kwargs) -> float:
    """Model FLOPs of one optimizer step over `sequences_per_step` sequences (the global batch)."""
    return flops_per_token(model, seq_length, **kwargs) * seq_length * sequences_per_step


def flops_for_lengths(model: ModelConfig, lengths, **kwargs) -> float:
    """Model FLOPs of one step over samples of the given lengths, each attending only within itself
    (random-length samples, `mlmclm.data.random_length`): per-token FLOPs are linear in the attention length L,
    a + b·L, so the step costs a·ΣL + b·ΣL² — padding is not model work and is not counted. With local (windowed)
    layers they are not linear: each distinct length is counted."""
    if any(model.local_layers()):
        counts = Counter(int(n) for n in lengths)
        return sum(flops_per_token(model, n, **kwargs) * n * c for n, c in counts.items())
    one, two = flops_per_token(model, 1, **kwargs), flops_per_token(model, 2, **kwargs)
    slope = two - one
    total = sum(int(n) for n in lengths)
    squares = sum(int(n) * int(n) for n in lengths)
    return (one - slope) * total + slope * squares


def mean_flops_for_uniform_lengths(model: ModelConfig, min_length: int, max_length: int, samples: int,
                                   **kwargs) -> float:
    """Expected model FLOPs of a step of `samples` samples with lengths uniform in [min_length, max_length]
    (for plans: E[L] and E[L²] of the discrete uniform distribution)."""
    values = range(min_length, max_length + 1)
    if any(model.local_layers()):
        return samples * flops_for_lengths(model, values, **kwargs) / len(values)
    mean = sum(values) / len(values)
    mean_square = sum(v * v for v in values) / len(values)
    one, two = flops_per_token(model, 1, **kwargs), flops_per_token(model, 2, **kwargs)
    slope = two - one
    return samples * ((one - slope) * mean + slope * mean_square)


# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, FLOP/s. Matched in order by substring of
# torch.cuda.get_device_name(), so the specific H100 variants come before the generic "H100" (the SXM part).
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756e12, "fp8": 1513e12}),
    ("H100 NVL", {"bf16": 835e12, "fp8": 1671e12}),
    ("H100", {"bf16": 989e12, "fp8": 1979e12}),  # SXM
    ("H200", {"bf16": 989e12, "fp8": 1979e12}),  # also matches GH200 (same Hopper compute)
    ("A100", {"bf16": 312e12}),  # no FP8 tensor cores
]


def cuda_device_name() -> str | None:
    """The current CUDA device's name, or None without CUDA."""
    from mlmclm.parallel.runtime import gpu_name

    return gpu_name()


def peak_flops(dtype: str = "bf16", device_name: str | None = None, override: float | None = None) -> float:
    """Peak dense FLOP/s of one GPU for `dtype` ("bf16" or "fp8").

    `override` (FLOP/s) wins, for GPUs not in the table. `device_name` defaults to the current CUDA device's.
    """
    if override is not None:
        if override <= 0:
            raise ValueError(f"peak FLOP/s override must be > 0, got {override}")
        return float(override)
    name = device_name if device_name is not None else cuda_device_name()
    if name is None:
        raise ValueError("no CUDA device: pass the peak FLOP/s explicitly (override=...)")
    for key, peaks in PEAK_FLOPS:
        if key in name:
            if dtype not in peaks:
                raise ValueError(f"{name} has no {dtype} peak in the table (known: {sorted(peaks)})")
            return peaks[dtype]
    raise ValueError(f"unknown GPU {name!r}: known {[k for k, _ in PEAK_FLOPS]}; pass the peak FLOP/s explicitly")


def mfu(tokens_per_s: float, flops_per_token: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over peak FLOP/s (both per GPU)."""
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be > 0, got {peak}")
    return tokens_per_s * flops_per_token / peak
