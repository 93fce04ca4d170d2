"""`pretrain(config)`: the whole run — phases, CPT initialisation, exact resume, checkpoints, logging, guards."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from mlmclm.model import build_model, rope_theta, set_causal, set_rope_theta
from mlmclm.objectives import objective_for_tokenizer
from mlmclm.parallel import current_device, destroy_parallel, init_parallel
from mlmclm.redact import redact_tree
from mlmclm.train import checkpoint as ckpt
from mlmclm.train import step_flops
from mlmclm.train.branch import branch_source, check_branch, follow_own_schedule
from mlmclm.train.config import TrainConfig
from mlmclm.train.data_fit import check_data_fits_model
from mlmclm.train.determinism import enable_determinism
from mlmclm.train.finite_weights import check_finite_weights
from mlmclm.train.logger import MetricsLogger, rewind_metrics
from mlmclm.train.optim import build_optimizer, params_in_sync, wrap_ddp
from mlmclm.train.schedule_restarts import build_scheduler
from mlmclm.train.phase_data import PhaseLoaders, padding
from mlmclm.train.prefetch import StepBatches
from mlmclm.train.resume_check import check_resume_from, check_same_shape
from mlmclm.train.run_lock import RunLock, RunLockedError, check_run_dir_is_ours, remove_staging_leftovers
from mlmclm.train.run_status import write_failure_status, write_status
from mlmclm.train.signals import StopRequest, stop_signals_blocked
from mlmclm.train.step import ManualGC, configure_model_for_schedules, train_step
from mlmclm.train.validation import Validator, validation_path

log = logging.getLogger("mlmclm.train")


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient; the last checkpoint (finite when saved) is left
    as it was."""


@dataclass
class RunResult:
    status: str  # "completed", "preempted" or "segment_done" (checkpoint.stop_at)
    steps: int
    consumed_tokens: int
    final_losses: dict[str, float] = field(default_factory=dict)  # last loss of each objective phase
    checkpoints: list[str] = field(default_factory=list)
    tensorboard_dir: str | None = None


def pretrain(cfg: TrainConfig) -> RunResult:
    """Run (or resume) the whole training run described by `cfg` on the ranks torchrun started."""
    if cfg.deterministic:  # before NCCL and the model exist: both read these switches when created
        enable_determinism()
    state = init_parallel(cfg.parallel, seed=cfg.seed)
    lock, run = None, None
    try:
        lock = _take_run_lock(cfg, state.rank == 0)
        run = _Run(cfg, state, lock)
        return run.run()
    except Exception as err:
        if state.rank == 0 and not isinstance(err, RunLockedError):  # that directory's status is another run's
            write_failure_status(cfg, err, run.iteration if run else None)
        raise
    finally:
        if lock is not None:
            lock.release()
        destroy_parallel()


def _take_run_lock(cfg: TrainConfig, rank0: bool) -> RunLock | None:
    """Rank 0 locks the run directory and removes torn saves; every rank stops if another run holds it."""
    lock, error = None, None
    if rank0:
        try:
            check_run_dir_is_ours(cfg.run_dir, cfg.checkpoint.allow_foreign_run_dir)
            lock = RunLock(cfg.checkpoint_dir)
            for name in remove_staging_leftovers(cfg.checkpoint_dir):
                log.info("removed %s, left by a save that did not finish", name)
        except Exception as err:  # shared below so that no rank waits for the others forever
            error = err
    failed = torch.tensor([int(error is not None)], dtype=torch.int32, device=current_device())
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if failed.item():
        raise RuntimeError("rank 0 could not take the run directory's lock (its log says why)")
    return lock


