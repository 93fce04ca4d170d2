"""Partitioned data preparation as a NeMo-Run experiment: N `prepare` jobs (a Slurm array, or one after the other
locally), then the merge, which starts only when every part succeeded (Slurm `afterok` on the array).

    python -m recipes.data_prep output=/data/fineweb_edu_2048 tokenizer=EuroBERT/EuroBERT-210m seq_length=2048 \\
        dataset=HuggingFaceFW/fineweb-edu dataset_config=sample-100BT partitions=64 workers=15 \\
        --executor slurm executor.account=ACCT executor.partition=cpu --dryrun
    python -m recipes.data_prep output=data/demo_parts embedded=true seq_length=256 partitions=3   # local

`inputs=[...]` takes files/globs as `prepare_data --input` does. Paths are as the job sees them (on Slurm, in the
container: mount the data with executor.data_dir=... -> /data). Each job writes `OUTPUT/part-I-of-N/`; a
re-run of a job rewrites the same part, so a failed array element can simply be resubmitted.
"""
from __future__ import annotations

if __name__ == "__main__":  # run as a command: quiet before megatron's and torch's import-time warnings (an import
    from mlmclm import quiet  # of this module as a library leaves the warnings filters alone)

    quiet.install()

import logging
import os
import sys

import nemo_run as run

from mlmclm.config_io import parse_value

EXECUTORS = ("local", "slurm")


def prepare_part(partition: int | str, num_partitions: int, output: str, seq_length: int, tokenizer: str = "embedded",
                 inputs: list[str] | None = None, dataset: str | None = None, dataset_config: str | None = None,
                 split: str | None = None, streaming: bool = False, text_field: str = "text", embedded: bool = False,
                 workers: int = 8, group_docs: int = 100_000, samples_per_shard: int = 4096,
                 validation_every: int | None = None) -> dict:
    """One job: partition `partition` ("slurm": $SLURM_ARRAY_TASK_ID) of `num_partitions`."""
    from mlmclm.data.prepare import PrepareConfig, prepare, prepare_embedded_corpus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    index = int(os.environ["SLURM_ARRAY_TASK_ID"]) if partition == "slurm" else int(partition)
    common = dict(partition=index, num_partitions=num_partitions, workers=workers, group_docs=group_docs,
                  samples_per_shard=samples_per_shard, progress=False, validation_every=validation_every)
    if embedded:
        m = prepare_embedded_corpus(output, seq_length, **common)
    else:
        m = prepare(PrepareConfig(inputs=list(inputs or []), output_dir=output, tokenizer=tokenizer,
                                  seq_length=seq_length, text_field=text_field, dataset=dataset,
                                  dataset_config=dataset_config, split=split, streaming=streaming, **common))
    return {"location": m.location, "samples": m.num_samples, "documents": m.num_documents}


def merge_parts(output: str, verify: bool = True) -> dict:
    from mlmclm.data.partition import merge

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    m = merge(output, verify=verify)
    return {"location": m.location, "samples": m.num_samples, "tokens": m.num_tokens}


def data_prep(output: str, seq_length: int, partitions: int = 8, slurm_array: bool = False, verify: bool = True,
              **prepare_args) -> list[tuple[str, run.Partial]]:
    """The tasks: the N parts (one task with partition 'slurm' when run as a Slurm array), then the merge."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    common = dict(num_partitions=partitions, output=output, seq_length=seq_length, **prepare_args)
    if slurm_array:
        parts = [("prepare_parts", run.Partial(prepare_part, partition="slurm", **common))]
    else:
        parts = [(f"prepare_part_{i}", run.Partial(prepare_part, partition=i, **common)) for i in range(partitions)]
    return parts + [("merge_parts", run.Partial(merge_parts, output=output, verify=verify))]


def slurm_data_executor(partitions: int | None, workers: int, **options) -> run.SlurmExecutor:
    """CPU jobs in the mlmclm image: the training executor's settings (account, image, mounts, tunnel) on one
    node, without GPUs or torchrun; `partitions` makes it an array of that many jobs."""
    from cluster.executors import slurm_executor

    cpus = int(options.pop("cpus_per_task", workers + 1))
    executor = slurm_executor(nodes=1, gpus_per_node=1, cpus_per_task=cpus, exclusive=False, **options)
    executor.gpus_per_node = None
    executor.launcher = None
    executor.torchrun_nproc_per_node = None
    executor.exclusive = None
    executor.signal = None
    executor.srun_args = [f"--cpus-per-task={cpus}"]
    executor.array = f"0-{partitions - 1}" if partitions else None
    return executor


def launch(tasks: list[tuple[str, run.Partial]], executor: str = "local", executor_options: dict | None = None,
           workers: int = 8, title: str = "data_prep", dryrun: bool = False, detach: bool = False) -> run.Experiment:
    """Each task after the previous one; on Slurm the parts are one array job and the merge waits for all of it."""
    from recipes.launch import check_experiment_names

    check_experiment_names(title, [name for name, _ in tasks])
    with run.Experiment(title, log_level="WARN") as exp:
        previous = None
        for name, partial in tasks:
            if executor == "slurm":
                array = partial.partition == "slurm" if name != "merge_parts" else False
                count = partial.num_partitions if array else None
                ex = slurm_data_executor(count, workers if name != "merge_parts" else 1, **(executor_options or {}))
            elif executor == "local":
                ex = run.LocalExecutor()
            else:
                raise ValueError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
            previous = exp.add(partial, executor=ex, name=name, dependencies=[previous] if previous else None)
        if dryrun:
            exp.dryrun(log=True, delete_exp_dir=False)
        else:
            exp.run(detach=detach, tail_logs=False)
    return exp


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    params, executor_options, executor, dryrun = {}, {}, "local", False
    it = iter(argv)
    for item in it:
        if item == "--executor":
            executor = next(it, "")
        elif item == "--dryrun":
            dryrun = True
        elif item in ("-h", "--help"):
            print(__doc__)
            return 0
        elif "=" in item:
            key, raw = item.split("=", 1)
            (executor_options if key.startswith("executor.") else params)[key.removeprefix("executor.")] = \
                parse_value(raw)
        else:
            print(f"error: unexpected argument {item!r} (want key=value, --executor local|slurm, --dryrun)",
                  file=sys.stderr)
            return 2
    try:
        for required in ("output", "seq_length"):
            if required not in params:
                raise ValueError(f"{required}= is required")
        workers = int(params.get("workers", 8))
        tasks = data_prep(slurm_array=executor == "slurm", **params)
        launch(tasks, executor, executor_options, workers=workers, dryrun=dryrun)
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
