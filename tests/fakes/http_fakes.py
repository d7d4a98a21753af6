"""Loopback fakes of the OpenAI and Anthropic HTTP APIs, scripted by per-path fault plans.

The real ``openai`` and ``anthropic`` SDKs talk to these servers exactly as they would talk to the providers:
stdlib ``ThreadingHTTPServer`` on ``127.0.0.1:0``, one daemon thread, no network.

Servers
    ``FakeOpenAIServer`` serves ``POST …/chat/completions`` (plain JSON, or SSE when ``"stream": true``, with
    a usage chunk when ``stream_options.include_usage`` is set), ``POST …/responses`` (Responses API,
    non-streaming), ``GET …/models`` and Azure's ``POST
    /openai/deployments/<deployment>/chat/completions?api-version=…``. ``FakeAnthropicServer`` serves ``POST
    /v1/messages`` (non-streaming) and ``GET /v1/models``. Routing looks at the end of the path only, so any
    base-path prefix works (``/v1``, ``/compatible-mode/v1``, none). Unknown paths get a 404 in the provider's
    error shape.

    Point the SDKs at ``server.openai_base_url`` (``http://127.0.0.1:PORT/v1``), ``server.url`` (Anthropic's
    ``base_url`` and Azure's ``azure_endpoint``). Start and stop with ``with FakeOpenAIServer() as server:``
    or ``start()``/``stop()``; the pytest fixtures in ``tests/fakes/fixtures.py`` do it per test.

Fault plans
    ``server.plan(path, *entries)`` appends entries to the FIFO queue of ``path``; each matching request
    consumes one. ``path`` is either a route (``"/v1/chat/completions"``, ``"/v1/responses"``,
    ``"/v1/models"``, ``"/v1/messages"``: matches that endpoint whatever the base prefix, Azure included) or
    an exact request path (``"/openai/deployments/gpt4o/chat/completions"``: matches only that path; checked
    first). The reply to a request is: the next entry queued for its exact path, else for its route, else
    ``server.handler(request)`` if a handler is set and returns an entry, else ``server.default``
    (``ok(text="ok")`` unless configured).

    Entries (constructors below):

    - ``ok(text=None, json=None, usage=None, model=None, reasoning=None, finish_reason=None, headers=None,
      wire_usage=None)``: a success. ``json`` is sent as the dumped text (Anthropic: as a ``tool_use`` block
      when the request forces a tool). ``reasoning`` becomes ``message.reasoning_content`` /
      ``delta.reasoning_content`` (chat), a ``reasoning`` output item with a summary (Responses) or a
      ``thinking`` block before the answer (Anthropic). ``model`` defaults to the request's model.
    - ``truncated(text)``: output cut by the cap: chat ``finish_reason: "length"``, Responses ``status:
      "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``, Anthropic ``stop_reason:
      "max_tokens"``.
    - ``status(http_status, retry_after=None, retry_after_ms=None, code=None, message=None, error_type=None,
      headers=None)``: an error in the provider's shape. ``code="context_length_exceeded"`` gives OpenAI's
      error code and Anthropic's "prompt is too long" message; ``retry_after`` (seconds, or an HTTP date
      string) sets ``Retry-After``, ``retry_after_ms`` sets ``retry-after-ms``.
    - ``slow(seconds, then=None)``: sleep before sending anything (late headers), then reply with ``then``
      (default ``ok()``).
    - ``drip(seconds, chunks=10, then=None)``: send headers at once, then trickle the body in ``chunks``
      pieces spread over ``seconds`` (an SSE stream is trickled one event at a time instead).
    - ``malformed_body(kind="html"|"json")``: HTTP 200 with an HTML error page or cut-off JSON.
    - ``reset()``: read the request, send half a status line, then abort the connection (RST).
    - ``raw(status_code, body, headers=None, content_type=None)``: anything else, verbatim.

Usage
    ``usage`` is one neutral dict mapped to each wire format: ``prompt_tokens`` (the whole prompt, cached and
    cache-written tokens included), ``completion_tokens`` (all output, reasoning included),
    ``reasoning_tokens``, ``cached_tokens`` (read from cache), ``cache_write_tokens``. Keys left out (or None)
    are left out of the wire where the provider allows it (chat's ``*_details``); the Responses API always
    reports its details (0 when absent). Anthropic gets ``input_tokens = prompt_tokens - cached_tokens -
    cache_write_tokens``, ``cache_read_input_tokens = cached_tokens``, ``cache_creation_input_tokens =
    cache_write_tokens``. ``usage={}`` omits the usage object; ``wire_usage={...}`` sends a usage object
    verbatim. Default: ``DEFAULT_USAGE``.

Recording
    Every request (even unknown paths, bad keys and non-JSON bodies) becomes a ``RecordedRequest`` (method,
    path, query, headers with lower-cased names, parsed JSON body or None, raw body, route, Azure deployment,
    request id; helpers ``api_key``, ``stream``, ``last_user_text``).
    ``server.requests`` (snapshot list), ``server.calls(path=None)``, ``server.last(path=None)``,
    ``server.requests_for(path)``, ``server.pending(path)``, ``server.reset_plans()``,
    ``server.clear_requests()``. ``server.errors`` lists exceptions raised inside the fake itself (should stay
    empty).

Authentication
    ``require_key="sk-test"``: OpenAI requests need ``Authorization: Bearer sk-test``; Azure paths
    (``/openai/...``) need ``api-key: sk-test`` (or that bearer token); Anthropic needs ``x-api-key: sk-test``
    (or that bearer token, which is how anthropic SDK 2.x sends ``api_key``). Otherwise the reply is a 401 in
    the provider's shape and no plan entry is consumed. ``RecordedRequest.api_key`` is the credential as sent,
    whatever the header.

Example::

    with FakeOpenAIServer() as server:
        server.plan("/v1/chat/completions", status(429, retry_after=2),
                    ok(text="hi", usage={"prompt_tokens": 7, "completion_tokens": 2}))
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
        ...
        assert server.calls("/v1/chat/completions") == 2
        assert server.last("/v1/chat/completions").body["model"] == "gpt-4.1-mini"
"""

