"""Keeping a data credential out of every file: a `pipe:` location may name it as an environment variable, which
the command's shell expands when it runs, so the config, run_config.json, NeMo-Run's task and the Slurm script hold
only its name. A real local http server that answers only with the right bearer token, real curl."""
import functools
import http.server
import threading

import pytest

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest

TOKEN = "tok-7f3a9c"


def _serve_with_token(directory):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_error(401)
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.timeout(120)
def test_a_pipe_location_reads_its_credential_from_the_environment(dataset, monkeypatch):
    server = _serve_with_token(dataset)
    location = (f'pipe:curl -s -f -H "Authorization: Bearer $MLMCLM_DATA_TOKEN" '
                f"http://127.0.0.1:{server.server_address[1]}/manifest.json")
    try:
        monkeypatch.delenv("MLMCLM_DATA_TOKEN", raising=False)
        with pytest.raises(ValueError, match="cannot read dataset manifest"):   # no token: the server says 401
            Manifest.load(location)
        monkeypatch.setenv("MLMCLM_DATA_TOKEN", TOKEN)
        loader = PackedLoader(LoaderConfig(location, 16, 16, prefetch=False))
        tokens = loader.next_global_batch()[0]["tokens"]
        local = PackedLoader(LoaderConfig(str(dataset), 16, 16, prefetch=False)).next_global_batch()[0]["tokens"]
        assert (tokens == local).all()   # the same rows as the local copy, shards read through the same command
    finally:
        server.shutdown()
    assert TOKEN not in loader.manifest.location and TOKEN not in repr(loader.cfg)
