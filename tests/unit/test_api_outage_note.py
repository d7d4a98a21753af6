"""While the Prefect API does not answer, Prefect's event client logs a full dump of every event it could not
send; a run says so once instead (flows.run._ApiOutageNote)."""

from __future__ import annotations

import logging

from skillopt.flows.run import _ApiOutageNote


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str = "") -> None:
        self.lines.append(text)


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_event_dumps_and_reconnect_warnings_become_one_note():
    out = _Lines()
    note = _ApiOutageNote(out)
    dumps = [_record("prefect._internal.concurrency", "Service %r failed to process item %r", "EventsWorker",
                     "Event(occurred=..., payload={...})") for _ in range(3)]
    warning = _record("prefect.events.clients", "Unable to connect to %r. Please check your network settings",
                      "ws://127.0.0.1:4200/api/events/in")
    assert [note.filter(record) for record in [*dumps, warning]] == [False] * 4
    assert out.lines == ["note: the Prefect API does not answer; the run goes on and retries it (the UI may "
                         "miss some of this run's events)"]
    assert note.filter(_record("prefect._internal.concurrency", "Service %r started", "EventsWorker"))


def _connect_error() -> BaseException:
    """An httpx ConnectError raised from httpcore's, as Prefect's client raises it."""
    import httpcore
    import httpx

    try:
        try:
            raise httpcore.ConnectError("All connection attempts failed")
        except httpcore.ConnectError as inner:
            raise httpx.ConnectError("All connection attempts failed") from inner
    except httpx.ConnectError as error:
        return error


def test_a_run_that_failed_on_an_unreachable_api_is_not_logged_with_its_traceback():
    from skillopt.flows.run import _UserErrorsWithoutTraceback, api_unreachable

    error = _connect_error()
    wrapped = RuntimeError("creating the sub-flow failed")
    wrapped.__cause__ = error
    assert api_unreachable(wrapped) is not None and api_unreachable(ValueError("x")) is None
    record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1,
                               "Encountered exception during execution: %r", (wrapped,),
                               (type(wrapped), wrapped, None))
    assert _UserErrorsWithoutTraceback().filter(record) is False  # the CLI says it in one line
    other = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "boom", None,
                              (ValueError, ValueError("boom"), None))
    assert _UserErrorsWithoutTraceback().filter(other) is True and other.exc_info is not None


def test_waiting_for_the_api_returns_once_its_health_check_answers(monkeypatch):
    """A loopback server that refuses connections for a while, then answers ``/api/health``."""
    import http.server
    import socket
    import threading
    import time

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from skillopt.flows.run import wait_for_api

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seen: list[str] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: object) -> None:
            pass

    server: list[http.server.HTTPServer] = []

    def come_back() -> None:
        time.sleep(1.5)
        server.append(http.server.HTTPServer(("127.0.0.1", port), Health))
        server[0].serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    lines: list[str] = []
    monkeypatch.setattr(logging.getLogger("skillopt.progress"), "info",
                        lambda msg, *args: lines.append(msg % args))
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            wait_for_api("epoch 2", limit_s=60)
        assert seen == ["/api/health"]
        assert lines[0].startswith(f"the Prefect API at http://127.0.0.1:{port}/api does not answer; waiting "
                                   "up to 60 s for it before epoch 2")
        assert lines[-1] == "the Prefect API answers again"
    finally:
        if server:
            server[0].shutdown()


def test_waiting_for_the_api_gives_up_after_its_limit(monkeypatch):
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from skillopt.flows.run import wait_for_api

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lines: list[str] = []
    monkeypatch.setattr(logging.getLogger("skillopt.progress"), "info",
                        lambda msg, *args: lines.append(msg % args))
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        wait_for_api("epoch 2", limit_s=1.0)  # returns: the sub-flow's creation reports the failure
    assert len(lines) == 1 and "does not answer; waiting up to 1 s for it before epoch 2" in lines[0]
