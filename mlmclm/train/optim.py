"""megatron DDP, the (distributed) AdamW optimizer and the learning-rate schedule."""
from __future__ import annotations

from contextlib import contextmanager

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from mlmclm.train.guarded_update import check_supported
from mlmclm.train.optim_config import OptimizerConfig, ScheduleConfig


def wrap_ddp(chunks, distributed_optimizer: bool, overlap_grad_reduce: bool = False,
             overlap_param_gather: bool = False) -> list[DistributedDataParallel]:
    """megatron DDP around each chunk. `overlap_grad_reduce` starts each bucket's reduction (reduce-scatter with
    the distributed optimizer) as soon as its gradients are complete in the last micro-batch's backward, instead
    of all at once after it; `configure_model_for_schedules` then hands the schedules the sync hooks.
    `overlap_param_gather` (distributed optimizer only) defers the parameter all-gather to the next forward."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_param_gather=overlap_param_gather and distributed_optimizer,
        use_distributed_optimizer=distributed_optimizer,
        average_in_collective=False,  # gradients are summed, then divided by the global token count
    )
    wrapped = []
    for index, chunk in enumerate(chunks):
        wrapped.append(DistributedDataParallel(config=chunk.config, ddp_config=ddp_config, module=chunk,
                                               disable_bucketing=index > 0))
    return wrapped


@contextmanager
def params_in_sync(ddp_chunks):
    """Inside: every rank's model parameters are the updated ones (what a checkpoint must hold).

    With `overlap_param_gather` the all-gather of the last update waits for the next forward; as megatron's own
    training loop does around saves, the forward pre-hooks are removed, which forces the gather now, and put back
    afterwards (the next step's gather then starts as usual)."""
    overlapped = [chunk for chunk in ddp_chunks if chunk.ddp_config.overlap_param_gather]
    for chunk in overlapped:
        chunk.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        for chunk in overlapped:
            chunk.enable_forward_pre_hook()


def build_optimizer(ddp_chunks, cfg: OptimizerConfig):
    model_config = ddp_chunks[0].module.config
    megatron_cfg = MegatronOptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.torch_weight_decay,
        adam_beta1=cfg.beta1,
        adam_beta2=cfg.beta2,
        adam_eps=cfg.eps,
        clip_grad=cfg.clip_grad,
        bf16=model_config.bf16,
        params_dtype=model_config.params_dtype,
        use_distributed_optimizer=cfg.distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(megatron_cfg, ddp_chunks)
    check_supported(optimizer)  # train_step runs megatron's step in parts (mlmclm.train.guarded_update)
    return optimizer


def scheduler_for_span(optimizer, opt: OptimizerConfig, sched: ScheduleConfig, total_steps: int
                       ) -> OptimizerParamScheduler:
    """megatron's OptimizerParamScheduler for one schedule over `total_steps` (warmup already in steps)."""
    sched.check(total_steps)
    style = {"wsd": "WSD", "cosine": "cosine", "linear": "linear", "constant": "constant",
             "cooldown": "WSD"}[sched.style]  # a cooldown is a WSD whose decay fills the span after the warmup
    decay = sched.decay_for(total_steps)
    wsd = sched.style in ("wsd", "cooldown")
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if sched.warmup_steps else opt.lr,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.warmup_steps,
        lr_decay_steps=max(total_steps, 1),
        lr_decay_style=style,
        start_wd=opt.torch_weight_decay,
        end_wd=opt.torch_weight_decay,
        wd_incr_steps=max(total_steps, 1),
        wd_incr_style="constant",
        wsd_decay_steps=decay if wsd else None,
        lr_wsd_decay_style=sched.decay_shape if wsd else None,
    )

