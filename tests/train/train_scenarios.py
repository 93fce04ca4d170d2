"""Worker functions for the training tests. Each runs inside `launch.spawn` processes (module-level, picklable).

Failures are injected the way they happen in real life — a process dying (`os._exit`) at a chosen point, a loss
turning NaN — by wrapping library functions inside the worker processes only.
"""
import json
import os
from pathlib import Path

import torch

from mlmclm.data.prepare import prepare_embedded_corpus

SEQ = 64
TOTAL, SWITCH = 10, 4  # CLM for steps 1-4, MLM for steps 5-10


def make_data(directory: Path) -> Path:
    prepare_embedded_corpus(directory, seq_length=SEQ, max_tokens=60_000)
    return directory


def make_held_out_data(directory: Path) -> Path:
    """400 short documents, every 10th held out as the validation split; returns the prepared dataset."""
    from mlmclm.data.prepare import PrepareConfig, prepare

    lines = [json.dumps({"text": f"Document {i}: " + " ".join(["to be or not to be, that is"] * (2 + i % 7))})
             for i in range(400)]
    (directory / "docs.jsonl").write_text("\n".join(lines) + "\n")
    prepare(PrepareConfig(inputs=[str(directory / "docs.jsonl")], output_dir=str(directory / "data"),
                          tokenizer="embedded", seq_length=SEQ, workers=1, progress=False, validation_every=10))
    return directory / "data"


def config(run_dir, data_dir, tp=1, **overrides) -> dict:
    cfg = {
        "run_dir": str(run_dir), "model": {"preset": "tiny"},
        "data": {"path": str(data_dir), "tokenizer": "embedded"},
        "phases": [{"objective": {"kind": "clm"}, "steps": SWITCH},
                   {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": TOTAL - SWITCH}],
        "total_steps": TOTAL, "global_batch_size": 8, "micro_batch_size": 2,
        "parallel": {"tensor_parallel": tp},
        "optimizer": {"lr": 3e-3}, "schedule": {"style": "wsd", "warmup_steps": 2, "decay_steps": 3},
        "checkpoint": {"save_interval": 3}, "logging": {"log_interval": 100},
        # The chunked head with several chunks per micro-batch (128 tokens, ~38 masked): the runs, their exact
        # resumes and their reshards go through it; tests switch to megatron's head (0) where they compare.
        "head_chunk_tokens": 24,
    }
    cfg.update(overrides)
    return cfg


def metrics_rows(run_dir) -> dict[int, dict]:
    """step → the run's metrics.jsonl row, the last one logged for that step (a resume re-logs what it redoes)."""
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row
    return out


def _train(cfg_dict):
    import warnings

    warnings.filterwarnings("ignore")
    from mlmclm.train.config import TrainConfig
    from mlmclm.train.pretrain import pretrain

    return pretrain(TrainConfig.from_dict(cfg_dict))


def _rank0() -> bool:
    return os.environ.get("RANK") == "0"


def run_recording(cfg_dict, record_path):
    """A full run that records, at the phase switch and the phase-end save, the state a test asserts on."""
    from mlmclm.model import is_causal
    from mlmclm.model.weights import gather_full
    from mlmclm.train import pretrain as pt

    records = {}
    original_enter, original_save = pt._Run._enter_phase, pt._Run._save

    def enter(self, index, previous, logger):
        inner = self.optimizer.chained_optimizers[0] if hasattr(self.optimizer, "chained_optimizers") else self.optimizer
        adam_steps = [int(s["step"]) for s in inner.optimizer.state.values() if "step" in s]
        records.setdefault("phases", []).append({
            # The position of the batches trained so far (the loaders themselves stand one batch ahead: the next
            # one is built while a step runs, mlmclm/train/prefetch.py).
            "index": index, "iteration": self.iteration, "consumed_samples": self.step_batches.position()[0],
            "causal_before": is_causal(self.chunks), "adam_steps": sorted(set(adam_steps)),
            "optimizer_id": id(self.optimizer), "model_id": id(self.chunks[0])})
        objective = original_enter(self, index, previous, logger)
        records["phases"][-1]["causal_after"] = is_causal(self.chunks)
        records["phases"][-1]["objective"] = objective.name
        return objective

    def save(self, phase_index, keep):
        original_save(self, phase_index, keep)
        if keep and phase_index == 0:
            records["clm_end_weights"] = gather_full(self.ddp, "weight")

    def counted_step(ddp, optimizer, *args, **kwargs):
        with HostReads(optimizer) as reads:
            result = original_step(ddp, optimizer, *args, **kwargs)
        records.setdefault("host_reads", []).append(reads.calls)
        return result

    original_step = pt.train_step
    pt._Run._enter_phase, pt._Run._save, pt.train_step = enter, save, counted_step
    result = _train(cfg_dict)
    if _rank0():
        records["result"] = result.__dict__
        torch.save(records, record_path)


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that bring a tensor's value to Python (on a GPU each waits for the device to finish
    everything queued before it), by name: whoever makes them, our code or megatron's."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
             torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy}

    def __init__(self, optimizer):
        super().__init__()
        self.calls: list[str] = []
        self._optimizers = [part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer])]

    def _adam_step_counters(self) -> set[int]:
        """torch's Adam keeps each parameter's `step` on the host (unless capturable or fused) and reads it
        there: not a device synchronisation on a GPU either, so not counted."""
        return {id(state["step"]) for opt in self._optimizers for state in opt.state.values() if "step" in state}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS and id(args[0]) not in self._adam_step_counters():
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def run_killed_during_save(cfg_dict, kill_at_iteration):
    """Die (as a crash would) after every rank wrote checkpoint `kill_at_iteration` but before it was published."""
    from types import SimpleNamespace

    import megatron.core.dist_checkpointing as real
    from mlmclm.train import checkpoint

    def save(sharded, path, *args, **kwargs):
        real.save(sharded, path, *args, **kwargs)
        if Path(path).name.endswith(f"iter_{kill_at_iteration:07d}"):
            torch.distributed.barrier()
            os._exit(17)

    checkpoint.dist_checkpointing = SimpleNamespace(save=save, load=real.load)
    _train(cfg_dict)


