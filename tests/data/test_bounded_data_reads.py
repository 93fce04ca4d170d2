"""A dataset is a set of files from others: its manifest or a shard may be a device, a FIFO, or a response far
larger than the manifest says. Each is refused naming the file and the cause, within seconds and a small bound on
memory, for a local directory, an http URL (served here by a local http.server) and a `pipe:` command."""
import functools
import http.server
import os
import shutil
import threading
import time
import tracemalloc

import pytest

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.remote import MANIFEST_LIMIT, shard_limit
from mlmclm.data.shards import ShardError
from tests.local_servers import serve_stalling

HUGE = 256 * 1024 * 1024   # what the hostile server would send: far more than any bound here


def _copy(dataset, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(dataset, out)
    return out, Manifest.load(out)


def _first_shard(location) -> str:
    loader = PackedLoader(LoaderConfig(str(location), 16, 16, prefetch=False))
    return loader.manifest.shards[loader._order(0)[0][0]].name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dev_zero", "fifo"])
def test_a_manifest_that_is_a_device_or_a_fifo_is_refused(dataset, tmp_path, kind):
    """The old code read /dev/zero until MemoryError and blocked on the FIFO (waiting for a writer)."""
    out, _ = _copy(dataset, tmp_path)
    manifest = out / "manifest.json"
    manifest.unlink()
    if kind == "dev_zero":
        manifest.symlink_to("/dev/zero")
    else:
        os.mkfifo(manifest)
    what = "a character device" if kind == "dev_zero" else "a FIFO"
    with pytest.raises(ValueError, match=rf"{manifest}: refusing to read this dataset manifest: it is {what}"):
        PackedLoader(LoaderConfig(str(out), 16, 16))


@pytest.mark.timeout(60)
def test_an_endless_pipe_manifest_stops_at_the_bound(dataset):
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"pipe:cat /dev/zero: refusing to read this dataset manifest: it holds "
                                         rf"more than the {MANIFEST_LIMIT} bytes"):
        Manifest.load("pipe:cat /dev/zero")
    assert time.monotonic() - start < 20


@pytest.mark.timeout(60)
def test_a_shard_that_is_a_fifo_or_larger_than_its_manifest_says_is_refused(dataset, tmp_path):
    """The old loader blocked on a FIFO shard (a rank held until the NCCL timeout on a cluster)."""
    out, m = _copy(dataset, tmp_path)
    name = _first_shard(out)
    shard = out / name
    info = next(s for s in m.shards if s.name == name)
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(ShardError, match=rf"{shard}: refusing to read this shard: it is a FIFO"):
        PackedLoader(LoaderConfig(str(out), 16, 16, prefetch=False)).next_global_batch()
    shard.unlink()
    limit = shard_limit(info.num_samples, m.seq_length, 2)
    with open(shard, "wb") as f:
        f.truncate(limit + 1)   # sparse: no disk used
    with pytest.raises(ShardError, match=rf"{shard}: refusing to read this shard: it holds {limit + 1} bytes, more "
                                         rf"than the {limit}"):
        PackedLoader(LoaderConfig(str(out), 16, 16, prefetch=False)).next_global_batch()
    # skip_corrupt skips it like any corrupt shard
    loader = PackedLoader(LoaderConfig(str(out), 16, 16, prefetch=False, skip_corrupt=True))
    loader.next_global_batch()
    assert loader.skipped_shards == [name]


def _serve(directory, oversized: str):
    """A local http server of `directory` whose `/oversized` path streams HUGE bytes of zeros, 1 MiB at a time."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.lstrip("/") != oversized:
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE))
            self.end_headers()
            chunk = bytes(1 << 20)
            try:
                for _ in range(HUGE // len(chunk)):
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):   # the reader stopped at its bound
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.timeout(120)
def test_an_http_shard_far_larger_than_its_manifest_says_stops_at_the_bound(dataset, tmp_path):
    """The old loader read a URL shard whole, whatever its manifest said (here it would have held 256 MiB in
    memory for a shard of 100 rows of 32 tokens). Now the read stops at the manifest's size plus headers (~2 MiB),
    curl is killed, and the ShardError names the URL and the bound; memory stays within a few times the bound."""
    name = _first_shard(dataset)
    server = _serve(dataset, name)
    url = f"http://127.0.0.1:{server.server_address[1]}/manifest.json"
    info = next(s for s in Manifest.load(dataset).shards if s.name == name)
    limit = shard_limit(info.num_samples, 32, 2)
    assert limit < 4 * 1024 * 1024
    try:
        tracemalloc.start()
        start = time.monotonic()
        with pytest.raises(ShardError, match=rf"{name}: refusing to read this shard: it holds more than the "
                                             rf"{limit} bytes"):
            PackedLoader(LoaderConfig(url, 16, 16, prefetch=False)).next_global_batch()
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.shutdown()
    assert peak < 8 * limit, peak
    assert elapsed < 30


@pytest.mark.timeout(60)
def test_a_pipe_shard_is_bounded_the_same_way(dataset, tmp_path):
    """A `pipe:` location whose command yields an endless stream for a shard: stopped at the shard's bound, the
    command killed (no wait for it to end)."""
    out, m = _copy(dataset, tmp_path)
    name = _first_shard(out)
    (out / name).unlink()
    (out / name).symlink_to("/dev/zero")   # cat follows it: an endless shard through the pipe
    with pytest.raises(ShardError, match=rf"{name}: refusing to read this shard: it holds more than"):
        PackedLoader(LoaderConfig(f"pipe:cat {out}/manifest.json", 16, 16, prefetch=False)).next_global_batch()


@pytest.mark.timeout(60)
def test_a_server_that_stalls_is_refused_after_the_stall_bound(monkeypatch):
    """Before, curl waited on a stalled server forever (webdataset's curl has a connect timeout, not a read one)
    and the rank with it. Now the read gives up after STALL_S without a byte (here made 2 s), kills curl, and the
    manifest is refused naming the URL and the stall."""
    from mlmclm.data import remote

    monkeypatch.setattr(remote, "STALL_S", 2.0)
    server, release = serve_stalling(b'{"format": ')
    url = f"http://127.0.0.1:{server.server_address[1]}/manifest.json"
    try:
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"{url}: refusing to wait longer for this dataset manifest: nothing "
                                             rf"arrived for 2 s"):
            Manifest.load(url)
        elapsed = time.monotonic() - start
    finally:
        release.set()
        server.shutdown()
    assert 2 <= elapsed < 20, elapsed


@pytest.mark.timeout(60)
def test_a_command_that_never_writes_is_refused_after_the_stall_bound(dataset, tmp_path, monkeypatch):
    from mlmclm.data import remote

    monkeypatch.setattr(remote, "STALL_S", 2.0)
    out, _ = _copy(dataset, tmp_path)
    name = _first_shard(out)
    (out / name).unlink()
    os.mkfifo(out / name)   # nobody writes it: `cat` of it waits forever
    start = time.monotonic()
    with pytest.raises(ShardError, match=rf"{name}: refusing to wait longer for this shard: nothing arrived for 2 s"):
        PackedLoader(LoaderConfig(f"pipe:cat {out}/manifest.json", 16, 16, prefetch=False)).next_global_batch()
    assert time.monotonic() - start < 20
