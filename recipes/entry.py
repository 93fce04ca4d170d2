"""The function every recipe's `run.Partial` targets: what NeMo-Run calls inside each torchrun process."""
from __future__ import annotations

import logging
import os
import sys
import warnings

from mlmclm.parallel.torchrun import PREEMPTED_EXIT_CODE
from mlmclm import quiet
from mlmclm.redact import install_log_redaction, redact
from mlmclm.train.config import TrainConfig
from mlmclm.train.save_errors import SAVE_FAILED_EXIT_CODE, CheckpointWriteError


def pretrain_entry(config: TrainConfig, nodes: int = 1, gpus_per_node: int = 1) -> dict:
    """Train `config` on the ranks torchrun started; `nodes × gpus_per_node` is the world the recipe was sized for.

    The recipe derived the micro batch from that world size, so a launch with another size is refused here
    rather than silently training with a different batch or layout.
    """
    expected = nodes * gpus_per_node
    actual = int(os.environ.get("WORLD_SIZE", "1"))
    if actual != expected:
        raise RuntimeError(
            f"this recipe was sized for {nodes} node(s) × {gpus_per_node} process(es) = {expected} ranks, but the "
            f"launcher started {actual}; rebuild the recipe with nodes=/gpus_per_node= matching the executor")
    quiet.install(children=False)
    warnings.filterwarnings("ignore", message=".*(deprecated|experimental).*")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    install_log_redaction()   # a data location's credentials never reach the task's log (the run uses them)
    if os.environ.get("RANK", "0") == "0" and (note := quiet.kernels_note()):
        logging.getLogger("recipes").warning(note)
    from mlmclm.train.pretrain import pretrain
    from mlmclm.train.refusals import REFUSAL_MARK, REFUSED_EXIT_CODE, is_refusal, report_failure

    log = logging.getLogger("recipes")
    try:
        result = pretrain(config)
    except CheckpointWriteError as err:  # said in full, without a traceback; run_status.json: save_failed
        log.error("%s", err)
        raise SystemExit(SAVE_FAILED_EXIT_CODE) from None
    except Exception as err:  # bad input, an incompatible resume: its message alone; run_status.json: refused
        if not is_refusal(err):  # a failure: its traceback, credentials masked, is the report (run_status: failed)
            raise SystemExit(report_failure(err)) from None
        print(redact(REFUSAL_MARK + str(err)), file=sys.stderr, flush=True)
        raise SystemExit(REFUSED_EXIT_CODE) from None
    if result.status == "preempted":
        # Non-zero on purpose: the Slurm job requeues itself and resumes, and a dependent (afterok) task of a
        # chain does not start from a half-finished run.
        log.warning("preempted at step %d; checkpoint saved in %s, a relaunch resumes", result.steps, config.run_dir)
        raise SystemExit(PREEMPTED_EXIT_CODE)
    if os.environ.get("RANK", "0") == "0":
        log.info("run finished: %s", result)
    return result.__dict__
