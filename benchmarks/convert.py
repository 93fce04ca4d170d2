"""Benchmark the converters: peak RSS and time against the checkpoint's size in bytes.

  python benchmarks/convert.py                         # eurobert-610m shape, fp32 (CPU), in a temp dir
  python benchmarks/convert.py --shape tiny --keep out/bench_convert

1. creates a randomly initialised checkpoint of the shape (model weights only, like convert_from_hf writes;
   a training checkpoint adds ~3x that in optimizer state, which the exporter never reads),
2. exports it to HF in a fresh process (peak RSS = that process's ru_maxrss, imports included),
3. imports the HF directory back to a TP=1 checkpoint in a fresh process (peak RSS of the writer rank).
Goal: export peak RSS <= 1.3x checkpoint bytes.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _make_checkpoint(shape: str, iter_dir: str) -> None:
    """Spawned on 1 rank: a random model of `shape`, saved as a model-only dist checkpoint."""
    import torch.distributed as dist

    from mlmclm.model import build_model, preset
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train import checkpoint as ckpt

    init_parallel(ParallelConfig(), seed=0)
    try:
        model = preset(shape)
        chunks = build_model(model, ParallelConfig(), PrecisionConfig(dtype="fp32"), use_te=False)
        ckpt.save_sharded(ckpt.model_sharded_state_dict(chunks), iter_dir)
        dist.barrier()
        run_config = {"model": model.to_dict(), "data": {"tokenizer": "embedded"}, "run_dir": "benchmark",
                      "phases": [{"name": "mlm", "objective": {"kind": "mlm"}, "steps": 1}], "total_steps": 1}
        Path(iter_dir, ckpt.RUN_CONFIG).write_text(json.dumps(run_config))
        Path(iter_dir, ckpt.TRAIN_STATE).write_text(json.dumps({"iteration": 0, "consumed_tokens": 0,
                                                                "layout": {"tp": 1, "pp": 1, "dp": 1}}))
        Path(iter_dir).parent.joinpath(ckpt.LATEST_FILE).write_text("0")
    finally:
        destroy_parallel()


def _peak_rss_bytes(who=resource.RUSAGE_SELF) -> int:
    return resource.getrusage(who).ru_maxrss * 1024  # Linux reports KiB


def _child(mode: str, src: str, dst: str) -> None:
    """Runs in a fresh interpreter; prints one JSON line with its peak RSS and time."""
    import warnings

    warnings.filterwarnings("ignore")
    if mode == "export":
        from mlmclm.convert.to_hf import ExportConfig, convert_to_hf

        baseline = _peak_rss_bytes()
        start = time.time()
        summary = convert_to_hf(ExportConfig(src, dst, progress=False))
        print(json.dumps({"seconds": time.time() - start, "peak_rss": _peak_rss_bytes(), "import_rss": baseline,
                          "output_bytes": summary.output_bytes, "parameters": summary.num_parameters}))
    else:
        from mlmclm.convert.from_hf import ImportConfig, convert_from_hf

        start = time.time()
        summary = convert_from_hf(ImportConfig(src, dst, progress=False))
        print(json.dumps({"seconds": time.time() - start, "peak_rss": _peak_rss_bytes(),
                          "worker_peak_rss": _peak_rss_bytes(resource.RUSAGE_CHILDREN),
                          "output_bytes": summary.output_bytes}))


def _run_child(mode: str, src: Path, dst: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, f"--_{mode}", str(src), str(dst)], capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="eurobert-610m", help="model preset (default eurobert-610m)")
    p.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temp dir, removed)")
    p.add_argument("--skip-import", action="store_true", help="measure the export only")
    p.add_argument("--_export", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--_import", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._export or args._import:
        _child("export" if args._export else "import", *(args._export or args._import))
        return
    from mlmclm.convert.output import dir_size
    from mlmclm.parallel.launch import spawn

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_convert_"))
    try:
        iter_dir = work / "run" / "checkpoints" / "iter_0000000"
        if not iter_dir.exists():
            iter_dir.mkdir(parents=True)
            start = time.time()
            spawn(_make_checkpoint, 1, args.shape, str(iter_dir))
            print(f"created {args.shape} checkpoint in {time.time() - start:.0f} s")
        ckpt_bytes = dir_size(iter_dir)
        shutil.rmtree(work / "hf", ignore_errors=True)
        exp = _run_child("export", work / "run", work / "hf")
        report = {"shape": args.shape, "checkpoint_bytes": ckpt_bytes, "export": exp,
                  "export_rss_ratio": exp["peak_rss"] / ckpt_bytes}
        print(f"checkpoint: {ckpt_bytes / 2**30:.2f} GiB ({exp['parameters']:,} parameters, fp32)")
        print(f"export : {exp['seconds']:.0f} s, peak RSS {exp['peak_rss'] / 2**30:.2f} GiB "
              f"= {report['export_rss_ratio']:.2f}x checkpoint bytes (imports alone {exp['import_rss'] / 2**30:.2f}"
              f" GiB; goal <= 1.30x)")
        if not args.skip_import:
            shutil.rmtree(work / "back", ignore_errors=True)
            imp = _run_child("import", work / "hf", work / "back")
            report["import"] = imp
            print(f"import : {imp['seconds']:.0f} s, peak RSS main {imp['peak_rss'] / 2**30:.2f} GiB, writer rank "
                  f"{imp['worker_peak_rss'] / 2**30:.2f} GiB = {imp['worker_peak_rss'] / ckpt_bytes:.2f}x "
                  f"checkpoint bytes")
        print(json.dumps(report))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
