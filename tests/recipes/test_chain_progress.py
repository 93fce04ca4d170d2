"""A local sweep's line per job (recipes/chain_progress.py): which job starts, how the one before it ended and after
how long, the jobs skipped after a failure, and the total at the end."""
import io

from recipes.chain_progress import ChainProgress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_launch_says_how_the_job_before_it_ended_and_the_end_counts_the_jobs():
    clock, console = Clock(), io.StringIO()
    progress = ChainProgress(["run-a", "export-run-a", "eval-run-a", "report"], console, clock=clock)
    progress.launching("run-a", skipped=False)
    clock.now += 75
    progress.launching("export-run-a", skipped=False, previous_succeeded=True)
    clock.now += 9
    progress.launching("eval-run-a", skipped=False, previous_succeeded=False)
    clock.now += 3
    progress.launching("report", skipped=True, previous_succeeded=False)
    progress.finished()
    assert console.getvalue().splitlines() == [
        "sweep: [1/4] run-a starting (0 s in all)",
        "sweep: run-a ended after 1 min 15 s; [2/4] export-run-a starting (1 min 15 s in all)",
        "sweep: export-run-a failed after 9 s; [3/4] eval-run-a starting (1 min 24 s in all)",
        "sweep: eval-run-a failed after 3 s; [4/4] report skipped: a job before it did not succeed (1 min 27 s in all)",
        "sweep: 3 of 4 jobs ran (1 skipped) in 1 min 27 s",
    ]


def test_the_last_jobs_outcome_is_said_at_the_end():
    clock, console = Clock(), io.StringIO()
    progress = ChainProgress(["run-a"], console, clock=clock)
    progress.launching("run-a", skipped=False)
    clock.now += 5
    progress.finished(last_succeeded=False)
    assert console.getvalue().splitlines()[-1] == "sweep: run-a failed after 5 s; 1 of 1 jobs ran in 5 s"
