#!/usr/bin/env python
"""Tokens/s of our training step (megatron-core, TP=1, CPU) against a plain PyTorch loop over Hugging Face's
EuroBertForMaskedLM with torch.optim.AdamW: same shape, weights, batch, sequence length and MLM masked batch.

    python benchmarks/train_step.py                                  # hidden 256, 4 layers, seq 256, batch 8
    python benchmarks/train_step.py --hidden 512 --layers 8 --rounds 5
    python benchmarks/train_step.py --vocab 128256 --batch 4 --steps 3 --rounds 5 \
        --columns ours ours-sparse ours-full hf-sdpa clm-chunked clm-full      # the paper's vocabulary
    python benchmarks/train_step.py --columns loop loop-prefetch --rounds 6   # the loop, batches built ahead or not

Each side lives in its own worker process, so the CPU emulation that megatron needs here (a TorchFunctionMode
that sees every torch call, `mlmclm/parallel/cpu_emulation.py`) is installed only where it belongs. The parent
alternates the workers round by round (only one computes at a time) and takes each side's fastest round (as timeit
does: other load on the machine only ever slows a round down), with the median printed too. Columns:
  ours             `mlmclm.train.step.train_step` (megatron schedules, DDP, megatron AdamW + clipping) as training
                   runs it by default: MLM's output layer and cross entropy at the masked positions only (the
                   sparse head), chunked (`mlmclm.model.chunked_head`, `--chunk-tokens` tokens at a time)
  ours-sparse      the sparse head with megatron's output layer and loss on all its logits (`head_chunk_tokens=0`)
  ours-full        megatron's head over every position (`sparse_head=False`), as before the sparse head
  clm-chunked      a CLM step (causal model and objective, every position predicted) with the chunked head
  clm-full         the same CLM step with megatron's head: the [tokens, vocab] logits and its loss's fp32 passes
  hf-sdpa          HF model (its default SDPA attention), CE over masked positions, clip, torch AdamW
  hf-eager         the same with HF's eager attention (matmul + softmax, like megatron's local attention on CPU)
  hf-eager+emu     hf-eager with the CPU emulation installed: what the TorchFunctionMode alone costs
  loop             pretrain's loop on the paper's random-length samples (min 12, max --seq, --batch per step)
                   from the real loader: each global batch built between steps (the loop before issue 46)
  loop-prefetch    the same loop with the next batch built on the background thread while the step runs
                   (`mlmclm.train.prefetch`, what pretrain does now); its losses must equal loop's bit for bit
Step-1 losses of all MLM columns must agree (same weights and batch), and those of the CLM columns among
themselves, and loop's and loop-prefetch's exactly, which the script checks. The loop columns' tokens/s count the
samples' real tokens. Goals at vocab 128256: ours >= 1.5x hf-sdpa (fastest and median rounds), and
clm-chunked's step peak below clm-full's by at least half the bytes of the step's [tokens, vocab] fp32 logits.
"step MiB" is each worker's peak resident memory during the timed rounds (VmHWM, reset before them through
/proc/self/clear_refs; the model and optimizer state included, so compare columns; nan where the kernel does not
reset it, then the memory goal compares the process peaks); "peak MiB" the whole process's, model build included.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import resource
import statistics
import time
import warnings
from dataclasses import asdict, dataclass

COLUMNS = ("ours", "ours-sparse", "ours-full", "hf-sdpa", "hf-eager", "hf-eager+emu", "clm-chunked", "clm-full")
CLM_COLUMNS = ("clm-chunked", "clm-full")
LOOP_COLUMNS = ("loop", "loop-prefetch")
SPECIAL_IDS, MASK_ID = [0, 1, 2, 3], 3


@dataclass
class BenchConfig:
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 1024
    vocab: int = 8192
    seq: int = 256
    batch: int = 8
    mask_ratio: float = 0.4
    warmup: int = 2     # steps before the first timed round, per worker
    steps: int = 5      # steps per round
    rounds: int = 3
    threads: int = 0    # torch threads per worker; 0 = torch's default (the machine's cores)
    seed: int = 0
    chunk_tokens: int = 0  # the chunked head's tokens per chunk; 0 = the training default (DEFAULT_CHUNK_TOKENS)
    loop_data: str = ""    # the loop columns' prepared dataset (made by `run`)


def model_config(cfg: BenchConfig):
    from mlmclm.model import ModelConfig

    return ModelConfig(num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                       num_kv_heads=cfg.kv_heads, ffn_hidden_size=cfg.ffn, vocab_size=cfg.vocab,
                       max_position_embeddings=max(cfg.seq, 64), make_vocab_divisible_by=128)


def hf_model(cfg: BenchConfig, attention: str):
    import torch
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    shape = model_config(cfg)
    hf_cfg = EuroBertConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                            num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                            intermediate_size=cfg.ffn, max_position_embeddings=shape.max_position_embeddings,
                            rms_norm_eps=shape.norm_eps,
                            rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=MASK_ID,
                            tie_word_embeddings=False, attn_implementation=attention)
    torch.manual_seed(cfg.seed)  # every worker builds the same initial weights
    return EuroBertForMaskedLM(hf_cfg)


def masked_batches(cfg: BenchConfig, kind: str = "mlm"):
    """Two distinct MLM (or CLM) batches (random tokens), identical in every worker."""
    import torch

    from mlmclm.objectives import ObjectiveConfig, build_objective

    objective = build_objective(ObjectiveConfig(kind, mask_ratio=cfg.mask_ratio), special_token_ids=SPECIAL_IDS,
                                mask_token_id=MASK_ID, vocab_size=cfg.vocab, seed=cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    out = []
    for i in range(2):
        tokens = torch.randint(len(SPECIAL_IDS), cfg.vocab, (cfg.batch, cfg.seq), generator=gen)
        out.append(objective.prepare(tokens, torch.arange(i * cfg.batch, (i + 1) * cfg.batch)))
    return out


def chunk_tokens(cfg: BenchConfig) -> int:
    from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS

    return cfg.chunk_tokens or DEFAULT_CHUNK_TOKENS


def shared_weights(cfg: BenchConfig):
    """`load(chunks)`: the HF reference model's initial weights, the same in every worker."""
    from mlmclm.model.hf_mapping import hf_to_megatron
    from mlmclm.model.weights import load_full_weights

    shape = model_config(cfg)
    reference = hf_model(cfg, "eager")
    weights = dict(hf_to_megatron(reference.state_dict().__getitem__, shape, shape.padded_vocab_size(1)))
    return lambda chunks: load_full_weights(chunks, weights.__getitem__)


