"""Model shapes (EuroBERT, ModernBERT): a dataclass with named presets, validated against a parallel layout."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from mlmclm.parallel.runtime import ParallelConfig

# Shapes past these are typos (hidden_size=1e9), not models: refused when the config is built, before any process
# starts and tries to allocate them. 2^40 parameters is 500 times EuroBERT-2.1B; 2^24 positions is 2,000 times its
# context.
MAX_PARAMETERS = 1 << 40
MAX_POSITIONS = 1 << 24

# The architectures the trainer builds (mlmclm.model.architectures says what each one's blocks are).
ARCHITECTURES = ("eurobert", "modernbert")
LAYER_TYPES = ("global", "local")  # ModernBERT: full attention, or a window of `local_attention` tokens


@dataclass
class ModelConfig:
    """A model shape. `architecture` "eurobert": Llama blocks (RMSNorm, SwiGLU, GQA, RoPE, no biases) with an untied
    LM head. "modernbert": LayerNorm without bias, GeGLU, an embedding norm, attention global or local by layer
    (`layer_types`; local layers see `local_attention` tokens around each, `local_attention // 2` on each side, with
    their own RoPE θ `local_rope_theta`), and ModernBERT's MLM head (dense, GELU, norm, decoder tied to the embedding
    with a bias)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int = 128256
    max_position_embeddings: int = 8192
    rope_theta: float = 10_000.0  # the paper's pretraining value; released EuroBERT uses 250 000
    rope_scaling: dict | None = None  # Llama-3 style {"factor", "low_freq_factor", "high_freq_factor", ...}
    norm_eps: float = 1e-5
    init_std: float = 0.02
    make_vocab_divisible_by: int = 128  # padded vocab = multiple of this × TP (megatron's convention)
    name: str = "custom"
    architecture: str = "eurobert"
    # ModernBERT only (None for EuroBERT): each layer's attention, its window, the local layers' RoPE θ
    layer_types: list[str] | None = None
    local_attention: int | None = None
    local_rope_theta: float | None = None

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"model.architecture must be one of {list(ARCHITECTURES)}, got {self.architecture!r}")
        self._check_attention_pattern()
        for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                    "vocab_size", "max_position_embeddings", "make_vocab_divisible_by"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be a positive integer, got {getattr(self, key)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_attention_heads {self.num_attention_heads} is not divisible by num_kv_heads "
                f"{self.num_kv_heads} (grouped-query attention shares each KV head among whole groups)"
            )
        # `not x > 0` rather than `x <= 0`: NaN fails every comparison, so only this form refuses it
        for key, low, strict in (("rope_theta", 0.0, True), ("norm_eps", 0.0, True), ("init_std", 0.0, False)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
                    value > low if strict else value >= low):
                raise ValueError(f"model.{key} must be a finite number {'>' if strict else '>='} {low:g}, got "
                                 f"{value!r}")
        if self.max_position_embeddings > MAX_POSITIONS:
            raise ValueError(f"model.max_position_embeddings {self.max_position_embeddings} is beyond any context "
                             f"(at most {MAX_POSITIONS})")
        if self.parameter_count() > MAX_PARAMETERS:
            raise ValueError(f"model: {self.parameter_count():.3g} parameters (hidden_size {self.hidden_size}, "
                             f"ffn_hidden_size {self.ffn_hidden_size}, num_layers {self.num_layers}, vocab_size "
                             f"{self.vocab_size}) is beyond any model this trainer builds (at most {MAX_PARAMETERS:.3g})")

    def _check_attention_pattern(self) -> None:
        fields = {"layer_types": self.layer_types, "local_attention": self.local_attention,
                  "local_rope_theta": self.local_rope_theta}
        if self.architecture != "modernbert":
            given = [key for key, value in fields.items() if value is not None]
            if given:
                raise ValueError(f"model.{given[0]} is a ModernBERT field (model.architecture is "
                                 f"{self.architecture!r})")
            return
        missing = [key for key, value in fields.items() if value is None]
        if missing:
            raise ValueError(f"model.architecture modernbert needs model.{missing[0]}")
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_layers or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"model.layer_types must name one of {list(LAYER_TYPES)} for each of the "
                             f"{self.num_layers} layers, got {self.layer_types!r}")
        window = self.local_attention
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"model.local_attention must be an integer >= 2 (tokens a local layer sees), got "
                             f"{window!r}")
        theta = self.local_rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or \
                not theta > 0:
            raise ValueError(f"model.local_rope_theta must be a finite number > 0, got {theta!r}")

    @property
    def is_modernbert(self) -> bool:
        return self.architecture == "modernbert"

    def local_layers(self) -> list[bool]:
        """Per layer (0-based): whether its attention is windowed (ModernBERT's local layers)."""
        return [t == "local" for t in self.layer_types] if self.is_modernbert else [False] * self.num_layers

    @property
    def half_window(self) -> int | None:
        """How far a local layer's token sees on each side: keys at |query - key| <= this (Hugging Face ModernBERT's
        `sliding_window` = local_attention // 2)."""
        return self.local_attention // 2 if self.is_modernbert else None

    def parameter_count(self) -> int:
        """Parameters of the shape (embedding, LM head unless tied, attention with GQA, gated MLP; norms aside)."""
        kv = self.num_kv_heads * self.head_dim
        per_layer = self.hidden_size * (2 * self.hidden_size + 2 * kv) + 3 * self.hidden_size * self.ffn_hidden_size
        if self.is_modernbert:  # tied decoder (+ its bias), the head's dense layer
            return self.vocab_size * (self.hidden_size + 1) + self.hidden_size ** 2 + self.num_layers * per_layer
        return 2 * self.vocab_size * self.hidden_size + self.num_layers * per_layer

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        multiple = self.make_vocab_divisible_by * tensor_parallel
        return -(-self.vocab_size // multiple) * multiple

    def validate_layout(self, parallel: ParallelConfig) -> None:
        """Raise a clear error when this shape cannot be split the way `parallel` asks."""
        tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
        vpp = parallel.virtual_pipeline_parallel or 1
        if self.num_attention_heads % tp:
            raise ValueError(
                f"model.num_attention_heads {self.num_attention_heads} is not divisible by tensor_parallel {tp}"
            )
        if self.num_kv_heads % tp:
            raise ValueError(
                f"model.num_kv_heads {self.num_kv_heads} is not divisible by tensor_parallel {tp}: each TP rank "
                f"must own whole KV heads (use a TP size that divides {self.num_kv_heads})"
            )
        if self.ffn_hidden_size % tp:
            raise ValueError(f"model.ffn_hidden_size {self.ffn_hidden_size} is not divisible by tensor_parallel {tp}")
        if self.num_layers % (pp * vpp):
            raise ValueError(
                f"model.num_layers {self.num_layers} is not divisible by pipeline_parallel × "
                f"virtual_pipeline_parallel = {pp}×{vpp}"
            )

    def with_overrides(self, **overrides) -> "ModelConfig":
        unknown = set(overrides) - set(asdict(self))
        if unknown:
            raise ValueError(f"unknown model field(s): {sorted(unknown)}")
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        return cls(**data)


# Shapes from the EuroBERT paper (210m/610m/2.1b released; 1b is the paper's intermediate size).
PRESETS: dict[str, ModelConfig] = {
    "eurobert-210m": ModelConfig(12, 768, 12, 12, 3072, name="eurobert-210m"),
    "eurobert-610m": ModelConfig(26, 1152, 18, 6, 4096, name="eurobert-610m"),
    "eurobert-1b": ModelConfig(28, 1728, 18, 6, 5120, name="eurobert-1b"),
    "eurobert-2.1b": ModelConfig(32, 2304, 18, 6, 6144, name="eurobert-2.1b"),
    # Tiny shapes for tests and the CPU demo.
    "tiny": ModelConfig(4, 128, 4, 2, 256, vocab_size=8192, max_position_embeddings=1024,
                        make_vocab_divisible_by=64, name="tiny"),
    "tiny-test": ModelConfig(4, 64, 4, 2, 128, vocab_size=256, max_position_embeddings=256,
                             make_vocab_divisible_by=64, name="tiny-test"),
}


def modernbert_layer_types(num_layers: int, global_every: int = 3) -> list[str]:
    """ModernBERT's pattern: layer 0 and every `global_every`-th after it global, the others local."""
    return ["global" if i % global_every == 0 else "local" for i in range(num_layers)]


def _modernbert(name: str, layers: int, hidden: int, heads: int, ffn: int, vocab: int = 50368,
                **overrides) -> ModelConfig:
    """ModernBERT's shapes (arXiv 2412.13663, Table 3; the released config.json files): multi-head attention,
    global RoPE θ 160,000, local θ 10,000, windows of 128 tokens, global attention every third layer, LayerNorm
    eps 1e-5, context 8,192."""
    fields = dict(vocab_size=vocab, max_position_embeddings=8192, rope_theta=160_000.0, norm_eps=1e-5,
                  architecture="modernbert", layer_types=modernbert_layer_types(layers), local_attention=128,
                  local_rope_theta=10_000.0, name=name)
    return ModelConfig(layers, hidden, heads, heads, ffn, **{**fields, **overrides})


PRESETS.update({
    "modernbert-base": _modernbert("modernbert-base", 22, 768, 12, 1152),
    "modernbert-large": _modernbert("modernbert-large", 28, 1024, 16, 2624),
    # ModernCamemBERT: ModernBERT's shapes with a French vocabulary of 32,768 (the CLM detour's thesis, appendix
    # "Pretraining Configurations for the CLM Detour", Table "Architecture")
    "moderncamembert-base": _modernbert("moderncamembert-base", 22, 768, 12, 1152, vocab=32768),
    "moderncamembert-large": _modernbert("moderncamembert-large", 28, 1024, 16, 2624, vocab=32768),
    # Tiny ModernBERT for tests and the CPU twin: both layer types, windows shorter than the demo's 128-token rows
    "tiny-modernbert": _modernbert("tiny-modernbert", 3, 128, 4, 192, vocab=8192, max_position_embeddings=1024,
                                   local_attention=32, rope_theta=1000.0, local_rope_theta=100.0,
                                   make_vocab_divisible_by=64),
})


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].with_overrides(**overrides) if overrides else replace(PRESETS[name])
