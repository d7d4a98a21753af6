"""Loopback fakes for offline tests: provider HTTP servers with fault plans, and a socket guard.

Fixtures live in ``tests.fakes.fixtures``; everything else is importable from here.
"""

from .http_fakes import (
    DEFAULT_USAGE,
    Drip,
    Entry,
    FakeAnthropicServer,
    FakeOpenAIServer,
    MalformedBody,
    Ok,
    Raw,
    RecordedRequest,
    Reset,
    Slow,
    Status,
    drip,
    malformed_body,
    ok,
    raw,
    reset,
    slow,
    status,
    truncated,
)
from .socket_guard import SocketGuard, SocketGuardError, guarded

__all__ = [
    "DEFAULT_USAGE",
    "Drip",
    "Entry",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "MalformedBody",
    "Ok",
    "Raw",
    "RecordedRequest",
    "Reset",
    "Slow",
    "SocketGuard",
    "SocketGuardError",
    "Status",
    "drip",
    "guarded",
    "malformed_body",
    "ok",
    "raw",
    "reset",
    "slow",
    "status",
    "truncated",
]
