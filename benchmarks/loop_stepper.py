"""The training loop's step as `pretrain` runs it, for benchmarks/train_step.py's `loop` columns: the next global
batch from the real loader (random-length samples, the paper's recipe), its host preparation (MLM masks, the sparse
head's positions, the packed-segment layouts) and the step — built in the loop (`loop`, what training did before
issue 46) or one step ahead on the background thread (`loop-prefetch`, `mlmclm.train.prefetch.StepBatches`, what
it does now). Both columns read the same data from the same position, so their losses must be equal bit for bit.
"""
from __future__ import annotations

import dataclasses


def prepare_loop_data(directory, seq: int, tokens: int) -> str:
    """The embedded corpus prepared in rows of `seq` tokens (once, by the parent; every loop worker reads it)."""
    from mlmclm.data.prepare import prepare_embedded_corpus

    prepare_embedded_corpus(directory, seq_length=seq, max_tokens=tokens)
    return str(directory)


def loop_stepper(shape, data_path: str, batch: int, seq: int, chunk_tokens: int, steps: int, background: bool,
                 load_weights):
    """A step function (ignoring the batch it is given: it reads the loader) and a counter of the real tokens it
    trained on. `load_weights(chunks)` gives the model the benchmark's shared initial weights."""
    from mlmclm.model import build_model
    from mlmclm.parallel import ParallelConfig, current_device, init_parallel
    from mlmclm.train.config import TrainConfig
    from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
    from mlmclm.train.schedule_restarts import build_scheduler
    from mlmclm.train.phase_data import PhaseLoaders
    from mlmclm.train.prefetch import StepBatches
    from mlmclm.train.step import configure_model_for_schedules, train_step

    cfg = TrainConfig.from_dict({
        "run_dir": "/nonexistent/loop-benchmark", "model": dataclasses.asdict(shape),
        "data": {"path": data_path, "tokenizer": "embedded", "random_length": {"min_length": 12, "max_length": seq}},
        "phases": [{"objective": {"kind": "mlm", "mask_ratio": 0.4}, "steps": steps}],
        "total_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
        "head_chunk_tokens": chunk_tokens})
    init_parallel(ParallelConfig(), seed=0)
    chunks = build_model(shape, ParallelConfig(), causal=False, packed_segments=True)
    load_weights(chunks)
    opt_cfg = OptimizerConfig()
    ddp = wrap_ddp(chunks, opt_cfg.distributed_optimizer, opt_cfg.overlap_grad_reduce, opt_cfg.overlap_param_gather)
    optimizer = build_optimizer(ddp, opt_cfg)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), total_steps=10**6)
    configure_model_for_schedules(ddp, optimizer)
    data = PhaseLoaders(cfg, 0, 1, pad_multiple=16)
    batches = StepBatches(cfg, data, data.manifest.tokenizer, 0, steps, background=background)
    state = {"step": 0, "tokens": 0}

    def step(_ignored):
        host = batches.get(state["step"])
        state["step"] += 1
        micro, predicted, documents = host.to(current_device())
        result = train_step(ddp, optimizer, scheduler, micro, sparse_head=True, documents=documents,
                            predicted_positions=predicted, head_chunk_tokens=chunk_tokens)
        state["tokens"] += int(host.lengths.sum())
        return result.loss

    return step, state
