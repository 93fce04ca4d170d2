"""tools/test_ids.py: an old id not collected now is named, with the account of where its assertions went."""
from pathlib import Path

from tools import test_ids

ROOT = Path(__file__).resolve().parents[2]
IDS = ROOT / "docs" / "test_ids"


def test_a_missing_id_is_named_and_fails_unless_accounted_for():
    old = ["t.py::a", "t.py::b", "t.py::c[1]"]
    new = ["t.py::a", "t.py::b_renamed"]
    lines, ok = test_ids.missing(old, new, {})
    assert not ok and lines == ["MISSING, not accounted for: t.py::b", "MISSING, not accounted for: t.py::c[1]"]
    accounts = {"t.py::b": test_ids.Account("t.py::b", ("t.py::b_renamed",), "abc123", "renamed"),
                "t.py::c[1]": test_ids.Account("t.py::c[1]", ("t.py::c_merged",), "def456", "merged")}
    lines, ok = test_ids.missing(old, new, accounts)
    assert not ok  # c's account names a test that is not collected either
    assert "t.py::b_renamed (abc123: renamed)" in lines[0] and "but not collected now: t.py::c_merged" in lines[1]
    lines, ok = test_ids.missing(old, new + ["t.py::c_merged"], accounts)
    assert ok and len(lines) == 2


def test_a_listing_gives_ids_only():
    listing = ("tests/x.py::test_a[p-1]\ntests/x.py::test_b\n\n=== warnings summary ===\n"
               "  /venv/lib/m.py:1: DeprecationWarning: x::y\n2 tests collected in 1.0s\n")
    assert test_ids.parse(listing) == ["tests/x.py::test_a[p-1]", "tests/x.py::test_b"]


def test_every_id_of_5708c97_is_in_the_stored_list_after_or_accounted_for():
    """The stored lists (tools/test_ids.py collect writes the second); `missing` without NEW checks this tree."""
    old, new = (test_ids.parse((IDS / name).read_text()) for name in ("5708c97.txt", "after.txt"))
    lines, ok = test_ids.missing(old, new, test_ids.read_accounts())
    assert ok, "\n".join(lines)
