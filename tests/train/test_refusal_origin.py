"""Which errors are refusals (mlmclm.train.refusals.is_refusal): a message mlmclm raised on purpose for bad input, not
any ValueError — one raised inside torch or the standard library is a failure whose traceback the user needs."""
import json

import pytest
import torch

from mlmclm.data.manifest import Manifest
from mlmclm.train.refusals import is_refusal


def _raised(call) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def test_our_own_value_errors_are_refusals(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    err = _raised(lambda: Manifest.load(tmp_path))
    assert isinstance(err, ValueError) and "cannot read dataset manifest" in str(err)
    assert is_refusal(err)


def test_value_errors_raised_inside_torch_or_the_standard_library_are_failures():
    from_torch = _raised(lambda: torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long)))
    from_json = _raised(lambda: json.loads("{"))
    assert isinstance(from_torch, ValueError) and isinstance(from_json, ValueError)
    assert not is_refusal(from_torch) and not is_refusal(from_json)
    assert not is_refusal(_raised(lambda: {}["iteration"]))  # not a refusal type at all


def test_a_failure_is_reported_with_its_traceback_and_no_credential():
    """What a failed rank prints in place of Python's own hook (recipes.entry, python -m mlmclm.train): the whole
    traceback, but a data location's secret masked, since the task's log is kept and shared."""
    import io

    from mlmclm.train.refusals import report_failure

    def read_shard():
        raise KeyError("https://alice:s3cr3t@data.example.org/shard-000001.tar")

    out = io.StringIO()
    code = report_failure(_raised(read_shard), out)
    printed = out.getvalue()
    assert code == 1
    assert printed.startswith("Traceback (most recent call last):") and "in read_shard" in printed, printed
    assert "KeyError: 'https://<redacted>@data.example.org/shard-000001.tar'" in printed, printed
    assert "s3cr3t" not in printed