from __future__ import annotations

import contextlib
import http.server
import io
import json as jsonlib
import re
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlsplit

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
    "Status",
    "drip",
    "malformed_body",
    "ok",
    "raw",
    "reset",
    "slow",
    "status",
    "truncated",
]

DEFAULT_USAGE: Mapping[str, int] = {
    "prompt_tokens": 10,
    "completion_tokens": 5,
    "reasoning_tokens": 0,
    "cached_tokens": 0,
}
_USAGE_KEYS = frozenset(
    {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens", "cache_write_tokens"}
)
_CREATED = 1_700_000_000  # fixed timestamp keeps replies deterministic


# ------------------------------------------------------------------------------------------------------------
# Plan entries


@dataclass(frozen=True)
class Ok:
    """A successful reply; see ``ok()``."""

    text: str | None = None
    json: Any = None
    usage: Mapping[str, int | None] | None = None
    model: str | None = None
    reasoning: str | None = None
    finish_reason: str | None = None
    headers: Mapping[str, str] | None = None
    wire_usage: Mapping[str, Any] | None = None
    truncated: bool = False

    def __post_init__(self) -> None:
        if self.text is not None and self.json is not None:
            raise ValueError("ok(): give text or json, not both")
        if self.usage is not None:
            unknown = set(self.usage) - _USAGE_KEYS
            if unknown:
                raise ValueError(
                    f"ok(): unknown usage keys {sorted(unknown)}; expected some of {sorted(_USAGE_KEYS)}"
                )
            prompt = self.usage.get("prompt_tokens")
            from_cache = (self.usage.get("cached_tokens") or 0) + (self.usage.get("cache_write_tokens") or 0)
            if prompt is not None and from_cache > prompt:
                raise ValueError(
                    "ok(): prompt_tokens counts the whole prompt, so it must be >= cached + cache_write"
                )

    @property
    def answer_text(self) -> str:
        if self.json is not None:
            return jsonlib.dumps(self.json)
        return "ok" if self.text is None else self.text

    @property
    def neutral_usage(self) -> dict[str, int]:
        usage = DEFAULT_USAGE if self.usage is None else self.usage
        return {key: value for key, value in usage.items() if value is not None}


@dataclass(frozen=True)
class Status:
    """An HTTP error in the provider's error shape; see ``status()``."""

    http_status: int
    retry_after: float | str | None = None
    retry_after_ms: int | None = None
    code: str | None = None
    message: str | None = None
    error_type: str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Slow:
    """Wait ``seconds`` before sending anything, then reply with ``then``."""

    seconds: float
    then: Entry | None = None


@dataclass(frozen=True)
class Drip:
    """Send headers at once, then the body in ``chunks`` pieces spread over ``seconds``."""

    seconds: float
    chunks: int = 10
    then: Entry | None = None

    def __post_init__(self) -> None:
        if isinstance(self.then, (Slow, Drip, Reset)):
            raise ValueError(
                "drip(then=...) takes a reply entry (ok, truncated, status, malformed_body, raw)"
            )
        if self.chunks < 1:
            raise ValueError("drip(): chunks must be >= 1")


@dataclass(frozen=True)
class MalformedBody:
    """HTTP 200 whose body is an HTML page or cut-off JSON."""

    kind: Literal["html", "json"] = "json"


@dataclass(frozen=True)
class Reset:
    """Abort the connection after reading the request, mid-way through the status line."""


@dataclass(frozen=True)
class Raw:
    """A verbatim reply."""

    status_code: int
    body: bytes | str | Mapping[str, Any] | list[Any]
    headers: Mapping[str, str] | None = None
    content_type: str | None = None


Entry = Ok | Status | Slow | Drip | MalformedBody | Reset | Raw
Handler = Callable[["RecordedRequest"], "Entry | None"]


def ok(
    text: str | None = None,
    json: Any = None,
    usage: Mapping[str, int | None] | None = None,
    model: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    headers: Mapping[str, str] | None = None,
    wire_usage: Mapping[str, Any] | None = None,
) -> Ok:
    """A success: ``text`` (default "ok") or ``json`` (sent as its dump, or as Anthropic's forced
    ``tool_use``)."""
    return Ok(text, json, usage, model, reasoning, finish_reason, headers, wire_usage)


def truncated(
    text: str = "",
    usage: Mapping[str, int | None] | None = None,
    model: str | None = None,
    reasoning: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Ok:
    """Output cut by the token cap (``length`` / ``incomplete`` / ``max_tokens``)."""
    return Ok(text=text, usage=usage, model=model, reasoning=reasoning, headers=headers, truncated=True)


def status(
    http_status: int,
    /,
    retry_after: float | str | None = None,
    retry_after_ms: int | None = None,
    code: str | None = None,
    message: str | None = None,
    error_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Status:
    """An HTTP error, e.g. ``status(429, retry_after=2)`` or ``status(400,
    code="context_length_exceeded")``."""
    return Status(http_status, retry_after, retry_after_ms, code, message, error_type, headers)


def slow(seconds: float, then: Entry | None = None) -> Slow:
    """Late headers: sleep ``seconds``, then reply with ``then`` (default ``ok()``)."""
    return Slow(seconds, then)


def drip(seconds: float, chunks: int = 10, then: Entry | None = None) -> Drip:
    """Trickled body: headers now, ``then``'s body (default ``ok()``) in ``chunks`` pieces over
    ``seconds``."""
    return Drip(seconds, chunks, then)


def malformed_body(kind: Literal["html", "json"] = "json") -> MalformedBody:
    """HTTP 200 with an HTML page (``"html"``) or JSON cut off mid-string (``"json"``)."""
    if kind not in ("html", "json"):
        raise ValueError("malformed_body(kind=...) must be 'html' or 'json'")
    return MalformedBody(kind)


def reset() -> Reset:
    """Connection aborted mid-response: the client never gets a valid HTTP response."""
    return Reset()


def raw(
    status_code: int,
    body: bytes | str | Mapping[str, Any] | list[Any],
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
) -> Raw:
    """Any reply, verbatim (dicts and lists are sent as JSON)."""
    return Raw(status_code, body, headers, content_type)


# ------------------------------------------------------------------------------------------------------------
# Recorded requests


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str  # without the query string
    query: dict[str, str]  # parsed query string (last value wins)
    query_string: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None when the body is empty or not JSON
    raw_body: bytes
    route: str | None  # "/v1/chat/completions" etc.; None for unknown paths
    deployment: str | None  # Azure deployment name from the path
    request_id: str  # also sent back as x-request-id (OpenAI) / request-id (Anthropic)
    received_at: float = field(default_factory=time.monotonic)

    @property
    def api_key(self) -> str | None:
        """The credential as sent: ``x-api-key`` (Anthropic), ``api-key`` (Azure) or an ``Authorization``
        bearer."""
        for name in ("x-api-key", "api-key"):
            if name in self.headers:
                return self.headers[name]
        authorization = self.headers.get("authorization", "")
        return authorization[len("Bearer ") :] if authorization.startswith("Bearer ") else None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def last_user_text(self) -> str:
        """Text of the last user message, whatever the wire format (chat, Responses ``input``, Anthropic)."""
        if not isinstance(self.body, dict):
            return ""
        messages = self.body.get("messages")
        if messages is None:
            messages = self.body.get("input")
        if isinstance(messages, str):
            return messages
        if not isinstance(messages, list):
            return ""
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _content_text(message.get("content"))
        return ""


    @property
    def images(self) -> list[dict[str, Any]]:
        """Every image part of every message, in order, as received: ``{"wire", "url", "detail", "media_type",
        "data"}`` for Chat Completions ``image_url`` parts (``wire: "chat"``, plus ``detail_sent``: whether
        the part had a ``detail`` key at all), Responses ``input_image`` parts
        (``"responses"``) and Anthropic ``image`` blocks with a base64 source (``"anthropic"``); ``data`` is
        the base64 payload (from the data URI, or the block's ``source.data``)."""
        if not isinstance(self.body, dict):
            return []
        messages = self.body.get("messages")
        if messages is None:
            messages = self.body.get("input")
        found: list[dict[str, Any]] = []
        for message in messages if isinstance(messages, list) else []:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "image_url":
                    image = part.get("image_url") or {}
                    found.append({**_image_view("chat", image.get("url"), image.get("detail")),
                                  "detail_sent": "detail" in image})
                elif kind == "input_image":
                    found.append(_image_view("responses", part.get("image_url"), part.get("detail")))
                elif kind == "image":
                    source = part.get("source") or {}
                    found.append({"wire": "anthropic", "url": None, "detail": None,
                                  "media_type": source.get("media_type"), "data": source.get("data"),
                                  "source_type": source.get("type")})
        return found


def _image_view(wire: str, url: Any, detail: Any) -> dict[str, Any]:
    url = url if isinstance(url, str) else ""
    media_type, data = None, None
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
    return {"wire": wire, "url": url, "detail": detail, "media_type": media_type, "data": data}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "input_text")
        )
    return ""


# ------------------------------------------------------------------------------------------------------------
# Wire rendering helpers


@dataclass
class _Reply:
    status: int
    headers: dict[str, str]
    chunks: list[bytes]  # body pieces; SSE events for streams
    stream: bool = False  # no Content-Length; the connection closes after the body


def _json_reply(status_code: int, payload: Any, headers: Mapping[str, str] | None = None) -> _Reply:
    return _Reply(
        status_code,
        {"Content-Type": "application/json", **(headers or {})},
        [jsonlib.dumps(payload).encode()],
    )


def _split_bytes(data: bytes, pieces: int) -> list[bytes]:
    if not data:
        return [b""]
    size = max(1, -(-len(data) // pieces))
    return [data[i : i + size] for i in range(0, len(data), size)]


def _split_text(text: str) -> list[str]:
    """Words with their trailing spaces, so a stream reassembles to exactly ``text``."""
    return re.findall(r"\S+\s*|\s+", text) or [""]


def _malformed(kind: str) -> _Reply:
    if kind == "html":
        page = (b"<html><head><title>502 Bad Gateway</title></head>"
                b"<body><center><h1>502 Bad Gateway</h1></center></body></html>\n")
        return _Reply(200, {"Content-Type": "text/html; charset=utf-8"}, [page])
    broken = (b'{"id": "broken", "object": "chat.completion", '
              b'"choices": [{"index": 0, "message": {"content": "cut of')
    return _Reply(200, {"Content-Type": "application/json"}, [broken])


def _raw(entry: Raw) -> _Reply:
    body = entry.body
    if isinstance(body, (Mapping, list)):
        data, default_type = jsonlib.dumps(body).encode(), "application/json"
    elif isinstance(body, str):
        data, default_type = body.encode(), "text/plain; charset=utf-8"
    else:
        data, default_type = bytes(body), "application/octet-stream"
    headers = {"Content-Type": entry.content_type or default_type, **(entry.headers or {})}
    return _Reply(entry.status_code, headers, [data])


def _status_headers(entry: Status) -> dict[str, str]:
    headers = dict(entry.headers or {})
    if entry.retry_after is not None:
        headers["Retry-After"] = str(entry.retry_after)
    if entry.retry_after_ms is not None:
        headers["retry-after-ms"] = str(entry.retry_after_ms)
    return headers


# ------------------------------------------------------------------------------------------------------------
# The server machinery shared by both fakes


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Connections waiting to be accepted, as a real server's backlog allows (socketserver's default is 5: a
    # wave of 10-16 new connections lost some and their clients waited a second for TCP to try again).
    request_queue_size = 128

    def __init__(self, fake: _FakeServer) -> None:
        self.fake = fake
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return  # clients hanging up (timeouts, resets) are expected
        self.fake._note_error(exc)


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections end by themselves
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits for the client's
    # delayed ACK of the headers (~40 ms per reply on Linux loopback), which distorts latency measurements.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: tests assert on recordings, not logs

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fake = self.server.fake
        self._request_id = "req_fake_unrecorded"
        with fake._in_flight():
            self._answer(fake)

    def _answer(self, fake: _FakeServer) -> None:
        try:
            request = fake._record(self.command, self.path, dict(self.headers.items()), self._read_body())
            self._request_id = request.request_id
            entry_or_reply = fake._decide(request)
            self._execute(entry_or_reply, request)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a bug in the fake or in a test's handler: answer 500 and keep serving
            fake._note_error(exc)
            self.close_connection = True  # headers may already be out; never reuse this connection
            try:
                self._send(
                    _json_reply(
                        500, {"error": {"message": f"fake server error: {exc!r}", "type": "fake_error"}}
                    )
                )
            except OSError:
                self.close_connection = True

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        return b""

    def _execute(self, entry: Entry | _Reply, request: RecordedRequest) -> None:
        fake = self.server.fake
        if isinstance(entry, _Reply):
            self._send(entry)
        elif isinstance(entry, Reset):
            self._abort()
        elif isinstance(entry, Slow):
            if fake._stopping.wait(entry.seconds):
                self._abort()
                return
            self._execute(entry.then or ok(), request)
        elif isinstance(entry, Drip):
            reply = fake._render(entry.then or ok(), request)
            self._send(reply, drip_seconds=entry.seconds, drip_chunks=entry.chunks)
        else:
            self._send(fake._render(entry, request))

    def _send(self, reply: _Reply, drip_seconds: float = 0.0, drip_chunks: int = 1) -> None:
        fake = self.server.fake
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header(fake._request_id_header, self._request_id)
        body = b"".join(reply.chunks)
        if reply.stream:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if drip_seconds <= 0:
            self.wfile.write(body)
            return
        pieces = reply.chunks if reply.stream and len(reply.chunks) > 1 else _split_bytes(body, drip_chunks)
        interval = drip_seconds / len(pieces)
        for piece in pieces:
            if fake._stopping.wait(interval):
                self._abort()
                return
            self.wfile.write(piece)

    def _abort(self) -> None:
        """Half a status line, then an abortive close (RST): no valid HTTP response ever arrives."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.write(b"HTTP/1.1 200 O")
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Close every reference to the socket so the kernel really closes it (and sends the RST) now; the
        # handler base class still flushes and closes wfile/rfile afterwards, so leave harmless stand-ins
        # behind.
        self.wfile.close()
        self.rfile.close()
        self.connection.close()
        self.wfile, self.rfile = io.BytesIO(), io.BytesIO()


class _FakeServer:
    """Common machinery: lifecycle, plan queues, recording, auth. Subclasses render one provider's wire
    format."""

    provider: ClassVar[str]
    _request_id_header: ClassVar[str]
    # (method, path regex, route); the first match wins. A "deployment" group names an Azure deployment.
    _routes: ClassVar[tuple[tuple[str, re.Pattern[str], str], ...]]

    def __init__(
        self,
        *,
        default: Entry | None = None,
        handler: Handler | None = None,
        require_key: str | None = None,
        models: tuple[str, ...] = (),
    ) -> None:
        self.default: Entry = default if default is not None else ok(text="ok")
        self.handler: Handler | None = handler
        self.require_key = require_key
        self.models = models
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Entry]] = {}
        self._requests: list[RecordedRequest] = []
        self._counter = 0
        self._now_in_flight = 0
        #: The most requests this server has been answering at once.
        self.max_in_flight = 0
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a request as in flight from its arrival to the end of its reply."""
        with self._lock:
            self._now_in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._now_in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._now_in_flight -= 1

    # ---- lifecycle

    def start(self) -> _FakeServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.provider}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake sleeping fault entries, close open connections and join every server thread."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with httpd.connections_lock:
            connections = list(httpd.connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        httpd.server_close()  # joins handler threads
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: Anthropic's ``base_url``, Azure's ``azure_endpoint``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the OpenAI SDK's ``base_url``."""
        return f"{self.url}/v1"

    # ---- plans

    def plan(self, path: str, *entries: Entry) -> None:
        """Queue replies for ``path`` (a route such as "/v1/chat/completions", or an exact request path)."""
        if not entries:
            raise ValueError("plan(path, *entries) needs at least one entry")
        if self._route_of(None, path)[0] is None:
            known = sorted({route for _, _, route in self._routes})
            raise ValueError(f"{type(self).__name__} serves no path like {path!r}; routes: {known}")
        for entry in entries:
            if not isinstance(entry, (Ok, Status, Slow, Drip, MalformedBody, Reset, Raw)):
                raise TypeError(f"plan entries come from ok()/status()/slow()/..., not {entry!r}")
        with self._lock:
            self._queues.setdefault(path, deque()).extend(entries)

    def pending(self, path: str) -> int:
        """Entries still queued for ``path``."""
        with self._lock:
            return len(self._queues.get(path, ()))

    def reset_plans(self) -> None:
        with self._lock:
            self._queues.clear()

    # ---- recordings

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, path: str | None = None) -> list[RecordedRequest]:
        """Requests whose route or exact path is ``path`` (all requests when None)."""
        return [r for r in self.requests if path is None or path in (r.path, r.route)]

    def calls(self, path: str | None = None) -> int:
        """How many requests hit ``path`` (route or exact path, query excluded); all requests when None."""
        return len(self.requests_for(path))

    def last(self, path: str | None = None) -> RecordedRequest:
        matching = self.requests_for(path)
        if not matching:
            seen = sorted({f"{r.method} {r.path}" for r in self.requests})
            raise LookupError(f"no request to {path or 'any path'} was recorded; seen: {seen}")
        return matching[-1]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---- request pipeline (runs on handler threads)

    def _note_error(self, exc: BaseException | None) -> None:
        if exc is not None:
            traceback.print_exception(exc)
            with self._lock:
                self.errors.append(exc)

    def _route_of(self, method: str | None, path: str) -> tuple[str | None, str | None]:
        for route_method, pattern, route in self._routes:
            match = pattern.search(path)
            if match and (method is None or method == route_method):
                return route, match.groupdict().get("deployment")
        return None, None

    def _record(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> RecordedRequest:
        parts = urlsplit(target)
        try:
            parsed = jsonlib.loads(body) if body else None
        except ValueError:
            parsed = None
        route, deployment = self._route_of(method, parts.path)
        with self._lock:
            self._counter += 1
            request_id = f"req_fake{self._counter:06d}"
            request = RecordedRequest(
                method=method,
                path=parts.path,
                query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                query_string=parts.query,
                headers={name.lower(): value for name, value in headers.items()},
                body=parsed,
                raw_body=body,
                route=route,
                deployment=deployment,
                request_id=request_id,
            )
            self._requests.append(request)
        return request

    def _decide(self, request: RecordedRequest) -> Entry | _Reply:
        """Auth and routing errors first (they consume no plan entry), then the plan, the handler, the
        default."""
        if request.route is None:
            return self._not_found(request)
        if self.require_key is not None and not self._authorized(request):
            return self._unauthorized(request)
        with self._lock:
            for key in (request.path, request.route):
                queue = self._queues.get(key)
                if queue:
                    return queue.popleft()
        if self.handler is not None:
            entry = self.handler(request)
            if entry is not None:
                return entry
        return self.default

    def _render(self, entry: Entry, request: RecordedRequest) -> _Reply:
        if isinstance(entry, Ok):
            reply = self._render_ok(entry, request)
            reply.headers.update(entry.headers or {})
            return reply
        if isinstance(entry, Status):
            return self._render_status(entry, request)
        if isinstance(entry, MalformedBody):
            return _malformed(entry.kind)
        if isinstance(entry, Raw):
            return _raw(entry)
        raise TypeError(f"cannot render {entry!r} as a reply body")

    # ---- provider hooks

    def _authorized(self, request: RecordedRequest) -> bool:
        raise NotImplementedError

    def _unauthorized(self, request: RecordedRequest) -> _Reply:
        raise NotImplementedError

    def _not_found(self, request: RecordedRequest) -> _Reply:
        raise NotImplementedError

    def _render_ok(self, entry: Ok, request: RecordedRequest) -> _Reply:
        raise NotImplementedError

    def _render_status(self, entry: Status, request: RecordedRequest) -> _Reply:
        raise NotImplementedError


def _requested_model(request: RecordedRequest, entry: Ok, fallback: str) -> str:
    if entry.model is not None:
        return entry.model
    if isinstance(request.body, dict) and isinstance(request.body.get("model"), str):
        return str(request.body["model"])
    return request.deployment or fallback


# ------------------------------------------------------------------------------------------------------------
# OpenAI (and Azure OpenAI)

_OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    # status: (type, code, message)
    400: ("invalid_request_error", None, "Invalid request (fake)."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: (
        "request_forbidden",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported",
    ),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model does not exist or you do not have access to it.",
    ),
    408: ("timeout", None, "Request timed out."),
    409: ("invalid_request_error", None, "Conflict."),
    413: ("invalid_request_error", None, "Request too large."),
    422: ("invalid_request_error", None, "Unprocessable entity."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
    504: ("server_error", None, "Gateway timeout."),
}
_OPENAI_CODES: dict[str, tuple[str, str]] = {
    # code: (type, message)
    "context_length_exceeded": (
        "invalid_request_error",
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130123 "
        "tokens. Please reduce the length of the messages.",
    ),
    "insufficient_quota": (
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
    ),
    "content_filter": (
        "invalid_request_error",
        "The response was filtered due to the prompt triggering content management policy.",
    ),
}


class FakeOpenAIServer(_FakeServer):
    """OpenAI API fake: chat completions (JSON and SSE), Responses, models, Azure deployments."""

    provider = "openai"
    _request_id_header = "x-request-id"
    _routes = (
        (
            "POST",
            re.compile(r"^/openai/deployments/(?P<deployment>[^/]+)/chat/completions$"),
            "/v1/chat/completions",
        ),
        ("POST", re.compile(r"(?:^|/)chat/completions$"), "/v1/chat/completions"),
        ("POST", re.compile(r"(?:^|/)responses$"), "/v1/responses"),
        ("GET", re.compile(r"(?:^|/)models$"), "/v1/models"),
    )

    def __init__(
        self,
        *,
        default: Entry | None = None,
        handler: Handler | None = None,
        require_key: str | None = None,
        models: tuple[str, ...] = ("gpt-4.1-mini", "gpt-4o-mini", "o4-mini"),
    ) -> None:
        super().__init__(default=default, handler=handler, require_key=require_key, models=models)

    @staticmethod
    def _is_azure(request: RecordedRequest) -> bool:
        return request.path.startswith("/openai/")

    # ---- errors

    def _authorized(self, request: RecordedRequest) -> bool:
        bearer = request.headers.get("authorization") == f"Bearer {self.require_key}"
        if self._is_azure(request):
            return bearer or request.headers.get("api-key") == self.require_key
        return bearer

    def _unauthorized(self, request: RecordedRequest) -> _Reply:
        if self._is_azure(request):
            message = (
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide "
                "a valid key for an active subscription and use a correct regional API endpoint for your "
                "resource."
            )
            return _json_reply(401, {"error": {"code": "401", "message": message}})
        return self._render_status(status(401), request)

    def _not_found(self, request: RecordedRequest) -> _Reply:
        if self._is_azure(request):
            return _json_reply(404, {"error": {"code": "404", "message": "Resource not found"}})
        message = f"Invalid URL ({request.method} {request.path})"
        return _json_reply(
            404, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
        )

    def _render_status(self, entry: Status, request: RecordedRequest) -> _Reply:
        default_type, default_code, default_message = _OPENAI_ERRORS.get(
            entry.http_status,
            (
                "server_error" if entry.http_status >= 500 else "invalid_request_error",
                None,
                f"HTTP {entry.http_status}",
            ),
        )
        code = entry.code if entry.code is not None else default_code
        code_type, code_message = _OPENAI_CODES.get(code or "", (default_type, default_message))
        error = {
            "message": entry.message or code_message,
            "type": entry.error_type or code_type,
            "param": "messages" if code == "context_length_exceeded" else None,
            "code": code,
        }
        return _json_reply(entry.http_status, {"error": error}, _status_headers(entry))

    # ---- success bodies

    def _render_ok(self, entry: Ok, request: RecordedRequest) -> _Reply:
        if request.route == "/v1/models":
            return self._models_reply()
        if request.route == "/v1/responses":
            if request.stream:
                return self._render_status(
                    status(400, message="FakeOpenAIServer does not stream the Responses API"), request
                )
            return _json_reply(200, self._response_object(entry, request))
        if request.stream:
            return self._chat_stream(entry, request)
        return _json_reply(200, self._chat_completion(entry, request))

    def _models_reply(self) -> _Reply:
        data = [
            {"id": model, "object": "model", "created": _CREATED, "owned_by": "fake"} for model in self.models
        ]
        return _json_reply(200, {"object": "list", "data": data})

    @staticmethod
    def _finish_reason(entry: Ok) -> str:
        return entry.finish_reason or ("length" if entry.truncated else "stop")

    def _chat_completion(self, entry: Ok, request: RecordedRequest) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": entry.answer_text,
            "refusal": None,
            "annotations": [],
        }
        if entry.reasoning is not None:
            message["reasoning_content"] = entry.reasoning
        body: dict[str, Any] = {
            "id": f"chatcmpl-{request.request_id}",
            "object": "chat.completion",
            "created": _CREATED,
            "model": _requested_model(request, entry, "gpt-4.1-mini"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish_reason(entry),
                }
            ],
            "system_fingerprint": "fp_fake",
            "service_tier": "default",
        }
        usage = _chat_usage(entry)
        if usage is not None:
            body["usage"] = usage
        return body

    def _chat_stream(self, entry: Ok, request: RecordedRequest) -> _Reply:
        stream_options = (request.body.get("stream_options") or {}) if isinstance(request.body, dict) else {}
        include_usage = bool(stream_options.get("include_usage"))
        base = {
            "id": f"chatcmpl-{request.request_id}",
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": _requested_model(request, entry, "gpt-4.1-mini"),
            "system_fingerprint": "fp_fake",
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            event = {
                **base,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
            if include_usage:
                event["usage"] = None  # OpenAI sends usage: null on every chunk but the last
            return event

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if entry.reasoning:
            events += [chunk({"reasoning_content": piece}) for piece in _split_text(entry.reasoning)]
        events += [chunk({"content": piece}) for piece in _split_text(entry.answer_text)]
        events.append(chunk({}, self._finish_reason(entry)))
        if include_usage:
            events.append({**base, "choices": [], "usage": _chat_usage(entry)})
        chunks = [f"data: {jsonlib.dumps(event)}\n\n".encode() for event in events] + [b"data: [DONE]\n\n"]
        return _Reply(
            200,
            {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
            chunks,
            stream=True,
        )

    def _response_object(self, entry: Ok, request: RecordedRequest) -> dict[str, Any]:
        body = request.body if isinstance(request.body, dict) else {}
        finish = entry.finish_reason or ("length" if entry.truncated else "stop")
        incomplete_reason = {"length": "max_output_tokens", "max_output_tokens": "max_output_tokens"}.get(
            finish
        )
        if finish == "content_filter":
            incomplete_reason = "content_filter"
        item_status = "incomplete" if incomplete_reason else "completed"
        output: list[dict[str, Any]] = []
        if entry.reasoning is not None:
            output.append(
                {
                    "id": f"rs_{request.request_id}",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": entry.reasoning}],
                }
            )
        output.append(
            {
                "id": f"msg_{request.request_id}",
                "type": "message",
                "status": item_status,
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": entry.answer_text, "annotations": [], "logprobs": []}
                ],
            }
        )
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        response: dict[str, Any] = {
            "id": f"resp_{request.request_id}",
            "object": "response",
            "created_at": _CREATED,
            "status": item_status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": _requested_model(request, entry, "gpt-4.1-mini"),
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text", {"format": {"type": "text"}}),
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "user": None,
            "metadata": {},
        }
        if item_status == "completed":
            response["completed_at"] = _CREATED + 1
        usage = _responses_usage(entry)
        if usage is not None:
            response["usage"] = usage
        return response


def _chat_usage(entry: Ok) -> dict[str, Any] | None:
    if entry.wire_usage is not None:
        return dict(entry.wire_usage)
    usage = entry.neutral_usage
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    wire: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    prompt_details = {k: usage[k] for k in ("cached_tokens", "cache_write_tokens") if k in usage}
    if prompt_details:
        wire["prompt_tokens_details"] = prompt_details
    if "reasoning_tokens" in usage:
        wire["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return wire


def _responses_usage(entry: Ok) -> dict[str, Any] | None:
    if entry.wire_usage is not None:
        return dict(entry.wire_usage)
    usage = entry.neutral_usage
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": usage.get("cached_tokens", 0),
            "cache_write_tokens": usage.get("cache_write_tokens", 0),
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
        "total_tokens": prompt + completion,
    }


# ------------------------------------------------------------------------------------------------------------
# Anthropic Messages API

_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request (fake)."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: (
        "rate_limit_error",
        "This request would exceed your organization's rate limit. Please try again later.",
    ),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


class FakeAnthropicServer(_FakeServer):
    """Anthropic Messages API fake: text, forced ``tool_use``, ``thinking`` blocks, ``max_tokens`` stops."""

    provider = "anthropic"
    _request_id_header = "request-id"
    _routes = (
        ("POST", re.compile(r"(?:^|/)messages$"), "/v1/messages"),
        ("GET", re.compile(r"(?:^|/)models$"), "/v1/models"),
    )

    def __init__(
        self,
        *,
        default: Entry | None = None,
        handler: Handler | None = None,
        require_key: str | None = None,
        models: tuple[str, ...] = ("claude-sonnet-4-5", "claude-haiku-4-5"),
    ) -> None:
        super().__init__(default=default, handler=handler, require_key=require_key, models=models)

    # ---- errors

    def _authorized(self, request: RecordedRequest) -> bool:
        # The API takes x-api-key; anthropic SDK 2.x sends api_key as an Authorization bearer, which it also
        # accepts.
        bearer = request.headers.get("authorization") == f"Bearer {self.require_key}"
        return bearer or request.headers.get("x-api-key") == self.require_key

    def _error(
        self,
        http_status: int,
        error_type: str,
        message: str,
        request: RecordedRequest,
        headers: Mapping[str, str] | None = None,
    ) -> _Reply:
        body = {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": request.request_id,
        }
        return _json_reply(http_status, body, headers)

    def _unauthorized(self, request: RecordedRequest) -> _Reply:
        return self._error(401, "authentication_error", "invalid x-api-key", request)

    def _not_found(self, request: RecordedRequest) -> _Reply:
        return self._error(404, "not_found_error", f"Not found: {request.method} {request.path}", request)

    def _render_status(self, entry: Status, request: RecordedRequest) -> _Reply:
        default_type, default_message = _ANTHROPIC_ERRORS.get(
            entry.http_status,
            (
                "api_error" if entry.http_status >= 500 else "invalid_request_error",
                f"HTTP {entry.http_status}",
            ),
        )
        if entry.code == "context_length_exceeded":
            default_message = "prompt is too long: 204800 tokens > 200000 maximum"
        return self._error(
            entry.http_status,
            entry.error_type or default_type,
            entry.message or default_message,
            request,
            _status_headers(entry),
        )

    # ---- success bodies

    def _render_ok(self, entry: Ok, request: RecordedRequest) -> _Reply:
        if request.route == "/v1/models":
            data = [
                {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z"}
                for model in self.models
            ]
            first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
            return _json_reply(200, {"data": data, "has_more": False, "first_id": first, "last_id": last})
        if request.stream:
            return self._render_status(
                status(400, message="FakeAnthropicServer does not stream /v1/messages"), request
            )
        return _json_reply(200, self._message(entry, request))

    @staticmethod
    def _forced_tool(request: RecordedRequest) -> str | None:
        body = request.body if isinstance(request.body, dict) else {}
        choice = body.get("tool_choice")
        if not isinstance(choice, dict):
            return None
        if choice.get("type") == "tool":
            return str(choice.get("name"))
        tools = body.get("tools") or []
        if choice.get("type") == "any" and tools and isinstance(tools[0], dict):
            return str(tools[0].get("name"))
        return None

    def _message(self, entry: Ok, request: RecordedRequest) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if entry.reasoning is not None:
            content.append(
                {"type": "thinking", "thinking": entry.reasoning, "signature": f"sig_{request.request_id}"}
            )
        tool = self._forced_tool(request)
        if tool is not None and entry.json is not None and not entry.truncated:
            content.append(
                {"type": "tool_use", "id": f"toolu_{request.request_id}", "name": tool, "input": entry.json}
            )
            stop_reason = "tool_use"
        else:
            content.append({"type": "text", "text": entry.answer_text})
            stop_reason = "max_tokens" if entry.truncated else "end_turn"
        body: dict[str, Any] = {
            "id": f"msg_{request.request_id}",
            "type": "message",
            "role": "assistant",
            "model": _requested_model(request, entry, "claude-sonnet-4-5"),
            "content": content,
            "stop_reason": entry.finish_reason or stop_reason,
            "stop_sequence": None,
        }
        usage = _anthropic_usage(entry)
        if usage is not None:
            body["usage"] = usage
        return body


def _anthropic_usage(entry: Ok) -> dict[str, Any] | None:
    if entry.wire_usage is not None:
        return dict(entry.wire_usage)
    usage = entry.neutral_usage
    if not usage:
        return None
    cached, written = usage.get("cached_tokens", 0), usage.get("cache_write_tokens", 0)
    uncached = max(0, usage.get("prompt_tokens", 0) - cached - written)
    return {
        "input_tokens": uncached,
        "output_tokens": usage.get("completion_tokens", 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "service_tier": "standard",
    }
