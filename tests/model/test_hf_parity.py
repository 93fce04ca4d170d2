"""Our megatron EuroBERT, loaded through the mapping table, reproduces Hugging Face logits."""
import torch
from transformers import EuroBertConfig, EuroBertForMaskedLM, LlamaConfig, LlamaForCausalLM

from mlmclm.model import ModelConfig, build_model, set_causal
from mlmclm.model.hf_mapping import hf_to_megatron
from mlmclm.model.weights import load_full_weights
from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=200, max_position_embeddings=64, rope_theta=500.0, make_vocab_divisible_by=64)


def hf_config(cls):
    return cls(vocab_size=SHAPE.vocab_size, hidden_size=SHAPE.hidden_size, num_hidden_layers=SHAPE.num_layers,
               num_attention_heads=SHAPE.num_attention_heads, num_key_value_heads=SHAPE.num_kv_heads,
               intermediate_size=SHAPE.ffn_hidden_size, max_position_embeddings=SHAPE.max_position_embeddings,
               rms_norm_eps=SHAPE.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": SHAPE.rope_theta},
               pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def _run(out_path):
    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    hf_cfg = hf_config(EuroBertConfig)
    hf_cfg.mask_token_id = 3
    hf = EuroBertForMaskedLM(hf_cfg).eval()
    weights = dict(hf_to_megatron(hf.state_dict().__getitem__, SHAPE, SHAPE.padded_vocab_size(1)))
    chunks = build_model(SHAPE, ParallelConfig(), causal=False)
    load_full_weights(chunks, weights.__getitem__)
    model = chunks[0].eval()
    tokens = torch.randint(4, SHAPE.vocab_size, (3, 24))
    positions = torch.arange(24).expand(3, 24)
    with torch.no_grad():
        ours_bidir = model(tokens, positions, None)[..., : SHAPE.vocab_size]
        ref_bidir = hf(input_ids=tokens).logits
        set_causal(chunks, True)
        ours_causal = model(tokens, positions, None)[..., : SHAPE.vocab_size]
        # EuroBERT is Llama without the causal mask: the same weights in Llama are the causal reference.
        llama = LlamaForCausalLM(hf_config(LlamaConfig)).eval()
        llama.load_state_dict(hf.state_dict())
        ref_causal = llama(input_ids=tokens).logits
    torch.save(dict(ours_bidir=ours_bidir, ref_bidir=ref_bidir, ours_causal=ours_causal, ref_causal=ref_causal),
               out_path)
    destroy_parallel()


def test_logits_match_hf_bidirectional_and_causal(tmp_path):
    out = tmp_path / "logits.pt"
    spawn(_run, 1, out)
    r = torch.load(out)
    assert (r["ours_bidir"] - r["ref_bidir"]).abs().max() <= 1e-5
    assert (r["ours_causal"] - r["ref_causal"]).abs().max() <= 1e-5
    # The two modes must really differ, or the comparison above proves nothing about the mask.
    assert (r["ours_bidir"] - r["ours_causal"]).abs().max() > 1e-3