class _Run:
    def __init__(self, cfg: TrainConfig, state, lock: RunLock | None):
        self.cfg, self.state, self.lock = cfg, state, lock
        self.rank0 = state.rank == 0
        # Each phase's data (its own or the run's; one dataset or a blend each), every source with its position.
        self.data = PhaseLoaders(cfg, state.dp_rank, state.dp_size, **padding(cfg))
        self.manifest = self.data.manifest
        self.phase_models = cfg.phase_models()  # each phase's RoPE θ and context (a phase may raise them)
        for index in range(len(cfg.phases)):
            check_data_fits_model(cfg, self.data.for_phase(index).manifest, index, self.phase_models[index])
        held_out = validation_path(cfg, self.manifest)
        self.validator = None if held_out is None else Validator(
            cfg, held_out, self.manifest.tokenizer, state.dp_rank, state.dp_size, state.device, **padding(cfg))
        self.validations: list[dict] = []  # every evaluation so far (in checkpoints: the model card reports them)
        self.seq = self.manifest.seq_length  # the first phase's rows (the train state's data identity)
        cfg.num_microbatches(state.dp_size)  # validates the batch split (and the interleaved schedule's)
        first_kind = cfg.phases[0].objective.kind
        self.chunks = build_model(cfg.model, cfg.parallel, cfg.precision, causal=first_kind == "clm",
                                  use_te=cfg.use_te, fused_kernels=cfg.fused_kernels,
                                  deterministic=cfg.deterministic, packed_segments=cfg.packed_segments,
                                  max_row_tokens=max(cfg.worst_row_tokens(self.data.seq_length(i), data)
                                                     for i, data in enumerate(cfg.phase_data())),
                                  rows=1 if cfg.data.random_length is not None else cfg.micro_batch_size)
        self.ddp = wrap_ddp(self.chunks, cfg.optimizer.distributed_optimizer, cfg.optimizer.overlap_grad_reduce,
                            cfg.optimizer.overlap_param_gather)
        self.optimizer = build_optimizer(self.ddp, cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.optimizer, cfg.schedule, cfg.total_steps,
                                         restarts=cfg.schedule_spans()[1:], tokens_per_step=self._tokens_per_step())
        configure_model_for_schedules(self.ddp, self.optimizer)
        self.iteration, self.consumed_tokens, self.consecutive_nonfinite = 0, 0, 0
        self.checkpoints: list[str] = []
        self.branched_from: dict | None = None  # parent checkpoint and step, when this run is a branch
        self._restore()

    def _tokens_per_step(self) -> float:
        """What a warmup given in tokens is divided by: the first phase's rows (random-length samples: their mean
        length) times the global batch."""
        lengths = self.cfg.phase_data()[0].random_length
        row = self.data.seq_length(0) if lengths is None else (lengths.min_length + lengths.max_length) / 2
        return self.cfg.global_batch_size * row

    # --- start: resume this run, or initialise weights from another checkpoint -----------------------------
    def _restore(self) -> None:
        cfg = self.cfg
        latest = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint.resume else None
        if latest is not None:
            check_resume_from(cfg, latest, self.manifest)
            self._continue_from(ckpt.load_full_state(latest, self.ddp, self.optimizer, self.scheduler))
            self._info(f"resumed {latest} at step {self.iteration} ({self.consumed_tokens} tokens)")
        elif cfg.checkpoint.branch_from:
            source = branch_source(cfg.checkpoint.branch_from, cfg.checkpoint.branch_step)
            check_branch(ckpt.read_json(source, ckpt.RUN_CONFIG), ckpt.read_json(source, ckpt.TRAIN_STATE), cfg,
                         self.manifest, str(source))
            own_plan = self.scheduler.state_dict()
            self._continue_from(ckpt.load_full_state(source, self.ddp, self.optimizer, self.scheduler))
            follow_own_schedule(self.scheduler, own_plan)
            self.branched_from = {"checkpoint": str(source), "step": self.iteration}
            self._info(f"branched from {source} at step {self.iteration} ({self.consumed_tokens} tokens): its full "
                       f"state, this config's plan from here on")
        elif cfg.checkpoint.init_from:
            source = ckpt.resolve_checkpoint(cfg.checkpoint.init_from)
            check_same_shape(ckpt.read_json(source, ckpt.RUN_CONFIG)["model"], cfg.model, str(source))
            ckpt.load_weights(source, self.ddp, self.optimizer)
            self._info(f"initialised weights from {source} (fresh optimizer, schedule and data position)")

    def _continue_from(self, train_state: dict) -> None:
        """The counters, data position and history of a loaded checkpoint (this run's own, or a branch's parent)."""
        self.iteration = train_state["iteration"]
        self.consumed_tokens = train_state["consumed_tokens"]
        self.consecutive_nonfinite = train_state.get("consecutive_nonfinite", 0)
        self.validations = train_state.get("validation", [])
        self.branched_from = train_state.get("branched_from")
        self.data.load_state_dict(train_state)

    def _info(self, message: str) -> None:
        if self.rank0:
            log.info(message)

    def _train_state(self, phase_index: int) -> dict:
        # The data position of the last batch trained (the loaders may stand one batch further: prefetch.py).
        consumed, loaders = self.step_batches.position()
        return {"iteration": self.iteration, "consumed_tokens": self.consumed_tokens,
                "consumed_samples": consumed, "phase_index": phase_index,
                "phase_name": self.cfg.phases[phase_index].name, "loaders": loaders,
                "consecutive_nonfinite": self.consecutive_nonfinite, "tokenizer": self.manifest.tokenizer,
                "seq_length": self.seq, "total_steps": self.cfg.total_steps, "validation": self.validations,
                "branched_from": self.branched_from, "rope_theta": rope_theta(self.chunks),
                "max_position_embeddings": self.phase_models[phase_index].max_position_embeddings}

    def _save(self, phase_index: int, keep: bool) -> None:
        run_config = redact_tree(self.cfg.to_dict())   # no credential of a data location in any checkpoint
        # Stop before writing when another checkpoint of the last one's size no longer fits (CheckpointWriteError).
        ckpt.check_room(self.cfg.checkpoint_dir, self.iteration, ckpt.last_complete(self.cfg.checkpoint_dir))
        # A preemption signal arriving now is handled after the save (signals.py); the parameters of the last
        # update are gathered first when their all-gather is overlapped with the next forward.
        with stop_signals_blocked(), params_in_sync(self.ddp):
            # never a NaN model under a checkpoint's name (finite_weights.py): checked on the synced parameters
            check_finite_weights(self.chunks, self.iteration, ckpt.last_complete(self.cfg.checkpoint_dir))
            path = ckpt.save_checkpoint(self.cfg.checkpoint_dir, self.iteration, self.ddp, self.optimizer,
                                        self.scheduler, self._train_state(phase_index), run_config,
                                        keep_last=self.cfg.checkpoint.keep_last, keep=keep)
        self.checkpoints.append(str(path))
        self._info(f"saved checkpoint {path}")

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        bounds = cfg.phase_bounds()
        stop = StopRequest()
        if self.rank0:
            Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            rewind_metrics(Path(cfg.run_dir) / "metrics.jsonl", self.iteration)
        peak = step_flops.peak_tflops(cfg)
        logger = MetricsLogger(cfg.tensorboard_dir if cfg.logging.tensorboard else None, cfg.logging.log_interval,
                               self.rank0, redact_tree(cfg.to_dict()), [p.name for p in cfg.phases],
                               metrics_file=Path(cfg.run_dir) / "metrics.jsonl", mfu=peak is not None,
                               run_name=cfg.tensorboard_run_name)
        final_losses: dict[str, float] = {}
        gc_control = ManualGC(cfg.manual_gc_interval)
        gc_control.start()
        current, objective, flops_per_step = None, None, 0.0
        status = "completed"
        # A segment (checkpoint.stop_at) ends early, saved; a requeued segment that already got there trains nothing.
        end = min(cfg.total_steps, cfg.checkpoint.stop_at or cfg.total_steps)
        self.step_batches = StepBatches(cfg, self.data, self.manifest.tokenizer, self.iteration, end)
        try:
            while self.iteration < end:
                phase_index = cfg.phase_at(self.iteration)
                phase = cfg.phases[phase_index]
                if phase_index != current:
                    objective = self._enter_phase(phase_index, current, logger)
                    seq = self.data.seq_length(phase_index)
                    flops_per_step = step_flops.flops_per_step(cfg, seq, phase.objective)
                    current = phase_index
                host = self.step_batches.get(self.iteration)  # built on the host while the last step ran
                batches, predicted, documents = host.to(self.state.device)
                result = train_step(self.ddp, self.optimizer, self.scheduler, batches,
                                    sparse_head=cfg.sparse_mlm_head, documents=documents,
                                    predicted_positions=predicted, stop_flag=stop.agreed_flag,
                                    head_chunk_tokens=cfg.head_chunk_tokens)
                self.iteration += 1
                gc_control.step(self.iteration)
                lengths = host.lengths  # random-length samples: the real tokens
                step_tokens = cfg.global_batch_size * seq if lengths is None else int(lengths.sum())
                if lengths is not None:
                    flops_per_step = step_flops.flops_per_step(cfg, seq, phase.objective, lengths)
                self.consumed_tokens += step_tokens
                phase_end = self.iteration == bounds[phase_index][1]
                held_out = self._validate(phase_end, objective.causal, logger)
                logger.step(self.iteration, phase.name, phase_index, result, self.consumed_tokens, step_tokens,
                            cfg.global_batch_size, flops_per_step, self.state.world_size, peak,
                            extra={**host.masking, **held_out, "train/rope_theta": rope_theta(self.chunks),
                                   "train/context_length": self.data.context_length(phase_index)})
                if self.lock is not None:
                    self.lock.touch()
                if result.skipped:
                    self.consecutive_nonfinite += 1
                    logger.text("guard", f"step {self.iteration}: non-finite loss or gradient, update skipped "
                                         f"({self.consecutive_nonfinite} in a row)", self.iteration)
                    if self.consecutive_nonfinite >= cfg.max_consecutive_nonfinite:
                        # every checkpoint was checked finite when saved (finite_weights.py): the last one is a sound
                        # starting point, and is named
                        last = ckpt.last_complete(cfg.checkpoint_dir)
                        raise NonFiniteLossError(
                            f"aborting at step {self.iteration}: {self.consecutive_nonfinite} consecutive steps with "
                            f"a non-finite loss or gradient; "
                            + (f"the last checkpoint, {last}, held finite weights when saved" if last else
                               "no checkpoint was saved"))
                else:
                    self.consecutive_nonfinite = 0
                    final_losses[phase.name] = result.loss
                # A skipped step still ends its phase and still answers a stop request: the phase-end checkpoint
                # (a continued-pretraining starting point) and a preemption save must not depend on the last loss.
                periodic = cfg.checkpoint.save_interval and self.iteration % cfg.checkpoint.save_interval == 0
                if result.stop_requested:
                    self._save(phase_index, keep=phase_end)
                    logger.text("run", f"stop requested (SIGTERM/SIGUSR1): saved at step {self.iteration}, exiting",
                                self.iteration)
                    status = "preempted"
                    break
                keep = phase_end or self.iteration in cfg.checkpoint.keep_steps  # children branch from these
                if keep or periodic or self.iteration == cfg.checkpoint.stop_at:
                    self._save(phase_index, keep=keep)
            if status == "completed" and self.iteration < cfg.total_steps:
                status = "segment_done"
                logger.text("run", f"segment ends at step {self.iteration} (checkpoint.stop_at): saved; a resume "
                                   f"continues the run", self.iteration)
            logger.hparams({"model": cfg.model.name, "phases": "→".join(p.name for p in cfg.phases),
                            "total_steps": cfg.total_steps, "global_batch_size": cfg.global_batch_size,
                            "lr": cfg.optimizer.lr},
                           [f"train/{name}/loss" for name in dict.fromkeys(p.name for p in cfg.phases)]
                           + (["val/clm/loss", "val/mlm/loss"] if self.validator is not None else []))
        finally:
            gc_control.stop()
            logger.close()
            self.step_batches.close()  # no wait for a batch being built ahead: it is dropped
            self.data.close()  # abandons reads in flight (a stalled shard must not hold a preemption's status)
        if self.rank0:
            write_status(cfg, status, self.iteration, self.checkpoints[-1] if self.checkpoints else "")
        return RunResult(status, self.iteration, self.consumed_tokens, final_losses, self.checkpoints,
                         str(cfg.tensorboard_dir))

    def _validate(self, phase_end: bool, causal: bool, logger: MetricsLogger) -> dict:
        """Held-out losses when due (every `validation.interval` steps, at each phase end, hence at the run's
        end); before the step's save, so a checkpoint's history holds every evaluation up to its step."""
        if self.validator is None or not self.validator.due(self.iteration, phase_end):
            return {}
        results = self.validator.evaluate(self.ddp, self.chunks, causal)
        losses = {k: v for k, v in results.items() if k.startswith("val/")}
        self.validations.append({"step": self.iteration, "tokens": self.consumed_tokens, **losses})
        logger.text("validation", f"step {self.iteration} validation: CLM loss {losses['val/clm/loss']:.4f}, "
                                  f"MLM loss {losses['val/mlm/loss']:.4f} (mask ratio "
                                  f"{self.cfg.validation.mask_ratio:g}), {results['perf/validation_s']:.2f} s",
                    self.iteration)
        return results

    def _enter_phase(self, index: int, previous: int | None, logger: MetricsLogger):
        phase = self.cfg.phases[index]
        objective = objective_for_tokenizer(phase.objective, self.manifest.tokenizer, self.cfg.seed)
        set_causal(self.chunks, objective.causal)
        theta_before, model = rope_theta(self.chunks), self.phase_models[index]
        if model.rope_theta != theta_before:  # also on a resume or a branch into a phase that raised it
            set_rope_theta(self.chunks, model)
        what = (f"phase {index} '{phase.name}' ({phase.objective.kind}"
                + (f", mask ratio {_mask_rate_text(phase.objective)}, {phase.objective.mask_mode}"
                   if phase.objective.kind == "mlm" else "")
                + f", {'causal' if objective.causal else 'bidirectional'} attention, RoPE θ {model.rope_theta:g}"
                + (f" (was {theta_before:g})" if model.rope_theta != theta_before else "")
                + f", context {model.max_position_embeddings}) from step {self.iteration}")
        logger.text("phase", ("switch to " if previous is not None else "start ") + what, self.iteration)
        return objective


def _mask_rate_text(objective) -> str:
    if objective.mask_schedule == "constant":
        return f"{objective.mask_ratio}"
    return f"{objective.mask_ratio} → {objective.mask_ratio_end} ({objective.mask_schedule} over the phase)"
