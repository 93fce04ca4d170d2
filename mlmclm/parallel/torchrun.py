"""`python -m mlmclm.parallel.torchrun ARGS…`: torchrun that survives a preemption signal and reports it.

Plain torchrun, on SIGTERM/SIGUSR1, forwards the signal, waits `--shutdown-timeout` for the ranks and then exits
non-zero whatever they did; when a rank exits 75 after its preemption save, it tears the others down and exits 1.
Either way the caller (Slurm, NeMo-Run, a chain) cannot tell "preempted, checkpoint saved" from "broken". Here:
- SIGTERM/SIGUSR1 to the agent are forwarded to each rank's process group and the agent keeps waiting, so every
  rank finishes its step and the collective save, then exits 75;
- the exit code is 75 when the ranks stopped that way (a rank exited 75 and every other one exited 75 or was ended
  by the agent's teardown signal); 2 when they refused their input the same way (mlmclm.train.refusals: a rank
  exited 2, the rest 2 or ended by the agent), so a Slurm job does not requeue what would be refused again
  (cluster.executors.requeue_policy); torchrun's own code otherwise.
Arguments are torchrun's, unchanged.
"""
from __future__ import annotations

import os
import signal
import sys

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: saved and stopped early; run again to continue
REFUSED_EXIT_CODE = 2  # the trainer refused its input on purpose (mlmclm.train.refusals); running again refuses again
FORWARDED = (signal.SIGTERM, signal.SIGUSR1)
_ENDED_BY_AGENT = {-signal.SIGTERM, -signal.SIGKILL}


def stopped_with(code: int, exit_codes: list[int]) -> bool:
    """The ranks stopped with `code`: one exited with it, the rest with it or ended by the agent's teardown after."""
    return code in exit_codes and all(c == code or c in _ENDED_BY_AGENT for c in exit_codes)


def preempted(exit_codes: list[int]) -> bool:
    """The ranks stopped for a preemption: one exited 75, the rest 75 or ended by the agent after it."""
    return stopped_with(PREEMPTED_EXIT_CODE, exit_codes)


def _forward_to_ranks(signum, frame) -> None:
    import psutil

    for child in psutil.Process().children():
        try:  # torchrun starts each rank in its own session: signal its whole group, as torchrun itself would
            os.killpg(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv if argv is not None else sys.argv[1:])
    # torchrun must not turn these into its own shutdown (it installs handlers for the signals listed here).
    handled = [s for s in args.signals_to_handle.split(",") if s.strip() not in ("SIGTERM", "SIGUSR1")]
    args.signals_to_handle = ",".join(handled) or "SIGINT"
    for sig in FORWARDED:
        signal.signal(sig, _forward_to_ranks)
    try:
        run(args)
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        if preempted(codes):
            print(f"torchrun: ranks stopped after a preemption save (exit codes {sorted(set(codes))}); exiting "
                  f"{PREEMPTED_EXIT_CODE}", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        if stopped_with(REFUSED_EXIT_CODE, codes):  # each rank printed its refusal; the traceback would add nothing
            print(f"torchrun: the ranks refused their input (exit codes {sorted(set(codes))}); exiting "
                  f"{REFUSED_EXIT_CODE}", file=sys.stderr)
            return REFUSED_EXIT_CODE
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