def run_until(cfg_dict, stop_after_step):
    """Resume (possibly on another layout) and die right after logging step `stop_after_step`."""
    from mlmclm.train import logger as logger_module

    original = logger_module.MetricsLogger.step

    def step(self, step_number, *args, **kwargs):
        out = original(self, step_number, *args, **kwargs)
        if step_number >= stop_after_step:
            if self.metrics_file is not None:
                self.metrics_file.flush()
            os._exit(0)
        return out

    logger_module.MetricsLogger.step = step
    _train(cfg_dict)


def run_and_report_error(cfg_dict, report_path):
    try:
        _train(cfg_dict)
    except Exception as err:  # the test asserts on the type and message
        if _rank0():
            Path(report_path).write_text(json.dumps({"type": type(err).__name__, "message": str(err)}))
        return
    if _rank0():
        Path(report_path).write_text(json.dumps({"type": None, "message": ""}))


def run_with_nan_at(cfg_dict, bad_steps, report_path, bad_gradient_steps=()):
    """Losses turn NaN at the steps in `bad_steps` (as a diverging run's would); at `bad_gradient_steps` the loss
    stays finite and one gradient element becomes inf after the gradient reduction (an overflow in one layer's
    backward). The guard must skip or stop."""
    from mlmclm.train import step as step_module

    # Every head's loss goes through `_summed_loss_func` (megatron's head via `_loss_func`; the chunked head, which
    # sums its own losses, directly), so poisoning it reaches the run whatever head the config picks.
    original = step_module._summed_loss_func
    original_finalize = step_module.finalize_model_grads
    calls = {"n": 0, "finalized": 0}

    def finalize_then_poison(model, *args, **kwargs):
        out = original_finalize(model, *args, **kwargs)
        calls["finalized"] += 1  # once per step
        if calls["finalized"] in bad_gradient_steps:
            grad = next(p.main_grad for p in model[-1].module.parameters() if p.requires_grad)
            grad.view(-1)[0] = float("inf")
        return out

    step_module.finalize_model_grads = finalize_then_poison

    def poisoned(loss_mask, correct, loss_sum):
        loss, count, extra = original(loss_mask, correct, loss_sum)
        calls["n"] += 1
        micro_per_step = 4  # global batch 8 / micro batch 2 on one rank
        if (calls["n"] - 1) // micro_per_step + 1 in bad_steps:
            loss = loss * float("nan")
            stats = extra["stats"].clone()
            stats[0] = float("nan")  # the summed loss; token counts stay real
            extra = {"stats": stats}
        return loss, count, extra

    step_module._summed_loss_func = poisoned
    run_and_report_error(cfg_dict, report_path)


