"""The cheap commands of the README and docs/ (--help, --list, --plan, dry-runs) run exactly as written, in a fresh
shell with the project's environment active (the README's one convention) and nothing else set; every relative link
of the README and docs/ leads to a file (and heading) that exists; the README stays a five-minute read.

Each command runs with the `export` lines written before it in its code block, from the repository root, with an
empty HOME (NeMo-Run writes its experiments there). cluster/README.md is left out: its examples name a site's
shared filesystem (/lustre, /home) that this machine does not have."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "recipes/README.md"]
CHEAP = ("--help", "--list", "--plan", "--dryrun")


def cheap_commands() -> list[tuple[str, list[str], str]]:
    found = []
    for doc in DOCS:
        fence, exports = False, []
        for number, raw in enumerate((ROOT / doc).read_text().splitlines(), 1):
            if raw.strip().startswith("```"):
                fence, exports = not fence, []
                continue
            if not (fence or raw.startswith("    ")):
                exports = []
                continue
            line = raw.strip()
            if line.startswith("export "):
                exports.append(line)
                continue
            command = re.sub(r"\s+#.*$", "", line)
            if command.startswith("python ") and any(flag in command.split() for flag in CHEAP):
                found.append((f"{doc}:{number}", list(exports), command))
    return found


COMMANDS = cheap_commands()


def test_the_docs_have_cheap_commands_to_check():
    assert len(COMMANDS) >= 6, COMMANDS


@pytest.mark.parametrize("where, exports, command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_runs_as_written(where, exports, command, tmp_path):
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
                   "LANG": os.environ.get("LANG", "C.UTF-8")}
    script = " && ".join([f"cd {ROOT}", *exports, command])
    proc = subprocess.run(["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


LINKED = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "recipes/README.md",
          "cluster/README.md"]


@pytest.mark.parametrize("doc", LINKED)
def test_every_relative_link_leads_somewhere(doc):
    source = ROOT / doc
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", source.read_text()):
        if re.match(r"(https?|mailto):", target):
            continue
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if anchor not in {github_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{doc}: links to nothing: {broken}"


def test_the_readme_is_a_five_minute_read():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12_000, f"README.md is {len(readme.encode())} bytes; move detail to docs/"
    first_screen = "\n".join(readme.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen


def test_what_runs_where_says_no_wherever_nothing_ran_on_a_gpu():
    """Issue 53: an empty GPU-verified cell read as "not applicable"; every row says what ran, or "no"."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What runs where", 1)[1].split("\n\n")[1].splitlines()
    assert table[0].split("|")[3].strip() == "GPU-verified", table[0]
    empty = [row.split("|")[1].strip() for row in table[2:] if not row.split("|")[3].strip()]
    assert not empty, f"rows without a GPU-verified entry (write `no`): {empty}"
