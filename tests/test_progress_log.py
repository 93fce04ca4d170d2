"""mlmclm/progress_log.py's lines: each one reaches the stream in one write, so lines printed from two threads (the
grid's progress and its pool's notice of a lost worker) never share a line in a log."""
from mlmclm import progress_log
from mlmclm.progress_log import GridProgress, LogProgress


class _Writes:
    """A log file that keeps each write call apart (`print` makes two: the text, then its newline, and another
    thread's line can come between them)."""

    def __init__(self):
        self.writes = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_each_progress_line_is_one_write_with_its_newline():
    stream = _Writes()
    GridProgress({"a": 1.0}, set(), "evaluation runs", stream=stream, interval=600).write("evaluation runs: 0/1")
    LogProgress(["a"], "evaluation runs", stream=stream, interval=600).write("done")
    assert stream.writes == ["evaluation runs: 0/1\n", "done\n"]
    progress_log.write_line("evaluate: worker 2 (pid 7): killed by SIGKILL", stream)  # the grid pool's notices
    assert stream.writes[2:] == ["evaluate: worker 2 (pid 7): killed by SIGKILL\n"]

