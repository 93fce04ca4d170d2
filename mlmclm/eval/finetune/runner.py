"""One fine-tune-and-score run of any family."""
from __future__ import annotations

from pathlib import Path

from mlmclm.eval.finetune.classification import run_classification
from mlmclm.eval.finetune.qa import run_qa
from mlmclm.eval.finetune.retrieval import run_retrieval
from mlmclm.eval.finetune.task_spec import TaskData
from mlmclm.eval.finetune.token_classification import run_token_classification
from mlmclm.eval.finetune.training import FinetuneConfig, RunOutcome

_RUNNERS = {"classification": run_classification, "token_classification": run_token_classification,
            "qa": run_qa, "retrieval": run_retrieval}


def finetune_and_score(model_dir: Path, data: TaskData, config: FinetuneConfig,
                       eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    return _RUNNERS[data.spec.family](Path(model_dir), data, config, eval_splits)