def run_cpt_recording(cfg_dict, record_path):
    """Continued pretraining: record the weights right after initialisation from another run's checkpoint, and
    after each step."""
    from mlmclm.model.weights import gather_full
    from mlmclm.train import pretrain as pt

    original = pt._Run._restore
    original_step = pt.train_step
    records = {"weights_after_step": []}

    def step(ddp, *args, **kwargs):
        result = original_step(ddp, *args, **kwargs)
        records["weights_after_step"].append(gather_full(ddp, "weight"))
        return result

    pt.train_step = step

    def restore(self):
        original(self)
        records["initial_weights"] = gather_full(self.ddp, "weight")
        records["iteration"] = self.iteration
        records["consumed_samples"] = self.data.consumed_samples
        records["scheduler_steps"] = self.scheduler.num_steps
        inner = self.optimizer.chained_optimizers[0] if hasattr(self.optimizer, "chained_optimizers") else self.optimizer
        records["adam_state_entries"] = len(inner.optimizer.state)

    pt._Run._restore = restore
    _train(cfg_dict)
    if _rank0():
        torch.save(records, record_path)


def run_checkpoint_key_checks(cfg_dict, out_dir, report_path):
    """Save and load across the local spec, the TE-keyed stand-in and a genuinely different model (one rank)."""
    import te_standin
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    from mlmclm.data.manifest import Manifest
    from mlmclm.model import build as build_module
    from mlmclm.model import spec as spec_module  # EuroBERT's block spec, which the architecture table calls
    from mlmclm.model.weights import gather_full
    from mlmclm.parallel import destroy_parallel, init_parallel
    from mlmclm.train import checkpoint as ckpt
    from mlmclm.train.config import TrainConfig
    from mlmclm.train.optim import build_optimizer, wrap_ddp
    from mlmclm.train.schedule_restarts import build_scheduler

    cfg = TrainConfig.from_dict(cfg_dict)
    local_spec = spec_module.block_spec
    init_parallel(cfg.parallel, seed=cfg.seed)
    train_state = {"iteration": 1, "tokenizer": Manifest.load(cfg.data.path).tokenizer, "seq_length": SEQ}

    def make(spec):
        spec_module.block_spec = spec
        try:
            ddp = wrap_ddp(build_module.build_model(cfg.model, cfg.parallel, cfg.precision), True)
        finally:
            spec_module.block_spec = local_spec
        optimizer = build_optimizer(ddp, cfg.optimizer)
        for inner in optimizer.chained_optimizers:  # the Adam state a first step creates (saving needs it)
            inner.init_state_fn(inner.optimizer, inner.config)
            for param_state in inner.optimizer.state.values():
                param_state["step"] = torch.tensor(1.0)
        return ddp, optimizer, build_scheduler(optimizer, cfg.optimizer, cfg.schedule, cfg.total_steps)

    def save(name, parts):
        ddp, optimizer, scheduler = parts
        return ckpt.save_checkpoint(Path(out_dir) / name, 1, ddp, optimizer, scheduler, train_state, cfg.to_dict())

    def same_weights(a, b) -> bool:
        wa, wb = gather_full(a[0]), gather_full(b[0])
        return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    def refusal(path, parts, full=False) -> str:
        try:
            if full:
                ckpt.load_full_state(path, *parts)
            else:
                ckpt.load_weights(path, parts[0], parts[1])
        except ckpt.CheckpointKeyError as err:
            return str(err)
        return ""

    report = {}
    local = make(local_spec)
    local_path = save("local", local)
    te = make(te_standin.te_keyed_block_spec)
    report["te_model_extra_state"] = sorted(k for k in te[0][0].module.state_dict() if k.endswith("_extra_state"))
    report["local_checkpoint_extra_state"] = _extra_state_keys(load_sharded_metadata(str(local_path)))
    ckpt.load_weights(local_path, te[0], te[1])  # local spec → TE keys
    report["local_to_te_same_weights"] = same_weights(local, te)
    te_path = save("te", te)
    report["te_checkpoint_extra_state"] = _extra_state_keys(load_sharded_metadata(str(te_path)))
    back = make(local_spec)
    ckpt.load_full_state(te_path, *back)  # TE keys → local spec, optimizer and all
    report["te_to_local_same_weights"] = same_weights(te, back)
    # A resume of a delayed-scaling FP8 checkpoint under TE >= 2.18's extra-state rule (te_standin), and a weights-
    # only load (init_from, a branch's CPT child) of it: FP8 metadata restored, TE's opt-in left as it was.
    resumed = make(te_standin.te_keyed_block_spec)
    ckpt.load_full_state(te_path, *resumed)
    report["te_resume_same_weights"] = same_weights(te, resumed)
    report["te_resume_fp8_meta_differs"] = _fp8_meta_differences(te[0], resumed[0])
    report["fp8_meta_modules"] = len(_fp8_meta(te[0]))
    init_from = make(te_standin.te_keyed_block_spec)
    ckpt.load_weights(te_path, init_from[0], init_from[1])
    report["te_init_from_fp8_meta_differs"] = _fp8_meta_differences(te[0], init_from[0])
    report["te_opt_in_after_loads"] = os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE")
    biased = make(te_standin.biased_block_spec)
    report["refused_missing"] = refusal(local_path, biased)
    report["refused_unexpected"] = refusal(save("biased", biased), back, full=True)
    report["te_path"] = str(te_path)
    destroy_parallel()
    Path(report_path).write_text(json.dumps(report))


