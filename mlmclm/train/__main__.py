"""torchrun entry: `torchrun --nproc-per-node N -m mlmclm.train CONFIG.{yaml,json} [key=value ...]`."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

from mlmclm import quiet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlmclm.train", description=__doc__)
    parser.add_argument("config", help="training config file (YAML or JSON)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optimizer.lr=3e-4")
    args = parser.parse_args(argv)
    quiet.install(children=False)  # the TE/apex/CUDA-absent warnings, filtered as in every other entry point
    warnings.filterwarnings("ignore", message=".*(deprecated|experimental).*")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from mlmclm.redact import install_log_redaction, redact

    install_log_redaction()   # a data location's credentials never reach the logs (the run uses them)
    from mlmclm.train.config import TrainConfig
    from mlmclm.train.pretrain import pretrain

    try:
        cfg = TrainConfig.from_file(args.config, args.overrides)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(redact(f"error: invalid training config: {err}"), file=sys.stderr)
        return 2
    from mlmclm.train.refusals import REFUSED_EXIT_CODE, is_refusal, report_failure

    try:
        result = pretrain(cfg)
    except Exception as err:  # bad input, an incompatible resume, a busy folder: the message alone
        if not is_refusal(err):  # a failure: its traceback, credentials masked
            return report_failure(err)
        print(redact(f"error: {err}"), file=sys.stderr)
        return REFUSED_EXIT_CODE
    import os

    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(result.__dict__, indent=1))
    # 75 (EX_TEMPFAIL) after a preemption save, so Slurm requeue / `afterok` dependencies see "not finished";
    # `python -m mlmclm.parallel.torchrun` carries it through the agent.
    from mlmclm.parallel.torchrun import PREEMPTED_EXIT_CODE

    return PREEMPTED_EXIT_CODE if result.status == "preempted" else 0


if __name__ == "__main__":
    sys.exit(main())
