"""`transformer_engine.pytorch` of the stand-in: the modules megatron-core 0.19's TE extension
(`megatron/core/extensions/transformer_engine.py`) subclasses or calls, and the submodules megatron's other modules
import when TE is present. Each module's docstring says which TE behaviour it models and which it cannot."""
import transformer_engine.common.recipe  # noqa: F401  (TE's package imports it; megatron reads te.common.recipe)
from transformer_engine.pytorch import distributed, fp8, router, tensor  # noqa: F401
from transformer_engine.pytorch.attention.dot_product_attention import DotProductAttention  # noqa: F401
from transformer_engine.pytorch.fp8 import autocast, fp8_autocast, fp8_model_init, quantized_model_init  # noqa: F401
from transformer_engine.pytorch.module.grouped_linear import GroupedLinear  # noqa: F401
from transformer_engine.pytorch.module.layernorm_linear import LayerNormLinear  # noqa: F401
from transformer_engine.pytorch.module.linear import Linear  # noqa: F401
from transformer_engine.pytorch.module.rmsnorm import LayerNorm, RMSNorm  # noqa: F401
