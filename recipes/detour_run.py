"""One command for the CLM detour and its control (recipes/detour.py): import, both runs, both exports, the table.

  python -m recipes.detour_run tiny --root runs/detour                        # CPU twin: tiny ModernBERT, demo corpus
  python -m recipes.detour_run tiny --root runs/detour_mine --text notes/*.txt # the twin on your own text
  python -m recipes.detour_run modernbert --source answerdotai/ModernBERT-base --data-path /data/bio-modernbert \\
      --root /checkpoints/detour-bio tokens=10000000000                       # as published: one 4-GPU node
  python -m recipes.detour_run report --root runs/detour                      # the table again

`modernbert` takes any ModernBertForMaskedLM (ModernBERT, ModernCamemBERT, base or large); `eurobert` the same
published settings on a EuroBERT. `key=value` sets a parameter of the builder (`tokens=`, `decay_share=`, `lr=`,
`seed=`, ...; the twin: `steps=`, ...). The
tasks run through NeMo-Run's local executor, one after the other; finished steps are not run again. Slurm
submission of the family is not implemented (the import task measures step 0 where it runs)."""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import nemo_run as run

from mlmclm.config_io import parse_value
from recipes import detour
from recipes.base import validate
from recipes.detour_report import write_report
from recipes.launch import launch
from recipes.parameter_types import check_parameter_types

PLAN_FILE = "detour_plan.json"


def prepare_twin_data(root: Path, texts: list[str] | None, source: Path) -> Path:
    """The twin's domain data: the demo corpus (every 8th work held out, as the demo does), or the user's text files
    tokenized with the source's tokenizer (every 8th document held out); reused when prepared."""
    from recipes.demo import VALIDATION_EVERY
    from recipes.tiny import prepare_tiny_data

    path = root / "data"
    if (path / "manifest.json").exists():
        return path
    if not texts:
        return prepare_tiny_data(str(path), max_tokens=60_000, validation_every=VALIDATION_EVERY)
    from mlmclm.data.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=texts, output_dir=str(path), tokenizer=str(source), seq_length=128,
                          progress=False, validation_every=VALIDATION_EVERY))
    return path


def _builder_params(builder, items: list[str]) -> dict:
    known = inspect.signature(builder).parameters
    params = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in known or key in ("source", "data_path", "root"):
            raise ValueError(f"{item!r}: expected key=value with key one of "
                             f"{sorted(k for k in known if k not in ('source', 'data_path', 'root'))}")
        params[key] = parse_value(raw)
    check_parameter_types(f"detour ({builder.__name__})", builder, params)
    return params


def import_task(plan: detour.DetourPlan) -> run.Partial:
    return run.Partial(detour.import_and_measure, source=plan.source, imported=str(plan.imported),
                       config_json=json.dumps(validate(plan.control).to_dict()), out=str(plan.step0_file),
                       processes=plan.processes)


def plain_local_executor() -> run.LocalExecutor:
    """One process (no torchrun: the import spawns its own ranks), with this interpreter's environment on PATH."""
    import os

    return run.LocalExecutor(env_vars={"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                       "TOKENIZERS_PARALLELISM": "false"})


def run_plan(plan: detour.DetourPlan, export: bool = True) -> str:
    """Import (and step 0) as a NeMo-Run task, then the two runs (recipes.launch), then the exports and the table."""
    plan.root.mkdir(parents=True, exist_ok=True)
    (plan.root / PLAN_FILE).write_text(json.dumps({"source": plan.source, "phase1_steps": plan.phase1_steps,
                                                   "total_steps": plan.detour.config.total_steps}, indent=2) + "\n")
    if not plan.step0_file.exists():
        with run.Experiment("detour-import", log_level="WARN", skip_status_at_exit=True,
                            enable_goodbye_message=False) as exp:
            exp.add(import_task(plan), executor=plain_local_executor(), name="import")
            exp.run(tail_logs=False)
        status = exp.status(return_dict=True)  # the block's exit waited for the task
        if str(status["import"]["status"]) != "SUCCEEDED" or not plan.step0_file.exists():
            raise RuntimeError(f"the import task did not succeed; its log is under {exp._exp_dir}")
    launch([("detour", plan.detour), ("control", plan.control)], "local", title="detour")
    lines = []
    if export:
        lines += [f"{name}: exported to {path}" for name, path in export_both(plan).items()]
    table = write_report(plan.root, plan.phase1_steps, plan.detour.config.total_steps)
    return table + "\n".join(lines) + f"\n(table in {plan.root / 'report.md'})"


def export_both(plan: detour.DetourPlan) -> dict[str, Path]:
    """Each run's final checkpoint as a native HF directory (ModernBertForMaskedLM or EuroBertForMaskedLM, the
    source's architecture) that sentence-transformers also loads (skipped when already there)."""
    from mlmclm.convert.to_hf import TOKENIZER_SUBDIR, ExportConfig, convert_to_hf
    from mlmclm.export.sentence_transformers import SentenceTransformerLayout
    from mlmclm.train import checkpoint as ckpt

    tokenizer = ckpt.resolve_checkpoint(plan.imported) / TOKENIZER_SUBDIR  # the source's, carried by the import
    out = {}
    for name, partial in (("detour", plan.detour), ("control", plan.control)):
        target = plan.root / "export" / name
        if not (target / "config.json").exists():
            convert_to_hf(ExportConfig(partial.config.run_dir, target, progress=False, tokenizer=str(tokenizer),
                                       sentence_transformers=SentenceTransformerLayout()))
        out[name] = target
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes detour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=("tiny", "modernbert", "eurobert", "report"))
    parser.add_argument("--root", type=Path, required=True, help="folder of the import, runs, exports and table")
    parser.add_argument("--source", help="HF ModernBERT or EuroBERT: hub name or local directory (tiny: default a "
                                         "new tiny ModernBERT)")
    parser.add_argument("--data-path", help="prepared domain data with a validation split (eurobert: required)")
    parser.add_argument("--text", nargs="+", help="tiny: your own text files as the domain (default: the demo's)")
    parser.add_argument("--no-export", action="store_true", help="skip the two exports")
    parser.add_argument("params", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)  # key=value may follow the options
    try:
        if args.family == "report":
            saved = json.loads((args.root / PLAN_FILE).read_text(encoding="utf-8"))
            print(write_report(args.root, saved["phase1_steps"], saved["total_steps"]), end="")
            return 0
        if args.family == "tiny":
            params = _builder_params(detour.tiny_detour, args.params)  # before any model or data is made
            source = Path(args.source) if args.source else detour.make_tiny_modernbert(args.root / "tiny_modernbert")
            data = Path(args.data_path) if args.data_path else prepare_twin_data(args.root, args.text, source)
            plan = detour.tiny_detour(str(source), str(data), str(args.root), **params)
        else:
            if not args.source or not args.data_path or args.text:
                raise ValueError(f"{args.family} needs --source and --data-path (prepared with tools/prepare_data.py "
                                 "--tokenizer SOURCE --seq-length 8192 --validation-every K); --text is for the "
                                 "tiny twin")
            plan = detour.detour_published(args.source, args.data_path, str(args.root),
                                           **_builder_params(detour.detour_published, args.params))
        print(run_plan(plan, export=not args.no_export))
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
