"""Loss, gradients and one optimizer update are the same at every parallel layout as in a plain PyTorch model.

Four real processes over gloo (megatron-core with the CPU emulation) run each layout in turn; rank 0 also
computes the TP=PP=DP=1 reference with Hugging Face's EuroBERT (MLM) / Llama (CLM) and torch's AdamW.
MLM runs the sparse head (output layer and CE at masked positions only); at every layout its loss and gradients
are also compared with the full head's on the same model. The chunked head (mlmclm.model.chunked_head; CLM at
every position, MLM at the masked ones) is compared with megatron's head on the same model at every layout, and
makes the distributed optimizer's update.
"""
import torch
import torch.nn.functional as F
from transformers import EuroBertConfig, EuroBertForMaskedLM, LlamaConfig, LlamaForCausalLM

from mlmclm.model import ModelConfig, build_model
from mlmclm.model.hf_mapping import hf_to_megatron
from mlmclm.model.weights import gather_full, load_full_weights
from mlmclm.objectives import ObjectiveConfig, build_objective
from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn
from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
from mlmclm.train.schedule_restarts import build_scheduler
from mlmclm.train.step import configure_model_for_schedules, forward_backward, train_step

WORLD = 4
SHAPE = ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=256, max_position_embeddings=64, make_vocab_divisible_by=64)
GLOBAL_BATCH, MICRO_BATCH, SEQ = 8, 2, 16
CHUNK = 5  # tokens per chunk of the chunked head: several chunks per micro-batch (32 tokens, ~10 masked), ragged
LAYOUTS = {
    "tp1pp1dp4": ParallelConfig(),
    "tp2dp2": ParallelConfig(tensor_parallel=2),
    "tp2dp2_sp": ParallelConfig(tensor_parallel=2, sequence_parallel=True),
    "pp2dp2": ParallelConfig(pipeline_parallel=2),
    "tp2pp2": ParallelConfig(tensor_parallel=2, pipeline_parallel=2),
    "pp2vpp2dp2": ParallelConfig(pipeline_parallel=2, virtual_pipeline_parallel=2),
}
OPT = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0)


def hf_reference_models():
    common = dict(vocab_size=SHAPE.vocab_size, hidden_size=SHAPE.hidden_size, num_hidden_layers=SHAPE.num_layers,
                  num_attention_heads=SHAPE.num_attention_heads, num_key_value_heads=SHAPE.num_kv_heads,
                  intermediate_size=SHAPE.ffn_hidden_size, max_position_embeddings=SHAPE.max_position_embeddings,
                  rms_norm_eps=SHAPE.norm_eps,
                  rope_parameters={"rope_type": "default", "rope_theta": SHAPE.rope_theta},
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    encoder = EuroBertForMaskedLM(EuroBertConfig(mask_token_id=3, **common))
    decoder = LlamaForCausalLM(LlamaConfig(**common))
    decoder.load_state_dict(encoder.state_dict())
    return encoder, decoder


def objective_batches():
    tokens = torch.randint(4, SHAPE.vocab_size, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    ids = torch.arange(GLOBAL_BATCH)
    out = {}
    for kind in ("mlm", "clm"):
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.3), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=3, vocab_size=SHAPE.vocab_size, seed=7)
        out[kind] = objective.prepare(tokens, ids)
    # The first micro-batch predicts nothing: the sparse head then runs on zero positions (one DP rank's whole
    # share at DP=4), and the predicted counts differ per micro-batch and per rank.
    out["mlm"].labels[:MICRO_BATCH] = -100
    out["mlm"].loss_mask[:MICRO_BATCH] = 0
    return out


def micro_batches_for(batch, dp_rank, dp_size):
    from mlmclm.objectives import ObjectiveBatch

    per_rank = GLOBAL_BATCH // dp_size
    rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    out = []
    for start in range(rows.start, rows.stop, MICRO_BATCH):
        sl = slice(start, start + MICRO_BATCH)
        out.append(ObjectiveBatch(batch.input_ids[sl], batch.labels[sl], batch.loss_mask[sl], batch.causal,
                                  batch.loss_mask[sl].sum().long()))
    return out


def reference(model, batch):
    """Plain PyTorch: loss, gradients (megatron names) and weights after one AdamW step with clipping."""
    logits = model(input_ids=batch.input_ids).logits
    loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100, reduction="sum")
    loss = loss / batch.loss_mask.sum()
    loss.backward()
    named = dict(model.named_parameters())
    grads = dict(hf_to_megatron(lambda n: named[n].grad.clone(), SHAPE, SHAPE.vocab_size))
    # megatron's AdamW decays matrices but not norm weights.
    decay = [p for n, p in named.items() if p.ndim >= 2]
    no_decay = [p for n, p in named.items() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT.lr, betas=(OPT.beta1, OPT.beta2), eps=OPT.eps)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPT.clip_grad).item()
    opt.step()
    weights = dict(hf_to_megatron(lambda n: named[n].detach(), SHAPE, SHAPE.vocab_size))
    return {"loss": loss.item(), "grads": grads, "weights": weights, "grad_norm": grad_norm}


