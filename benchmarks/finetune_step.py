#!/usr/bin/env python
"""Fine-tuning speed: our loop (`mlmclm.eval.finetune.training.train`, what every `tools/evaluate.py` run uses) against
transformers' `Trainer` (what EncodEval runs), side by side in one process, on the same model (a random EuroBERT encoder
under EncodEval's sequence-classification head, `mlmclm.eval.finetune.encodeval_heads` — what `--suite paper` trains;
`--head eurobert`: transformers' EuroBertForSequenceClassification, what custom suites train), task (fixed-length random
token rows, 2 labels), batch, micro-batches (EncodEval's SC/TC/QA: 32 rows a step in 8 accumulated micro-batches of 4;
`--micro 32` for one pass), precision and optimiser (torch's non-fused AdamW, the Trainer's `adamw_torch` under
EncodEval's pins: β (0.9, 0.95), eps 1e-5, weight decay 0.1, 10 % warmup + linear decay, clip 1.0).

    python benchmarks/finetune_step.py                               # hidden 256, 4 layers, seq 128, 8 x 4, fp32
    python benchmarks/finetune_step.py --dtype bfloat16 --rounds 5 --steps 30

Each round runs one fine-tuning of `--steps` steps with each side, alternating which goes first, from the same
initial weights; a side's time is its whole `train` / `Trainer.train()` call (optimiser, scheduler and data-loader
set-up included: the evaluation is ~15,000 such short runs). The fastest round of each side is reported (other load
only ever slows a round down), with the median. Goal: ours >= 1.0x the Trainer's steps/s.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch


def build(args, folder):
    """The model (on the CPU) and the rows."""
    from transformers import EuroBertConfig, EuroBertForSequenceClassification, EuroBertModel

    from mlmclm.eval.finetune.encodeval_heads import EncodEvalSequenceClassifier

    torch.manual_seed(0)
    heads = args.heads or args.hidden // 64
    config = EuroBertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                            num_attention_heads=heads, num_key_value_heads=args.kv_heads or heads,
                            intermediate_size=args.ffn or 4 * args.hidden, max_position_embeddings=2 * args.seq,
                            pad_token_id=0,
                            bos_token_id=1, eos_token_id=2, mask_token_id=3,
                            num_labels=2, classifier_pooling="mean")
    if args.head == "eurobert":
        model = EuroBertForSequenceClassification(config)
    else:  # an encoder directory, as the paper suite reads one, under EncodEval's head
        with torch.device(args.device):  # a 610m model's random init takes seconds on a CPU, not on a GPU
            EuroBertModel(config).save_pretrained(f"{folder}/encoder")
        model = EncodEvalSequenceClassifier(f"{folder}/encoder", num_labels=2)
    generator = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(4, args.vocab, (args.seq,), generator=generator).tolist(),
             "attention_mask": [1] * args.seq, "labels": i % 2} for i in range(args.rows)]
    return model, rows


def ours(model, rows, args) -> float:
    from mlmclm.eval.finetune.training import FinetuneConfig, in_precision, pad_batch, train

    config = FinetuneConfig(learning_rate=1e-4, max_steps=args.steps, max_epochs=None, batch_size=args.batch,
                            dtype=args.dtype, micro_batch_size=args.micro, device=args.device)
    model = in_precision(model, config)
    started = time.perf_counter()
    train(model, rows, lambda chunk: pad_batch(chunk, {"input_ids": 0, "attention_mask": 0}),
          lambda m, b: m(**b).loss, config)  # its last read of the losses waits for the device's last step
    return time.perf_counter() - started


def trainer(model, rows, args, folder) -> float:
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging

    from mlmclm.eval.finetune.training import pad_batch

    logging.set_verbosity_error()
    bf16 = args.dtype == "bfloat16"
    model = model.to(torch.bfloat16 if bf16 else torch.float32)  # EncodEval casts the model, then bf16: true
    training = TrainingArguments(
        output_dir=folder, per_device_train_batch_size=args.micro, gradient_accumulation_steps=args.batch // args.micro,
        max_steps=args.steps, learning_rate=1e-4, optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-5, weight_decay=0.1, warmup_steps=0.1,
        lr_scheduler_type="linear", max_grad_norm=1.0, bf16=bf16, use_cpu=args.device == "cpu",
        report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    run = Trainer(model=model, args=training, train_dataset=rows,
                  data_collator=lambda chunk: pad_batch(chunk, {"input_ids": 0, "attention_mask": 0}))
    started = time.perf_counter()
    run.train()  # it reads the loss back at its end (tr_loss.item()): the device's work is done when it returns
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro", type=int, default=4, help="rows per forward/backward (EncodEval's per-device batch)")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    parser.add_argument("--heads", type=int, help="attention heads (default hidden / 64)")
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: the heads)")
    parser.add_argument("--ffn", type=int, help="MLP width (default 4 x hidden)")
    parser.add_argument("--head", choices=("encodeval", "eurobert"), default="encodeval",
                        help="the model's head: EncodEval's SL head over EuroBertModel (the paper suite's) or "
                             "transformers' EuroBertForSequenceClassification")
    args = parser.parse_args()
    if args.batch % args.micro:
        parser.error(f"--batch {args.batch} must be a multiple of --micro {args.micro}")
    warnings.filterwarnings("ignore")
    import copy
    import tempfile

    seconds = {"ours": [], "Trainer": []}
    with tempfile.TemporaryDirectory() as folder:
        initial, rows = build(args, folder)
        for round_ in range(args.rounds):
            order = ("ours", "Trainer") if round_ % 2 == 0 else ("Trainer", "ours")
            for side in order:
                model = copy.deepcopy(initial)
                seconds[side].append(ours(model, rows, args) if side == "ours" else
                                     trainer(model, rows, args, folder))
                print(f"round {round_ + 1} {side:<8} {args.steps / seconds[side][-1]:6.2f} steps/s", flush=True)
    best = {side: args.steps / min(times) for side, times in seconds.items()}
    median = {side: args.steps / statistics.median(times) for side, times in seconds.items()}
    print(f"\n{args.head} head, hidden {args.hidden}, {args.layers} layers, seq {args.seq}, batch {args.batch} "
          f"({args.batch // args.micro} x {args.micro}), "
          f"{args.dtype}, {args.steps} steps a run, {torch.get_num_threads()} threads")
    print("| side | best steps/s | median steps/s |\n|---|---|---|")
    for side in seconds:
        print(f"| {side} | {best[side]:.2f} | {median[side]:.2f} |")
    print(f"ours / Trainer (best): {best['ours'] / best['Trainer']:.2f}x (goal >= 1.0x)")


if __name__ == "__main__":
    main()
