"""mlmclm.bounded_read: regular files only, opened without blocking; never more than the bound read."""
import io
import os
import re
import socket

import pytest

from mlmclm.bounded_read import (FileRefusedError, open_regular_file, read_limited, read_regular_file,
                                 read_regular_json, read_regular_text)


def test_a_regular_file_within_the_bound_is_read(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, 2]}')
    assert read_regular_file(path, limit=13) == b'{"a": [1, 2]}'
    assert read_regular_text(path) == '{"a": [1, 2]}'
    assert read_regular_json(path) == {"a": [1, 2]}
    link = tmp_path / "link.json"
    link.symlink_to(path)                                     # a link to a regular file is followed, as open does
    assert read_regular_json(link) == {"a": [1, 2]}
    with open_regular_file(path, 13) as stream:
        assert stream.read() == b'{"a": [1, 2]}'


def test_a_larger_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(1 << 40)                                   # sparse: 1 TiB said, nothing on disk
    with pytest.raises(FileRefusedError, match=rf"{path}: refusing to read this checkpoint file: it holds "
                                               rf"{1 << 40} bytes, more than the 100 it may"):
        read_regular_file(path, limit=100, what="checkpoint file")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind,words", [("fifo", "a FIFO (named pipe)"), ("device", "a character device"),
                                        ("directory", "a directory"), ("socket", "a socket")])
def test_what_is_not_a_regular_file_is_refused_naming_it(tmp_path, kind, words):
    """A FIFO would block the open itself (until a writer appears); /dev/zero never ends."""
    path = tmp_path / kind
    server = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    try:
        if kind == "socket":   # a socket cannot be opened at all: the OS says so (ENXIO), nothing is read
            with pytest.raises(OSError):
                read_regular_file(path)
        else:
            with pytest.raises(FileRefusedError, match=re.escape(f"{path}: refusing to read this manifest: it is {words}, not "
                                                                 "a regular file")):
                read_regular_file(path, what="manifest")
        assert not isinstance(FileRefusedError("x"), OSError) and isinstance(FileRefusedError("x"), ValueError)
    finally:
        if server is not None:
            server.close()


def test_read_limited_stops_one_byte_past_the_bound():
    class Endless(io.RawIOBase):
        def __init__(self):
            self.served = 0

        def read(self, n=-1):
            self.served += n
            return b"x" * n

    stream = Endless()
    with pytest.raises(FileRefusedError, match="pipe:yes: refusing to read this response: it holds more than the "
                                               "3000000 bytes it may"):
        read_limited(stream, 3_000_000, "pipe:yes", "response")
    assert stream.served == 3_000_001                          # never more than the bound and one byte
    assert read_limited(io.BytesIO(b"abc"), 3, "x") == b"abc"