def _fp8_meta(ddp) -> dict:
    """Every stand-in TE module's delayed-scaling tensors, as lists (comparable, JSON-able)."""
    return {name: {k: v.tolist() for k, v in module.fp8_meta.items() if isinstance(v, torch.Tensor)}
            for chunk in ddp for name, module in chunk.module.named_modules() if hasattr(module, "fp8_meta")}


def _fp8_meta_differences(a, b) -> list[str]:
    """Modules whose FP8 metadata differs between two models."""
    meta_a, meta_b = _fp8_meta(a), _fp8_meta(b)
    return sorted(name for name in meta_a.keys() | meta_b.keys() if meta_a.get(name) != meta_b.get(name))


def _extra_state_keys(metadata: dict) -> list[str]:
    """`_extra_state` entries of a dist checkpoint (stored as objects: `KEY/shard_i_n`)."""
    return sorted({k.split("/")[0] for k in metadata if k.split("/")[0].endswith("_extra_state")})


def run_recording_documents(cfg_dict, record_path):
    """A run that records, for every training step, the document layouts the step received, the loader's ids and
    the determinism switches in force."""
    from torch._inductor import config as inductor_config

    from mlmclm.data import loader as loader_module
    from mlmclm.train import step as step_module

    seen, batches = [], []
    original_step, original_next = step_module.train_step, loader_module.PackedLoader.next_global_batch

    switches = []

    def train_step(ddp, *args, documents=None, **kwargs):
        seen.append(None if documents is None else [(d.document_ids.cpu(), d.cu_seqlens.cpu()) for d in documents])
        switches.append({"torch_deterministic": torch.are_deterministic_algorithms_enabled(),
                         "megatron_deterministic_mode": ddp[0].module.config.deterministic_mode,
                         "NVTE_ALLOW_NONDETERMINISTIC_ALGO": os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO"),
                         "inductor_deterministic": inductor_config.deterministic})
        return original_step(ddp, *args, documents=documents, **kwargs)

    def next_global_batch(self):
        micro = original_next(self)
        batches.append([mb["document_ids"].clone() for mb in micro])
        return micro

    from mlmclm.train import pretrain as pt

    pt.train_step, loader_module.PackedLoader.next_global_batch = train_step, next_global_batch
    _train(cfg_dict)
    torch.save({"seen": seen, "loader": batches, "switches": switches}, record_path)