def ours_stepper(cfg: BenchConfig, sparse_head: bool = True, head_chunk_tokens: int = 0, causal: bool = False):
    from mlmclm.model import build_model
    from mlmclm.parallel import ParallelConfig, init_parallel
    from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
    from mlmclm.train.schedule_restarts import build_scheduler
    from mlmclm.train.step import configure_model_for_schedules, train_step

    shape = model_config(cfg)
    init_parallel(ParallelConfig(), seed=cfg.seed)
    chunks = build_model(shape, ParallelConfig(), causal=causal)
    shared_weights(cfg)(chunks)
    opt_cfg = OptimizerConfig()
    ddp = wrap_ddp(chunks, opt_cfg.distributed_optimizer, opt_cfg.overlap_grad_reduce, opt_cfg.overlap_param_gather)
    optimizer = build_optimizer(ddp, opt_cfg)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), total_steps=10**6)
    configure_model_for_schedules(ddp, optimizer)
    return lambda batch: train_step(ddp, optimizer, scheduler, [batch], sparse_head=sparse_head,
                                    head_chunk_tokens=head_chunk_tokens).loss


def hf_stepper(cfg: BenchConfig, attention: str):
    import torch
    import torch.nn.functional as F

    from mlmclm.train.optim import OptimizerConfig

    opt_cfg = OptimizerConfig()
    model = hf_model(cfg, attention).train()
    params = dict(model.named_parameters())
    # megatron's AdamW decays matrices, not norm weights; the plain loop does the same.
    groups = [{"params": [p for p in params.values() if p.ndim >= 2], "weight_decay": opt_cfg.weight_decay},
              {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=opt_cfg.lr, betas=(opt_cfg.beta1, opt_cfg.beta2), eps=opt_cfg.eps)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=batch.input_ids).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100, reduction="sum")
        loss = loss / batch.loss_mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.clip_grad)
        optimizer.step()
        return loss.item()

    return step


