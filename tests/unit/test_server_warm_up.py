"""``local_server.warm_up``: one request for a path no API route matches, so the server builds its request
handling before a run starts; a 404 or a server that does not answer is not an error."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.run import free_port
from skillopt.shell.local_server import warm_up


def test_warm_up_asks_for_a_path_under_the_api_and_takes_the_404():
    paths: list[str] = []

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            paths.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        warm_up(f"http://127.0.0.1:{server.server_port}/api")
    finally:
        server.shutdown()
        server.server_close()
    assert paths == ["/api/skillopt-warm-up"]


def test_warm_up_of_a_server_that_does_not_answer_returns():
    warm_up(f"http://127.0.0.1:{free_port()}/api", timeout_s=2.0)
