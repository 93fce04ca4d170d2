"""Process groups started again and again in the same spawned processes, as the training tests do: each group
rendezvous on a port of its own, and a rank that finishes first cannot reach the previous group's store."""
import json
import os
import time

import torch
import torch.distributed as dist

from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

GROUPS = 3


def _start_groups(report_dir):
    ports, sums = [], []
    for group in range(GROUPS):
        init_parallel(ParallelConfig(), timeout_minutes=1)  # on failure: an error within a minute, not a hang
        ports.append(int(os.environ["MASTER_PORT"]))
        value = torch.tensor([float(dist.get_rank() + 1 + 10 * group)])
        dist.all_reduce(value)
        sums.append(value.item())
        if dist.get_rank() == 0:
            time.sleep(1.0)  # rank 1 is done with this group long before rank 0 tears it down
        destroy_parallel()
    with open(os.path.join(report_dir, f"rank{os.environ['RANK']}.json"), "w") as out:
        json.dump({"ports": ports, "sums": sums}, out)


def test_each_group_rendezvous_on_a_port_of_its_own(tmp_path):
    spawn(_start_groups, 2, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["ports"] == reports[1]["ports"], "the ranks met on different ports"
    assert len(set(reports[0]["ports"])) == GROUPS, reports[0]["ports"]
    for report in reports:
        assert report["sums"] == [3.0 + 20 * group for group in range(GROUPS)]
