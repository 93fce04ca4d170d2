"""`make demo`: the main job end to end on the embedded corpus, on CPU, offline.

1. prepare the embedded corpus with the embedded tokenizer into packed webdataset shards;
2. train a tiny EuroBERT with the `tiny_clm_mlm` recipe on 2 torchrun processes (TP=2 over gloo) through
   NeMo-Run's local executor: CLM for the first 25 % of the steps, then MLM;
3. export the CLM phase-end and the final checkpoints to Hugging Face EuroBERT;
4. fine-tune both on the embedded smoke tasks and compare them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

DEMO_STEPS = 160


def final_losses(run_dir: Path) -> dict[str, float]:
    """The last logged loss of each objective, from the run's metrics.jsonl."""
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        losses[row["phase"]] = row[f"train/{row['phase']}/loss"]
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlmclm.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="artifacts/demo", help="where data, run, exports and eval go")
    parser.add_argument("--steps", type=int, default=DEMO_STEPS)
    parser.add_argument("--skip-eval", action="store_true", help="stop after training and export")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    out = Path(args.output).resolve()
    started = time.time()

    from mlmclm.data.manifest import Manifest
    from recipes.launch import build, launch
    from recipes.tiny import prepare_tiny_data

    print(f"[1/4] preparing the embedded corpus → {out / 'data'}")
    manifest = Manifest.load(str(prepare_tiny_data(str(out / "data"))))
    print(f"      {manifest.num_samples} packed sequences of {manifest.seq_length} tokens, "
          f"{manifest.num_tokens} tokens, tokenizer {manifest.tokenizer['name']} ({manifest.tokenizer['vocab_size']})")

    run_dir = out / "run"
    print(f"[2/4] recipe tiny_clm_mlm: tiny EuroBERT, CLM 25 % → MLM 75 % of {args.steps} steps, "
          f"2 torchrun processes (TP=2 over gloo) through NeMo-Run's local executor")
    partial, _ = build("tiny_clm_mlm", [f"steps={args.steps}", "tensor_parallel=2", f"data_path={out / 'data'}",
                                        f"run_dir={run_dir}"])
    launch([("tiny_clm_mlm", partial)], "local", base_dir=str(out / "nemo_experiments"))
    print("      final losses: " + ", ".join(f"{k.upper()} {v:.3f}" for k, v in final_losses(run_dir).items()))
    print(f"      checkpoints: {run_dir / 'checkpoints'}")
    print(f"      TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}   (logs: {out / 'nemo_experiments'})")

    print("[3/4] exporting to Hugging Face EuroBERT (CLM phase end and final)")
    from mlmclm.convert.to_hf import export_checkpoint

    from mlmclm.train.checkpoint import TRAIN_STATE, latest_checkpoint

    final = latest_checkpoint(run_dir / "checkpoints")
    states = {p: json.loads((p / TRAIN_STATE).read_text()) for p in (run_dir / "checkpoints").glob("iter_*")}
    clm_end = next(p for p, s in states.items() if s.get("keep") and s.get("phase_name") == "clm")
    exports = {}
    for label, checkpoint in (("CLM25", clm_end), ("CLM25→MLM75", final)):
        target = out / "hf" / checkpoint.name
        exports[label] = export_checkpoint(checkpoint, target) if not target.exists() else target
        print(f"      {label}: {exports[label]}")

    if args.skip_eval:
        print(f"done in {time.time() - started:.0f} s")
        return 0
    print("[4/4] fine-tuning both on the embedded smoke tasks (1 LR × 1 seed, CPU-sized)")
    from mlmclm.eval.compare import RunInputs, compare_runs
    from mlmclm.eval.smoke import run_smoke_evaluation

    summaries = {}
    for label, directory in exports.items():
        summaries[label] = run_smoke_evaluation({label: directory}, out / "eval" / directory.name, lrs=(5e-4,),
                                                seeds=(0,), progress=False)
    print()
    for label, summary in summaries.items():
        print(f"--- {label} ({summary})")
        print(summary.read_text())
    table = compare_runs([RunInputs(label="CLM25→MLM75", log_dir=run_dir / "tensorboard",
                                    eval_dir=summaries["CLM25→MLM75"].parent),
                          RunInputs(label="CLM25", eval_dir=summaries["CLM25"].parent)], out / "compare")
    print(f"comparison: {table} (plots beside it)")
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
