from dataclasses import dataclass
from pathlib import Path

import pytest
from convert_fixtures import make_random_eurobert, make_tokenizer, save_training_checkpoint

from mlmclm.parallel.launch import spawn


@dataclass
class TrainedRun:
    run_dir: Path
    hf_source: Path  # the random HF model whose weights the checkpoint holds
    tokenizer: Path
    iteration: int


@pytest.fixture(scope="session")
def tp2pp2_run(tmp_path_factory) -> TrainedRun:
    """A training checkpoint (model + distributed optimizer) saved by 4 ranks at TP=2 × PP=2."""
    root = tmp_path_factory.mktemp("convert")
    tokenizer = make_tokenizer(root / "tokenizer")
    hf_source = make_random_eurobert(root / "hf_source")
    run_dir = root / "run"
    spawn(save_training_checkpoint, 4, str(hf_source), str(run_dir), str(tokenizer), 2, 2, 7)
    return TrainedRun(run_dir, hf_source, tokenizer, 7)
