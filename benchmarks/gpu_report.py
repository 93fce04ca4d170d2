"""The GPU session's findings as text, from the sections' JSON files (stdlib only: `gpu_session.py finish` prints it
even when nothing else can run). A section that did not write its file is said to be missing."""
from __future__ import annotations

import json
from pathlib import Path


def _load(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _speed(data: dict) -> list[str]:
    result = data["result"]
    lines = [f"  peak TFLOP/s {_num(result.get('peak_tflops'), '.4g')} ({result.get('peak_source')})"]
    if result.get("skipped"):
        lines.append(f"  skipped: {result['skipped']}")
    for r in result.get("rows", []):
        syncs = r.get("host_syncs_per_step")
        lines.append(f"  {r['model']:<32}{r['precision']:<11}{r['objective']:<4} {r['layout']:<22}"
                     f"attention {str(r.get('attention')):<10}"
                     f"{_num(r['tokens_per_s'], ',.0f'):>10} tok/s"
                     f"  MFU {_num(r['mfu'] and 100 * r['mfu'], '.1f'):>5}%"
                     f"  {_num(r['peak_memory_gib'], '.1f'):>6} GiB  syncs {syncs if syncs is not None else '-'}"
                     f"  FP8 attn {r.get('fp8_attention')}  wgrad {r.get('wgrad')}  built ahead "
                     f"{r.get('built_ahead')}  {r['status']}{': ' + r['reason'] if r['reason'] else ''}")
    for ratio in result.get("fp8_over_bf16", []):
        lines.append(f"  {ratio['precision']}/bf16 {ratio['model']} {ratio['objective']}: {ratio['fp8_over_bf16']:.2f}x")
    return lines


def _memory(data: dict) -> list[str]:
    result = data["result"]
    lines = [f"  {result.get('model')} CLM, {result.get('samples')} samples, {result.get('tokens')} tokens, "
             f"attention {result.get('attention')}"
             + (f": {result['error']}" if result.get("error") else "")
             + (f": refused: {result['refused']}" if result.get("refused") else "")]
    for head, f in result.get("heads", {}).items():
        lines.append(f"  {head} head: measured {_num(f.get('measured_gib'), '.1f')} GiB, estimated "
                     f"{_num(f.get('estimated_gib'), '.1f')} GiB -> {f.get('status')}")
    return lines


def _determinism(data: dict) -> list[str]:
    result = data["result"]
    lines = []
    for name in ("same_seed", "stop_and_resume"):
        r = result.get(name)
        if r:
            verdict = "bit-identical" if r["bit_identical"] else f"differs from step {r['first_differing_step']}"
            lines.append(f"  {name}: {verdict} (max |loss diff| {r['max_abs_loss_diff']:.3g}, {r['steps']} steps)")
    return lines + [f"  passed: {result.get('passed')} {result.get('error') or ''}"]


def _verdict(check: dict) -> str:
    if check["ok"] is None:
        return "NOT REACHED" if check.get("not_reached") else "SKIP"
    return "PASS" if check["ok"] else "FAIL"


def _checks(data: dict) -> list[str]:
    return [f"  [{_verdict(c)}] {c['check']}" + (f": {c.get('skipped') or c.get('not_reached')}"
                                                  if c.get("skipped") or c.get("not_reached") else "")
            for c in data["result"].get("checks", [])]


def _finetune(part: dict) -> list[str]:
    """The evaluation's fine-tuning against transformers' Trainer (gpu_finetune.py)."""
    if not part:
        return ["  fine-tuning vs Trainer: not run"]
    speeds = part.get("steps_per_s", {})
    ratio = part.get("ours_over_trainer")
    lines = [f"  fine-tuning ({part.get('config', {}).get('model')}, bf16, 8 x 4 rows a step): ours "
             f"{_num(speeds.get('ours'), '.2f')} steps/s, Trainer {_num(speeds.get('Trainer'), '.2f')} steps/s, "
             f"ours / Trainer {_num(ratio, '.2f')}x (goal >= 1.0x); Trainer: {part.get('trainer')}"]
    runs = part.get("runs_per_hour", {})
    if runs:
        lines.append(f"  runs per hour at EncodEval's {runs['steps_per_run']} steps: {runs['ours']:.1f} "
                     f"({runs['note']}); host syncs per run: {part.get('host_syncs_per_run')}")
    if part.get("not_reached") or part.get("error"):
        lines.append(f"  fine-tuning: {part.get('not_reached') or part.get('error')}")
    return lines


def _features(data: dict) -> list[str]:
    result = data["result"]
    agreement = result.get("bf16_vs_fp32", {})
    verdict = ("PASS" if agreement.get("passed") else "NOT REACHED: " + agreement["not_reached"]
               if agreement.get("not_reached") else "FAIL " + str(agreement.get("error") or ""))
    lines = [f"  bf16 vs fp32: max relative loss difference {_num(agreement.get('max_rel_diff'), '.4f')} -> "
             f"{verdict}"]
    lines = _finetune(result.get("finetune", {})) + lines
    table = result.get("features", {})
    for row in table.get("rows", []):
        lines.append(f"  {row['variant']:<30}{row['tokens_per_s']:>10,.0f} tok/s  defaults {row['defaults_speedup']:.2f}x")
    if table.get("skipped") or table.get("error"):
        lines.append(f"  feature table: {table.get('skipped') or table.get('error')}")
    return lines


def _environment(data: dict) -> list[str]:
    r = data["result"]
    return [f"  torch {r.get('torch')} CUDA {r.get('cuda')} cuDNN {r.get('cudnn')} TE {r.get('transformer_engine')} "
            f"megatron-core {r.get('megatron_core')} device {r.get('device', {}).get('name')}",
            f"  layer spec {r.get('layer_spec')} ({r.get('layer_spec_reason')})", f"  {r.get('fused_kernels')}",
            f"  TE smoke: {r.get('te_smoke')}", f"  FP8 recipes (None = runs): {r.get('fp8_recipes')}"]


FORMATS = {"environment": _environment, "speed_bf16": _speed, "speed_fp8": _speed, "memory": _memory,
           "determinism": _determinism, "train_check": _checks, "features": _features}


def report(out: Path) -> str:
    lines = []
    for name, format_section in FORMATS.items():
        data = _load(out, name)
        if data is None:
            lines.append(f"{name}: no file (did not run or did not finish)")
            continue
        lines.append(f"{name}: {data['status']} in {data.get('seconds')} s ({data.get('mode') or data['result'].get('mode')})")
        try:
            lines += format_section(data)
        except (KeyError, TypeError) as err:  # a partial file: show what is there
            lines.append(f"  (incomplete: {type(err).__name__} {err})")
        if data["result"].get("error"):
            lines.append(f"  error: {data['result']['error']}")
        if data["result"].get("not_reached"):
            lines.append(f"  not reached: {data['result']['not_reached']}")
    return "\n".join(lines)
