"""The GPU session labels what ran, never what was planned (issue 55): a speed row's attention is read off the
model that was built — a TE build that fell back to megatron's local layers says "local" — and the session's
trainer refuses local layers on packed rows too long for their mask, as pretrain does (the 4,096-token guard lives
in `build_model` now, so every builder has it)."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mlmclm.model.build import attention_path  # noqa: E402
from mlmclm.parallel.launch import spawn  # noqa: E402


class _Chunk:
    def __init__(self, te: bool, packed: bool):
        self.uses_transformer_engine, self.packed_segments = te, packed


def test_the_attention_label_is_what_the_model_runs():
    assert attention_path([_Chunk(te=True, packed=True)]) == "TE THD"
    assert attention_path([_Chunk(te=True, packed=False)]) == "TE padded"
    assert attention_path([_Chunk(te=False, packed=True)]) == "local"  # a fallback is never called TE
    assert attention_path([_Chunk(te=False, packed=False)]) == "local"


def test_fp8_ratios_pair_rows_that_ran_the_same_attention():
    from gpu_speed import SpeedRow, ratios

    fp8 = SpeedRow("m", "tensorwise", "mlm", "random-length samples", "12", 2048, status="ok", attention="TE THD",
                   tokens_per_s=300.0)
    bf16 = [{"model": "m", "objective": "mlm", "layout": "random-length samples", "attention": "local",
             "status": "ok", "tokens_per_s": 100.0}]
    assert ratios([fp8], bf16) == []  # a local-layer bf16 row is no baseline for a TE row
    bf16[0]["attention"] = "TE THD"
    assert ratios([fp8], bf16)[0]["fp8_over_bf16"] == 3.0


def _build(out_path):
    import gpu_sections
    from gpu_trainer import Trainer, precision_for

    gpu_sections._parallel()
    result = {}
    trainer = Trainer("tiny-test", precision_for("fp32"), 1, max_row_tokens=96)
    result["attention"] = trainer.attention
    trainer.close()
    try:
        Trainer("tiny-test", precision_for("fp32"), 1, max_row_tokens=24_576)
        result["refused"] = None
    except ValueError as err:
        result["refused"] = str(err)
    Path(out_path).write_text(json.dumps(result))


def test_the_sessions_trainer_refuses_local_layers_on_rows_too_long_for_their_mask(tmp_path):
    spawn(_build, 1, str(tmp_path / "out.json"))
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["attention"] == "local"  # CPU: megatron's local layers, packed segments as a mask
    assert "24576 x 24576 mask" in result["refused"] and "transformer-engine" in result["refused"]
