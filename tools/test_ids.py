"""The suite's test ids before and after a change: every id of an old list is still collected, or accounted for.

    python tools/test_ids.py collect --out docs/test_ids/after.txt   # this tree's ids (pytest --collect-only)
    python tools/test_ids.py missing docs/test_ids/5708c97.txt       # old ids not collected now, and why

`missing` names every id of OLD that the new list (NEW, or this tree's collection) lacks. An id may go when its test
was renamed or merged into another; docs/test_ids/accounted.tsv says so, a line each (old id, the new ids that
carry its assertions, the commit, why). It exits 1 when an id is missing with no account, or when an account's new
id is not collected either, so a test cannot quietly disappear between two lists.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCOUNTED = ROOT / "docs" / "test_ids" / "accounted.tsv"


@dataclass(frozen=True)
class Account:
    old: str
    new: tuple[str, ...]
    commit: str
    why: str


def collect(root: Path = ROOT) -> list[str]:
    """This tree's test ids, as `pytest --collect-only -q` prints them (sorted)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"test_ids: collection failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr}")
    return parse(proc.stdout)


def parse(text: str) -> list[str]:
    """The ids of a `--collect-only -q` listing or of a saved list; pytest's summary and warnings are not ids."""
    return sorted({line.strip() for line in text.splitlines() if "::" in line and not line.startswith(" ")})


def read_accounts(path: Path = ACCOUNTED) -> dict[str, Account]:
    accounts = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise SystemExit(f"test_ids: {path}:{number}: want 4 tab-separated fields (old, new, commit, why)")
        old, new, commit, why = fields
        accounts[old] = Account(old, tuple(n for n in new.split(",") if n), commit, why)
    return accounts


def missing(old: list[str], new: list[str], accounts: dict[str, Account]) -> tuple[list[str], bool]:
    """A line for each old id not in `new`, and whether every one of them is accounted for."""
    now, lines, ok = set(new), [], True
    for test_id in old:
        if test_id in now:
            continue
        account = accounts.get(test_id)
        if account is None:
            ok = False
            lines.append(f"MISSING, not accounted for: {test_id}")
            continue
        gone = [n for n in account.new if n not in now]
        ok = ok and not gone
        carried = ", ".join(account.new) or "no test"
        lines.append(f"{test_id}\n    -> {carried} ({account.commit}: {account.why})"
                     + (f"\n    but not collected now: {', '.join(gone)}" if gone else ""))
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="test_ids", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    collect_cmd = commands.add_parser("collect", help="write this tree's test ids, one a line")
    collect_cmd.add_argument("--out", type=Path, help="the file (default: standard output)")
    missing_cmd = commands.add_parser("missing", help="old ids not in the new list, with their accounts")
    missing_cmd.add_argument("old", type=Path)
    missing_cmd.add_argument("new", type=Path, nargs="?", help="a saved list (default: collect this tree)")
    missing_cmd.add_argument("--accounted", type=Path, default=ACCOUNTED)
    args = parser.parse_args(argv)
    if args.command == "collect":
        text = "".join(f"{test_id}\n" for test_id in collect())
        if args.out:
            args.out.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    old = parse(args.old.read_text())
    new = parse(args.new.read_text()) if args.new else collect()
    lines, ok = missing(old, new, read_accounts(args.accounted))
    for line in lines:
        print(line)
    print(f"{len(old)} ids before, {len(new)} now; {len(lines)} of the old ones not collected now, "
          f"{'each accounted for' if ok else 'NOT all accounted for'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
