"""Model labels and task names become folders of the evaluation output (runs/<label>/<task>/...): a name from a
task file or the command line can never put a record outside --output."""
import pytest
from eval_fixtures import make_task_folder

from mlmclm.eval.finetune.protocol import ProtocolConfig, run_path
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskSpec, load_task_specs
from mlmclm.path_names import check_path_component

ESCAPES = ["..", ".", "", "a/../..", "..\\..", "nul\0"]


@pytest.mark.parametrize("name", ESCAPES)
def test_a_task_name_that_leaves_its_folder_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match=r"task name must be one plain name .* got "):
        TaskSpec(name=name, family="classification", path=str(tmp_path))


def test_a_label_and_a_task_named_dotdot_cannot_write_outside_the_output(tmp_path, tiny_model_dir):
    """On the old code, label '..' and task '..' put the record at output/../lr..._seed....json (outside)."""
    output = tmp_path / "out"
    with pytest.raises(ValueError, match=r"model label must be one plain name .* got '\.\.'"):
        run_path(output, "..", "sst2", 1e-4, 0)
    folder = make_task_folder(tmp_path / "task", "classification")
    spec = TaskSpec(name="fine", family="classification", path=str(folder), max_length=32)
    with pytest.raises(ValueError, match=r"model label must be one plain name .* got '\.\.'"):
        run_grid({"..": tiny_model_dir}, [spec], output, ProtocolConfig(learning_rates=(1e-4,), seeds=(0,),
                                                                         max_steps=1), progress=False)
    assert not any(tmp_path.glob("*.json")) and not output.exists()
    task_file = tmp_path / "tasks.json"
    task_file.write_text('[{"name": "..", "family": "classification", "path": "%s"}]' % folder)
    with pytest.raises(ValueError, match=r"task name must be one plain name"):
        load_task_specs(task_file)
    # a retrieval task's extra test sets are named too
    with pytest.raises(ValueError, match=r"task name must be one plain name .* got '\.\.'"):
        load_task(TaskSpec(name="r", family="retrieval", path=str(make_task_folder(tmp_path / "r", "retrieval")),
                           max_length=32, extra_tests={"..": {"path": str(tmp_path / "r")}}))


def test_ordinary_names_are_kept_as_they_are():
    for name in ("sst2", "MS MARCO", "CLM25→MLM75", "a.b-c_d", "..x"):
        assert check_path_component(name, "x") == name
