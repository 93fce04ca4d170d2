"""ModernBERT's parallel layouts train as one process does: TP 2 with sequence parallelism, PP 2 and DP 2, each with
megatron's distributed optimizer, give the single process's losses within 1e-5 over 5 steps (2 CLM, then 3 MLM on
the sparse head, all on the same rows; gloo), and its gradient norms (which Adam's update would hide a wrongly
scaled gradient from). The layouts run the chunked head (the trainer's default, with the decoder bias), the single
process megatron's own head, so the chunked head's bias gradient is checked too. The model: a tiny random
`ModernBertForMaskedLM` (both layer types, windows shorter than the rows, two RoPE θ)."""
import torch

from mlmclm.parallel.launch import spawn
from tests.model.modernbert_fixtures import SEQ, random_modernbert

GLOBAL_BATCH, MICRO_BATCH, STEPS, CLM_STEPS = 4, 1, 5, 2
CHUNK = 5  # tokens per chunk of the chunked head: several chunks per micro-batch
LAYOUTS = {"tp2_sp": dict(tensor_parallel=2, sequence_parallel=True), "pp2": dict(pipeline_parallel=2),
           "dp2": {}}


def _batches(vocab: int):
    from mlmclm.objectives import ObjectiveConfig, build_objective

    tokens = torch.randint(4, vocab, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    out = []
    for step in range(STEPS):
        kind = "clm" if step < CLM_STEPS else "mlm"
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.3), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=2, vocab_size=vocab, seed=step)
        out.append(objective.prepare(tokens, torch.arange(GLOBAL_BATCH)))
    return out


def _micro_batches(batch, dp_rank: int, dp_size: int):
    from mlmclm.objectives import ObjectiveBatch

    per_rank = GLOBAL_BATCH // dp_size
    out = []
    for start in range(dp_rank * per_rank, (dp_rank + 1) * per_rank, MICRO_BATCH):
        rows = slice(start, start + MICRO_BATCH)
        out.append(ObjectiveBatch(batch.input_ids[rows], batch.labels[rows], batch.loss_mask[rows], batch.causal,
                                  batch.loss_mask[rows].sum().long()))
    return out


def _train(layouts: dict, head_chunk_tokens: int, out: str) -> None:
    from mlmclm.convert.modernbert_config import model_config_from_modernbert
    from mlmclm.model import build_model, set_causal
    from mlmclm.model.architectures import mapping_table
    from mlmclm.model.hf_mapping import hf_to_megatron
    from mlmclm.model.weights import load_full_weights
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
    from mlmclm.train.schedule_restarts import build_scheduler
    from mlmclm.train.step import configure_model_for_schedules, train_step

    hf = random_modernbert()
    model = model_config_from_modernbert(hf.config, "tiny", make_vocab_divisible_by=64).model
    padded = model.padded_vocab_size(2)  # 256 rows at TP 1 and TP 2 alike
    weights = dict(hf_to_megatron(hf.state_dict().__getitem__, model, padded, mapping_table(model)))
    batches = _batches(model.vocab_size)
    losses, state = {}, None
    for name, fields in layouts.items():
        layout = ParallelConfig(**fields)
        state = init_parallel(layout, seed=11)
        chunks = build_model(model, layout, causal=True, use_te=False)
        load_full_weights(chunks, weights.__getitem__)
        ddp = wrap_ddp(chunks, distributed_optimizer=True, overlap_grad_reduce=True)
        opt = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0, eps=1e-6, beta2=0.98)
        optimizer = build_optimizer(ddp, opt)
        scheduler = build_scheduler(optimizer, opt, ScheduleConfig(style="constant"), total_steps=STEPS)
        configure_model_for_schedules(ddp, optimizer)
        losses[name] = []
        for step, batch in enumerate(batches):
            set_causal(chunks, batch.causal)
            result = train_step(ddp, optimizer, scheduler, _micro_batches(batch, state.dp_rank, state.dp_size),
                                head_chunk_tokens=head_chunk_tokens)
            losses[name].append((result.loss, result.grad_norm))
    destroy_parallel()
    if state.rank == 0:
        torch.save(losses, out)


def test_tp2_sp_pp2_dp2_train_as_one_process(tmp_path):
    spawn(_train, 1, {"one_process": {}}, 0, str(tmp_path / "one.pt"))
    spawn(_train, 2, LAYOUTS, CHUNK, str(tmp_path / "layouts.pt"))
    reference = torch.load(tmp_path / "one.pt")["one_process"]
    layouts = torch.load(tmp_path / "layouts.pt")
    assert reference[1][0] < reference[0][0] - 0.1  # it learns the rows: the comparison covers real updates
    for name in LAYOUTS:
        assert len(layouts[name]) == STEPS
        for step, ((loss, norm), (want_loss, want_norm)) in enumerate(zip(layouts[name], reference)):
            assert abs(loss - want_loss) <= 1e-5, (name, step, loss, want_loss)
            assert abs(norm - want_norm) <= 1e-5 * want_norm, (name, step, norm, want_norm)
