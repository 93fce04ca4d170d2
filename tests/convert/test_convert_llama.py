"""Llama-family causal LMs → megatron checkpoint → our model in causal mode reproduces the Llama logits."""
import pytest
import torch
from convert_fixtures import hf_kwargs, megatron_logits_worker, read_json

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.model import ModelConfig
from mlmclm.parallel.launch import spawn

TIED_MHA = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=128,
                       vocab_size=150, max_position_embeddings=64, rope_theta=10000.0)
GQA_SCALED = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                         vocab_size=130, max_position_embeddings=64, rope_theta=500000.0)
LLAMA3_SCALING = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def save_llama(path, shape, tied, rope=None, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kwargs = hf_kwargs(shape)
    if rope:
        kwargs["rope_parameters"] = rope
    model = LlamaForCausalLM(LlamaConfig(**kwargs, tie_word_embeddings=tied)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.save_pretrained(str(path))
    return model


@pytest.fixture(scope="module")
def llama_logits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    tied = save_llama(tmp / "tied", TIED_MHA, tied=True)
    gqa = save_llama(tmp / "gqa", GQA_SCALED, tied=False, rope=LLAMA3_SCALING, seed=1)
    convert_from_hf(ImportConfig(str(tmp / "tied"), tmp / "tied_megatron", progress=False))
    convert_from_hf(ImportConfig(str(tmp / "gqa"), tmp / "gqa_megatron", tensor_parallel=2, progress=False))
    tokens = torch.randint(0, 130, (2, 40), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, tmp / "tokens.pt")
    spawn(megatron_logits_worker, 1, [str(tmp / "tied_megatron"), str(tmp / "gqa_megatron")], str(tmp / "tokens.pt"),
          str(tmp / "ours.pt"), True)
    ours = torch.load(tmp / "ours.pt")
    with torch.no_grad():
        theirs = [tied(input_ids=tokens).logits, gqa(input_ids=tokens).logits]
    return tmp, ours, theirs


def test_tied_llama_is_untied_and_reproduces_causal_logits(llama_logits):
    tmp, (ours, _), (theirs, _) = llama_logits
    assert tied_model_was_tied(tmp / "tied")
    assert (ours - theirs).abs().max().item() <= 1e-5
    run_config = read_json(tmp / "tied_megatron" / "checkpoints" / "iter_0000000" / "run_config.json")
    assert run_config["converted_from"]["model_type"] == "llama"
    assert run_config["converted_from"]["tied_embeddings_untied"] is True
    assert run_config["model"]["num_kv_heads"] == 4 and run_config["model"]["rope_scaling"] is None


def test_gqa_llama3_scaled_rope_at_tp2_reproduces_causal_logits(llama_logits):
    tmp, (_, ours), (_, theirs) = llama_logits
    assert (ours - theirs).abs().max().item() <= 1e-5
    run_config = read_json(tmp / "gqa_megatron" / "checkpoints" / "iter_0000000" / "run_config.json")
    assert run_config["model"]["rope_scaling"]["factor"] == 8.0 and run_config["model"]["rope_theta"] == 500000.0
    assert run_config["parallel"]["tensor_parallel"] == 2


def tied_model_was_tied(path) -> bool:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return "lm_head.weight" not in f.keys()
