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