def _worker(out_path):
    results = {}
    encoder, decoder = hf_reference_models()
    initial = dict(hf_to_megatron(encoder.state_dict().__getitem__, SHAPE, SHAPE.vocab_size))
    batches = objective_batches()
    for name, layout in LAYOUTS.items():
        state = init_parallel(layout, seed=11)
        for kind, batch in batches.items():
            for distributed_optimizer in (False, True):
                chunks = build_model(SHAPE, layout, causal=batch.causal)
                load_full_weights(chunks, initial.__getitem__)
                # The update runs with the gradient reduction overlapped with backward (bucket by bucket).
                ddp = wrap_ddp(chunks, distributed_optimizer, overlap_grad_reduce=distributed_optimizer)
                optimizer = build_optimizer(ddp, OptimizerConfig(**{**OPT.__dict__,
                                                                   "distributed_optimizer": distributed_optimizer}))
                scheduler = build_scheduler(optimizer, OPT, ScheduleConfig(style="constant"), total_steps=10)
                configure_model_for_schedules(ddp, optimizer)
                micro = micro_batches_for(batch, state.dp_rank, state.dp_size)
                if not distributed_optimizer:
                    if kind == "mlm":
                        stats = forward_backward(ddp, micro, sparse_head=False)
                        results[(name, kind, "full_head_loss")] = (stats[0] / stats[1]).item()
                        results[(name, kind, "full_head_counts")] = stats[1:].tolist()  # predicted, correct
                        results[(name, kind, "full_head_grads")] = gather_full(ddp, "grad")
                        for chunk in ddp:
                            chunk.zero_grad_buffer()
                    stats = forward_backward(ddp, micro, head_chunk_tokens=CHUNK)
                    results[(name, kind, "chunked_loss")] = (stats[0] / stats[1]).item()
                    results[(name, kind, "chunked_counts")] = stats[1:].tolist()
                    results[(name, kind, "chunked_grads")] = gather_full(ddp, "grad")
                    for chunk in ddp:
                        chunk.zero_grad_buffer()
                    stats = forward_backward(ddp, micro)
                    results[(name, kind, "loss")] = (stats[0] / stats[1]).item()
                    results[(name, kind, "counts")] = stats[1:].tolist()
                    results[(name, kind, "grads")] = gather_full(ddp, "grad")
                else:
                    step = train_step(ddp, optimizer, scheduler, micro, head_chunk_tokens=CHUNK)
                    results[(name, kind, "step_loss")] = step.loss
                    results[(name, kind, "grad_norm")] = step.grad_norm
                    results[(name, kind, "weights")] = gather_full(ddp, "weight")
    # init_parallel rebuilds megatron's groups for each layout on the same process group.
    destroy_parallel()
    if state.rank == 0:
        for kind, model in (("mlm", encoder), ("clm", decoder)):
            fresh = type(model)(model.config)
            fresh.load_state_dict(model.state_dict())
            results[("reference", kind)] = reference(fresh, batches[kind])
        torch.save(results, out_path)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _max_relative_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-30)).item() for k in a)


def test_every_layout_matches_single_process_reference(tmp_path):
    out = tmp_path / "results.pt"
    spawn(_worker, WORLD, out)
    results = torch.load(out, weights_only=False)
    for kind in ("mlm", "clm"):
        ref = results[("reference", kind)]
        moved = _max_diff(ref["weights"], {k: v for k, v in ref["grads"].items()})  # sanity: a real update
        assert moved > 0
        for name in LAYOUTS:
            assert abs(results[(name, kind, "loss")] - ref["loss"]) < 1e-5, (name, kind)
            assert abs(results[(name, kind, "step_loss")] - ref["loss"]) < 1e-5, (name, kind)
            assert _max_diff(results[(name, kind, "grads")], ref["grads"]) < 1e-5, (name, kind)
            assert _max_diff(results[(name, kind, "weights")], ref["weights"]) < 1e-5, (name, kind)
            # The norm train_step clips by (and guards with): Adam hides a wrong one in the weights.
            assert abs(results[(name, kind, "grad_norm")] - ref["grad_norm"]) <= 1e-5 * ref["grad_norm"], (name, kind)
            # The chunked head against megatron's on the same model and layout: loss, accuracy, gradients.
            chunked, megatron_head = results[(name, kind, "chunked_loss")], results[(name, kind, "loss")]
            assert abs(chunked - megatron_head) <= 1e-6 * abs(megatron_head), (name, kind)
            assert results[(name, kind, "chunked_counts")] == results[(name, kind, "counts")], (name, kind)
            assert _max_diff(results[(name, kind, "chunked_grads")], results[(name, kind, "grads")]) < 1e-5, \
                (name, kind)
        if kind == "mlm":
            for name in LAYOUTS:
                full = results[(name, kind, "full_head_loss")]
                predicted, correct = results[(name, kind, "counts")]
                assert [predicted, correct] == results[(name, kind, "full_head_counts")], name
                assert predicted > 0, name
                assert abs(results[(name, kind, "loss")] - full) <= 1e-6 * abs(full), name
                assert _max_relative_diff(results[(name, kind, "grads")],
                                          results[(name, kind, "full_head_grads")]) <= 1e-6, name