def run_each_reporting_errors(cfg_dicts, report_path):
    """Each config in turn in this process; rank 0 writes, per run, its error (type, message) or its status and
    steps."""
    results = []
    for cfg_dict in cfg_dicts:
        try:
            result = _train(cfg_dict)
            results.append({"type": None, "message": "", "status": result.status, "steps": result.steps})
        except Exception as err:  # the test asserts on the type and message
            results.append({"type": type(err).__name__, "message": str(err)})
    if _rank0():
        Path(report_path).write_text(json.dumps(results))


def run_filling_the_disk(reference_cfg, cfg_dict, filler, report_path):
    """One process, four runs. The reference run (on an ordinary disk); then, on a small filesystem, a run whose
    filesystem another writer fills while its second checkpoint is being written (ENOSPC inside megatron's writer);
    its resume with the filler still there, which the room check before the next save stops; and the resume once
    the filler is deleted. Rank 0 records each failure's type and message and the status file it left."""
    import shutil

    from mlmclm.train import checkpoint as ckpt

    _train(reference_cfg)
    original, saves, report = ckpt.save_sharded, [], []

    def save_sharded_while_the_disk_fills(sharded, directory):
        saves.append(directory)
        if len(saves) == 2 and _rank0():  # another writer takes all but half a checkpoint's room
            last = ckpt.latest_checkpoint(Path(directory).parent)
            leave = sum(f.stat().st_size for f in last.rglob("*") if f.is_file()) // 2
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, shutil.disk_usage(Path(filler).parent).free - leave))
        return original(sharded, directory)

    ckpt.save_sharded = save_sharded_while_the_disk_fills
    for attempt in ("filled during a save", "resumed, still full"):
        try:
            _train(cfg_dict)
            report.append({"attempt": attempt, "type": None})
        except Exception as err:  # the test asserts on the type, the message and the status file
            status = Path(cfg_dict["run_dir"]) / "run_status.json"
            report.append({"attempt": attempt, "type": type(err).__name__, "message": str(err),
                           "status": json.loads(status.read_text()) if status.exists() else None})
    ckpt.save_sharded = original
    if _rank0():
        os.remove(filler)
    result = _train(cfg_dict)
    report.append({"attempt": "resumed with room", "type": None, "status": result.status})
    if _rank0():
        Path(report_path).write_text(json.dumps(report))


def run_with_nan_weights_after(cfg_dict, poisoned_step, report_path):
    """After step `poisoned_step` one weight becomes NaN although that step's loss was finite (as an update with a
    huge learning rate leaves them): the next save must not write that model."""
    from mlmclm.train import pretrain as pt

    original_step = pt.train_step
    calls = {"n": 0}

    def step(ddp, *args, **kwargs):
        result = original_step(ddp, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == poisoned_step:
            import torch

            with torch.no_grad():
                next(ddp[0].module.parameters()).view(-1)[0] = float("nan")
        return result

    pt.train_step = step
    run_and_report_error(cfg_dict, report_path)
