"""The encoders on megatron-core (EuroBERT, ModernBERT): config presets, layer specs, builder, HF weight mapping."""
from mlmclm.model.build import build_model, is_causal, set_causal
from mlmclm.model.config import PRESETS, ModelConfig, preset
from mlmclm.model.precision import PrecisionConfig
from mlmclm.model.rope import rope_theta, set_rope_theta

__all__ = ["PRESETS", "ModelConfig", "PrecisionConfig", "build_model", "is_causal", "preset", "rope_theta", "set_causal",
           "set_rope_theta"]
