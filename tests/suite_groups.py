"""Which tests share a pytest-xdist worker under `make test`: a file's tests, or every file listed with one costly
session fixture (tests/suite_tiers.py SHARED_FIXTURE_FILES), so that the fixture is set up by one worker only.

xdist's own `--dist loadgroup` cannot do it here: it renames each test id (`item._nodeid += "@group"`), which
pytest 9.2's `Node.nodeid` no longer reads, so every test went to whichever worker was free — the local Slurm and
all its scenarios set up by both workers at once (twice the work, and out of memory on a 24 GiB host). The
scheduler below groups by the test id's file instead, which the controller has.
"""
import suite_tiers


def worker_group(path: str) -> str:
    """The group of the test file at `path` (relative to the repository, "/"-separated)."""
    for fixture, files in suite_tiers.SHARED_FIXTURE_FILES.items():
        if any(path == f or (f.endswith("/") and path.startswith(f)) for f in files):
            return fixture
    return path


def misplaced(tests) -> list[str]:
    """`tests`: (test id, file path, fixture names) each. A message per test that uses a shared session fixture from
    a file not listed with it: its worker would set the fixture up a second time."""
    messages = []
    for test_id, path, fixtures in tests:
        group = worker_group(path)
        for fixture in suite_tiers.SHARED_FIXTURE_FILES:
            if fixture in fixtures and group != fixture:
                messages.append(f"{test_id} uses the session fixture {fixture!r}, but {path} is not listed with it "
                                f"in tests/suite_tiers.py SHARED_FIXTURE_FILES (its worker would set it up again)")
    return messages


def longest_first(path: str) -> int:
    """Sort key: the groups of suite_tiers.LONGEST_FIRST in its order, then the rest."""
    group = worker_group(path)
    return suite_tiers.LONGEST_FIRST.index(group) if group in suite_tiers.LONGEST_FIRST else len(
        suite_tiers.LONGEST_FIRST)


def file_group_scheduler(config, log):
    """xdist's scope scheduling (a scope runs on one worker; `--no-loadscope-reorder` keeps the collection order),
    each test's scope its file's group. (xdist imported here: the serial runs need none of it.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid.split("::", 1)[0])

    return FileGroupScheduling(config, log)
