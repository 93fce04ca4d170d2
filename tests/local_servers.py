"""Local http servers that stand in for a dataset's remote host (imported by the data and the training tests)."""
import functools
import http.server
import threading


def serve_stalling(sent: bytes = b"", directory=None, stalls=lambda path: True):
    """A local http server that answers a GET for which `stalls(path)` holds with a header, `sent`, and then nothing,
    holding the connection until the returned event is set; other paths are served from `directory`. Returns
    (server, release): the caller sets `release` and shuts the server down."""
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if directory is not None and not stalls(self.path.lstrip("/")):
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Length", str(len(sent) + 1000))
            self.end_headers()
            self.wfile.write(sent)
            self.wfile.flush()
            release.wait(120)   # stalls until the test ends

        def log_message(self, *args):
            pass

    handler = Handler if directory is None else functools.partial(Handler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, release
