"""`tiny_phase_plan`, the CPU twin of the beyond-the-paper phase plan, through NeMo-Run's LocalExecutor (2 torchrun
CPU processes): CLM, MLM with a falling mask rate, a long-context MLM phase on its own 256-token rows with RoPE θ
raised; its HF export carries the raised θ and context and passes --verify at 256 tokens."""
import json

from mlmclm.train import checkpoint as ckpt


def test_the_tiny_phase_plan_trains_each_phase_as_planned_and_exports_at_its_long_length(nemo_home, tmp_path, capsys):
    from recipes.__main__ import main
    from tools.convert_to_hf import main as export

    data, run_dir = tmp_path / "data", tmp_path / "run"
    assert main(["tiny_phase_plan", "steps=10", f"data_path={data}", f"run_dir={run_dir}", "--prepare-data",
                 "executor.gpus=false"]) == 0
    assert json.loads((tmp_path / "data_long" / "manifest.json").read_text())["seq_length"] == 256
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plan = [(r["phase"], r.get("train/mask_ratio") and round(r["train/mask_ratio"], 6), r["train/rope_theta"],
             r["train/context_length"]) for r in rows]
    # 10 steps: CLM 5, MLM 3 (30 % → 15 %), the long phase 2
    assert plan == [("clm", None, 10_000.0, 128)] * 5 + [("mlm", 0.3, 10_000.0, 128), ("mlm", 0.225, 10_000.0, 128),
                                                         ("mlm", 0.15, 10_000.0, 128)] \
        + [("mlm_long", 0.15, 40_000.0, 256)] * 2
    assert rows[-1]["train/tokens"] == 8 * (8 * 128 + 2 * 256)
    state = ckpt.read_json(run_dir / "checkpoints" / "iter_0000010", ckpt.TRAIN_STATE)
    assert [s["consumed_samples"] for s in state["loaders"]] == [8 * 8, 8 * 2]

    capsys.readouterr()
    assert export([str(run_dir), str(tmp_path / "hf"), "--verify", "--verify-length", "256"]) == 0
    assert "verify: max |logits HF - ours|" in capsys.readouterr().out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == 40_000.0 and config["max_position_embeddings"] == 256
