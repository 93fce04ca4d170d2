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
