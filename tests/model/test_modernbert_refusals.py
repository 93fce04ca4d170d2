"""What our ModernBERT does not compute is refused, naming the field: ModernBERT configurations we cannot reproduce
exactly (at import, before any weight is read), half-given ModernBERT fields, and weights of one architecture
continued as the other. (Context parallelism, which the local layers' RoPE would need split, is refused for every
model by ParallelConfig.)"""
import pytest

from mlmclm.model import ModelConfig, preset
from tests.model.modernbert_fixtures import hf_modernbert_config


@pytest.mark.parametrize("field, value", [("hidden_activation", "gelu_pytorch_tanh"), ("norm_bias", True),
                                          ("attention_bias", True), ("mlp_bias", True), ("decoder_bias", False),
                                          ("classifier_bias", True), ("tie_word_embeddings", False)])
def test_modernbert_configs_we_cannot_reproduce_are_refused(field, value):
    from mlmclm.convert.architecture_config import model_config_from_hf
    from mlmclm.convert.hf_config import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=f"{field}={value!r} is not supported"):
        model_config_from_hf(hf_modernbert_config(**{field: value}), "m")
    assert model_config_from_hf(hf_modernbert_config(), "m").model.architecture == "modernbert"


def test_modernbert_fields_are_given_together_and_only_to_modernbert():
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=96)
    with pytest.raises(ValueError, match="model.local_attention is a ModernBERT field"):
        ModelConfig(**base, local_attention=8)
    with pytest.raises(ValueError, match="model.architecture modernbert needs model.local_attention"):
        ModelConfig(**base, architecture="modernbert", layer_types=["global", "local"], local_rope_theta=1e4)
    with pytest.raises(ValueError, match="model.layer_types must name one of"):
        ModelConfig(**base, architecture="modernbert", layer_types=["global"], local_attention=8,
                    local_rope_theta=1e4)
    with pytest.raises(ValueError, match="model.architecture must be one of"):
        ModelConfig(**base, architecture="bert")


def test_weights_of_one_architecture_do_not_start_the_other():
    from mlmclm.train.resume_check import IncompatibleCheckpointError, check_same_shape

    modernbert = preset("tiny-modernbert")
    eurobert = preset("tiny", num_layers=3, ffn_hidden_size=192, num_kv_heads=4, norm_eps=1e-5)
    saved = {k: v for k, v in eurobert.to_dict().items() if k not in ("architecture", "layer_types",
                                                                      "local_attention", "local_rope_theta")}
    check_same_shape(saved, eurobert, "old-checkpoint")  # saved before these fields existed: a EuroBERT
    with pytest.raises(IncompatibleCheckpointError, match="model.architecture is 'eurobert' in the checkpoint but "
                                                          "'modernbert' in this config"):
        check_same_shape(saved, modernbert, "old-checkpoint")
