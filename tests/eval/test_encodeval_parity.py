"""`--suite paper` against the authors' EncodEval (hgissbkh/EncodEval, branch MLM_vs_CLM), one test per
difference issue 25 lists; each builds its fixtures locally (no hub access)."""
import json

from mlmclm.eval.training import default_max_length


def _config_only_model(folder, positions):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    return folder


def test_max_length_rounds_99_percent_of_the_positions(tmp_path):
    # EncodEval's abstract_eval.py: max_length = round(0.99 * max_position_embeddings)
    assert default_max_length(_config_only_model(tmp_path / "2048", 2048)) == 2028  # 2027.52, not cut to 2027
    assert default_max_length(_config_only_model(tmp_path / "512", 512)) == 507  # 506.88
    assert default_max_length(_config_only_model(tmp_path / "8192", 8192)) == 8110  # 8110.08
