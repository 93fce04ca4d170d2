"""A training task as its ranks receive it (recipes/rank_task.py, recipes/rank.py): the built TrainConfig in the
task's script, read back the same; the rank's module imports nothing of NeMo-Run, even lazily; what is not a task
is refused by the rank in one line."""
import ast
import subprocess
import sys

import nemo_run as run
import pytest

from mlmclm.train.config import TrainConfig
from recipes import registry
from recipes.base import validate
from recipes.detour import export_run
from recipes.rank import MAX_TASK_BYTES, TaskDecodeError, decode_task, encode_task, task_of_script
from recipes.rank_task import as_launched, rank_script

from test_import_graph import PACKAGES, REPO, _import_graph, _module_name


def test_the_script_carries_the_built_config_and_the_world_it_was_sized_for(tmp_path):
    partial = registry.get("clm_mlm_610m").build(nodes=4, clm_share=0.5, total_steps=22_000,
                                                 run_dir="/checkpoints/with /nemo_run/in-it")
    script = rank_script(partial)
    assert script.inline.startswith("exec python -m recipes.rank <<'MLMCLM_TASK_END'\n")
    config, nodes, gpus_per_node = task_of_script(script.inline)
    assert (nodes, gpus_per_node) == (4, 8)
    assert TrainConfig.from_dict(config) == validate(partial)
    # NeMo-Run's bare-metal launch rewrites every "/nemo_run" in an inline script: none is left in it to rewrite
    assert config["run_dir"] == "/checkpoints/with /nemo_run/in-it" and "/nemo_run" not in script.inline
    # any training Partial is launched as its script; a task that is not training (the detour's import, an
    # export, an evaluation's script) goes to NeMo-Run as it was
    assert isinstance(as_launched(registry.get("tiny_clm").build()), run.Script)
    for other in (run.Partial(export_run, run_dir="/r", imported="/i", target="/t"), run.Script(inline="true")):
        assert as_launched(other) is other


@pytest.mark.parametrize("text, message", [
    pytest.param("not base64 at all!", "not base64 of a JSON task", id="text"),
    pytest.param(encode_task({}, 1, 1).replace("e", "?", 1), "not base64", id="a-character-off"),
    pytest.param("eyJhIjogMX0=", "not a training task", id="other-json"),  # {"a": 1}
    pytest.param(encode_task({"run_dir": "x"}, 0, 8), "positive integers", id="no-nodes"),
])
def test_what_is_not_a_task_is_refused_naming_why(text, message):
    with pytest.raises(TaskDecodeError, match=message):
        decode_task(text)
    with pytest.raises(TaskDecodeError, match="no task between"):
        task_of_script("exec python -m recipes.rank\n")


def test_the_rank_refuses_a_bad_or_oversized_task_in_one_line_before_importing_the_trainer():
    for stdin in (b"garbage", b"A" * (MAX_TASK_BYTES + 8)):
        proc = subprocess.run([sys.executable, "-m", "recipes.rank"], input=stdin, capture_output=True, cwd=REPO,
                              timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 1 and err.startswith("error: ") and err.count("\n") == 1, err
        assert ("not base64" if stdin == b"garbage" else "more than 1048576 bytes") in err, err


def test_the_ranks_module_and_everything_it_imports_import_no_nemo_run():
    """Statically, lazy in-function imports included: from recipes.rank through every project module it reaches
    (recipes.entry, the whole trainer; the import-graph test's graph), no import of NeMo-Run, fiddle or leptonai
    (3.3 CPU-s a rank, benchmarks/rank_startup.py)."""
    graph = _import_graph()
    seen, todo = set(), ["recipes.rank"]
    while todo:
        if (module := todo.pop()) not in seen:
            seen.add(module)
            todo += graph[module]
    paths = {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    third_party = set()
    for module in seen:
        for node in ast.walk(ast.parse(paths[module].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                third_party.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                third_party |= {a.name.split(".")[0] for a in node.names}
    assert {"recipes.entry", "mlmclm.train.pretrain", "mlmclm.train.config"} <= seen
    assert not third_party & {"nemo_run", "fiddle", "leptonai", "torchx"}, sorted(third_party - set(PACKAGES))