def worker(column: str, cfg: BenchConfig, conn) -> None:
    """Build one side, then answer "run a round" requests with (seconds, losses) until told to stop."""
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("megatron").setLevel(logging.ERROR)
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    counted = None
    try:
        if column in LOOP_COLUMNS:
            from loop_stepper import loop_stepper

            step, counted = loop_stepper(model_config(cfg), cfg.loop_data, cfg.batch, cfg.seq, chunk_tokens(cfg),
                                         cfg.warmup + cfg.rounds * cfg.steps + 2, column == "loop-prefetch",
                                         shared_weights(cfg))
        elif column.startswith(("ours", "clm-")):
            chunked = column in ("ours", "clm-chunked")
            step = ours_stepper(cfg, sparse_head=column != "ours-full",
                                head_chunk_tokens=chunk_tokens(cfg) if chunked else 0, causal=column in CLM_COLUMNS)
        else:
            if column.endswith("+emu"):
                from mlmclm.parallel import cpu_emulation

                cpu_emulation.install()
            step = hf_stepper(cfg, "sdpa" if column == "hf-sdpa" else "eager")
        batches = masked_batches(cfg, "clm" if column in CLM_COLUMNS else "mlm")
        first_loss = step(batches[0])
        for i in range(1, cfg.warmup):
            step(batches[i % 2])
        conn.send(("ready", (first_loss, torch.get_num_threads())))
        step_peak_reset = reset_peak_rss()
        while conn.recv() == "round":
            tokens = counted["tokens"] if counted else 0
            start, cpu_start = time.perf_counter(), time.process_time()
            for i in range(cfg.steps):
                step(batches[i % 2])
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
            peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
            step_mib = peak_rss_mib() if step_peak_reset else float("nan")
            tokens = counted["tokens"] - tokens if counted else cfg.steps * cfg.batch * cfg.seq
            conn.send(("round", (seconds, cpu_seconds, peak_mib, step_mib, tokens)))
    except Exception as err:  # the parent reports it
        import traceback

        conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (Linux: "5" to /proc/self/clear_refs); False where it cannot, or
    where the write is accepted but the peak stays (seen in this development machine's container)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return peak_rss_mib() <= _status_mib("VmRSS") * 1.01


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    return float("nan")


def peak_rss_mib() -> float:
    """VmHWM, the peak resident set since the last reset, in MiB."""
    return _status_mib("VmHWM")


def run(cfg: BenchConfig, columns=COLUMNS) -> dict:
    if set(columns) & set(LOOP_COLUMNS) and not cfg.loop_data:
        import shutil
        import tempfile

        from loop_stepper import prepare_loop_data

        directory = tempfile.mkdtemp(prefix="train_step_loop_")
        try:
            return run(BenchConfig(**{**asdict(cfg), "loop_data": prepare_loop_data(directory, cfg.seq, 200_000)}),
                       columns)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    ctx = mp.get_context("spawn")
    workers = {}
    for column in columns:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(column, cfg, child), daemon=True)
        proc.start()
        workers[column] = (proc, parent)
    first_loss, threads, rounds, cpu = {}, {}, {c: [] for c in columns}, {c: [] for c in columns}
    round_tokens = {c: [] for c in columns}
    peak_mib, step_mib = {}, {}
    try:
        for column, (_, conn) in workers.items():  # workers build in parallel; warm-up is awaited here
            kind, value = conn.recv()
            if kind == "error":
                raise RuntimeError(f"{column} worker failed: {value}")
            first_loss[column], threads[column] = value
        for _ in range(cfg.rounds):
            for column, (_, conn) in workers.items():  # one side at a time
                conn.send("round")
                kind, value = conn.recv()
                if kind == "error":
                    raise RuntimeError(f"{column} worker failed: {value}")
                rounds[column].append(value[0])
                cpu[column].append(value[1])
                round_tokens[column].append(value[4])
                peak_mib[column] = value[2]
                step_mib[column] = max(step_mib.get(column, 0.0), value[3])
    finally:
        for proc, conn in workers.values():
            try:
                conn.send("stop")
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=30)
    # tokens/s of the fastest round (and of the median one): each round's own tokens over its seconds.
    rates = {c: [t / s for t, s in zip(round_tokens[c], r)] for c, r in rounds.items()}
    tok_s = {c: max(r) for c, r in rates.items()}
    median = {c: statistics.median(r) for c, r in rates.items()}
    # Process CPU time (all threads) is a second view that other load on the machine disturbs less.
    per_cpu_s = {c: max(t / s for t, s in zip(round_tokens[c], r)) for c, r in cpu.items()}
    return {"config": asdict(cfg), "tokens_per_s": tok_s, "tokens_per_s_median": median, "round_seconds": rounds,
            "tokens_per_cpu_s": per_cpu_s, "first_loss": first_loss, "threads": threads, "peak_rss_mib": peak_mib,
            "step_peak_rss_mib": step_mib}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = BenchConfig()
    for name, value in asdict(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--columns", nargs="+", choices=COLUMNS + LOOP_COLUMNS, default=list(COLUMNS))
    p.add_argument("--loss-atol", type=float, default=1e-3, help="step-1 losses must agree within this")
    args = vars(p.parse_args(argv))
    columns, atol = args.pop("columns"), args.pop("loss_atol")
    if "ours" not in columns and not set(columns) <= set(LOOP_COLUMNS):
        p.error("--columns must include ours (or be loop columns only)")
    cfg = BenchConfig(**args)
    import torch

    start = time.perf_counter()
    result = run(cfg, columns)
    print(f"cores: os.cpu_count()={os.cpu_count()}, torch threads per worker={sorted(set(result['threads'].values()))}"
          f", torch {torch.__version__}, load average {os.getloadavg()[0]:.1f} (1 min, at the end)")
    print(f"shape: hidden {cfg.hidden}, layers {cfg.layers}, heads {cfg.heads}/{cfg.kv_heads} kv, ffn {cfg.ffn}, "
          f"vocab {cfg.vocab}; seq {cfg.seq} x batch {cfg.batch}, MLM mask {cfg.mask_ratio}; "
          f"{cfg.rounds} rounds x {cfg.steps} steps, warm-up {cfg.warmup}; tokens/s of the fastest round (median round)")
    base = "ours" if "ours" in columns else columns[0]  # the column the ratios are of
    ours, ours_med = result["tokens_per_s"][base], result["tokens_per_s_median"][base]
    ours_cpu = result["tokens_per_cpu_s"][base]
    print(f"{'column':<14}{'tokens/s':>10}{'(median)':>10}{'ours/this':>11}{'(median)':>10}{'tok/CPU-s':>11}"
          f"{'ours/this':>11}{'step MiB':>10}{'peak MiB':>10}{'step-1 loss':>13}  rounds (s)")
    for column in columns:
        tok, med = result["tokens_per_s"][column], result["tokens_per_s_median"][column]
        per_cpu = result["tokens_per_cpu_s"][column]
        rounds = " ".join(f"{s:.2f}" for s in result["round_seconds"][column])
        if column in CLM_COLUMNS or (column in LOOP_COLUMNS) != (base in LOOP_COLUMNS):  # not comparable
            ratios = f"{'':>11}{'':>10}{per_cpu:>11.0f}{'':>11}"
        else:
            ratios = f"{ours / tok:>10.2f}x{ours_med / med:>9.2f}x{per_cpu:>11.0f}{ours_cpu / per_cpu:>10.2f}x"
        print(f"{column:<14}{tok:>10.0f}{med:>10.0f}{ratios}{result['step_peak_rss_mib'][column]:>10.0f}"
              f"{result['peak_rss_mib'][column]:>10.0f}{result['first_loss'][column]:>13.5f}  {rounds}")
    failed = False
    loops = [c for c in columns if c in LOOP_COLUMNS]
    for group, tolerance in (([c for c in columns if c not in CLM_COLUMNS + LOOP_COLUMNS], atol),
                             ([c for c in columns if c in CLM_COLUMNS], atol), (loops, 0.0)):
        if len(group) < 2:
            continue
        spread = max(result["first_loss"][c] for c in group) - min(result["first_loss"][c] for c in group)
        print(f"step-1 loss spread {spread:.2e} over {', '.join(group)} (tolerance {tolerance})")
        failed |= spread > tolerance
    if len(loops) == 2:
        fastest = result["tokens_per_s"]["loop-prefetch"] / result["tokens_per_s"]["loop"]
        median = result["tokens_per_s_median"]["loop-prefetch"] / result["tokens_per_s_median"]["loop"]
        # Within 1 %: on CPU the batch the thread builds ahead takes ~1 % of a step, all the thread can change.
        print(f"goal loop-prefetch no slower than loop (within 1 %): fastest {fastest:.3f}x, median {median:.3f}x: "
              f"{'met' if min(fastest, median) >= 0.99 else 'NOT met'}")
    if "hf-sdpa" in columns:
        fastest = ours / result["tokens_per_s"]["hf-sdpa"]
        median = ours_med / result["tokens_per_s_median"]["hf-sdpa"]
        print(f"goal ours >= 1.5x hf-sdpa: fastest {fastest:.2f}x, median {median:.2f}x: "
              f"{'met' if min(fastest, median) >= 1.5 else 'NOT met'}")
    if set(CLM_COLUMNS) <= set(columns):
        logits_mib = cfg.batch * cfg.seq * model_config(cfg).padded_vocab_size(1) * 4 / 2**20
        which = "step_peak_rss_mib"
        if any(math.isnan(result[which][c]) for c in CLM_COLUMNS):
            # The peak could not be reset: the process peaks (the same model build in both columns) compared.
            which = "peak_rss_mib"
        saved = result[which]["clm-full"] - result[which]["clm-chunked"]
        print(f"goal clm-chunked's {'step' if which == 'step_peak_rss_mib' else 'process'} peak >= "
              f"{logits_mib / 2:.0f} MiB (half the {logits_mib:.0f} MiB fp32 [tokens, vocab] logits) below clm-full's: "
              f"{saved:.0f} MiB: {'met' if saved >= logits_mib / 2 else 'NOT met'}")
    print(f"chunked head: {chunk_tokens(cfg)} tokens per chunk; total {time.perf_counter() - start:.0f} s")
    if failed:
        print("FAIL: the columns did not train the same model on the same batch")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
