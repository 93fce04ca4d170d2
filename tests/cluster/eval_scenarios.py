"""The evaluation's Slurm scenarios (started with the others by slurm_scenarios.launch_all): the smoke grid of a tiny
random EuroBERT through `python -m recipes eval` — on the local executor (the reference), as a Slurm job array of 2
tasks sharing one output folder with one task requeued (`scontrol requeue`) once it has records on disk and the grid
is not finished, and with a model folder that is not a model (a refusal: FAILED, not requeued)."""
import subprocess
import threading
from pathlib import Path

from cluster.slurm_jobs import job_state
from slurm_helpers import SLURM_ARGS, submitted_jobs, submitted_line, wait_until

# 4 smoke tasks × 1 LR × 3 seeds = 12 units of 10 steps: long enough to requeue a task with some records written
# and some not, short on the suite's 2 cores
GRID = ["--smoke", "--seeds", "0", "1", "2", "--max-steps", "10"]
UNITS = 12


def records(output: Path) -> list[Path]:
    return sorted((output / "runs").glob("*/*/*.json"))


def eval_launches(shared: Path, out: dict) -> dict[str, list[str]]:
    """The three launches; `out` gets their folders."""
    from tests.eval.eval_fixtures import save_tiny_model

    model = save_tiny_model(shared / "tiny_hf")
    not_a_model = shared / "not_a_model"
    not_a_model.mkdir()
    (not_a_model / "notes.txt").write_text("a folder, but no model in it\n")
    out["eval_dirs"] = {name: shared / f"eval-{name}" for name in ("local", "array", "refused")}
    out["not_a_model"] = not_a_model
    dirs = out["eval_dirs"]
    slurm = [*SLURM_ARGS, "executor.cpus_per_task=1"]
    return {
        "eval_local": ["eval", "--model", f"tiny={model}", *GRID, "--output", str(dirs["local"]), "executor.gpus=false"],
        "eval_array": ["eval", "--model", f"tiny={model}", *GRID, "--output", str(dirs["array"]), "--array-tasks", "2",
                       *slurm],
        "eval_refused": ["eval", "--model", f"broken={not_a_model}", *GRID, "--output", str(dirs["refused"]), *slurm,
                         "executor.max_requeues=1"],
    }


def requeue_mid_way(console: Path, output: Path, facts: dict) -> None:
    """Once the array's first records are written and the grid is not finished, requeue a running task."""
    submitted = wait_until(lambda: submitted_line(console.read_text()), 300, "the eval array is submitted")
    array = submitted_jobs(submitted)["eval"]
    facts["array"] = array

    def running_mid_way():
        done = len(records(output))
        running = [t for t in job_state(array).tasks if t.state == "RUNNING"]
        return 0 < done < UNITS and running and (running[0], done)

    task, done = wait_until(running_mid_way, 400, "the array has written some of its records", poll=0.2)
    subprocess.run(["scontrol", "requeue", f"{array}_{task.array_task}"], check=True)
    facts.update(requeued_task=task.array_task, requeued_job=task.job_id, records_at_requeue=done)
    wait_until(lambda: any(t.array_task == task.array_task and t.restarts >= 1 for t in job_state(array).tasks),
               120, "the requeued task is pending again")


def in_background(function, *args) -> threading.Thread:
    """`function(*args)` in a thread (the training scenario's preemptions block the main one); its exception is
    kept on the thread and raised by `joined`."""
    def target():
        try:
            function(*args)
        except BaseException as err:  # noqa: BLE001  raised again in the main thread
            thread.error = err

    thread = threading.Thread(target=target, daemon=True)
    thread.error = None
    thread.start()
    return thread


def joined(thread: threading.Thread, timeout: float) -> None:
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"the eval scenario's driver still running after {timeout:.0f} s")
    if thread.error is not None:
        raise thread.error
