"""The harness's URL fetch for SealQA.

The harness fetches, never the target. :class:`UrlFetcher` is the protocol a fetcher implements;
:class:`UrllibFetcher` is the real one (plain ``http``/``https`` GET, no other scheme, a bounded
body) and is never used by the offline tests, which pass a fake fetcher instead. :func:`page_text`
turns a fetched page into the text the target reads: scripts, styles and tags stripped, whitespace
collapsed, capped.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from html.parser import HTMLParser
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

#: The only URL schemes the harness fetches; anything else (``file:``, ``ftp:``, ``data:``) is refused.
ALLOWED_SCHEMES = ("http", "https")
#: The most bytes read from one response; the text shown to the target is capped far below this.
MAX_BODY_BYTES = 2_000_000
USER_AGENT = "skillopt-sealqa/1 (+https://github.com/)"
_SKIPPED_ELEMENTS = frozenset({"script", "style", "noscript", "template", "svg"})


class FetchError(Exception):
    """A URL could not be fetched (bad scheme, HTTP error, timeout, network); the message says why."""


@runtime_checkable
class UrlFetcher(Protocol):
    """Fetches one URL for the harness.

    ``fetch(url, timeout_s=...)`` returns the response body as text (HTML or plain text; the
    caller strips tags). Any failure to fetch raises :class:`FetchError`; the caller turns it into
    a ``[fetch error]`` block the target reads, never a crash of the item.
    """

    def fetch(self, url: str, *, timeout_s: float) -> str: ...


def check_scheme(url: str) -> None:
    """Raise :class:`FetchError` unless ``url`` is an absolute ``http``/``https`` URL."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ALLOWED_SCHEMES or not parts.netloc:
        raise FetchError(f"refused {url!r}: only absolute http(s) URLs are fetched")


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects only to http(s), so a page cannot bounce the harness to ``ftp:`` or ``file:``."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_scheme(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class UrllibFetcher:
    """The real fetcher: one ``GET`` through ``urllib`` with only the HTTP handlers installed.

    No ``file:``/``ftp:``/``data:`` handler is registered, proxies come from the environment, the
    body is read up to :data:`MAX_BODY_BYTES` and decoded with the declared charset (UTF-8 by
    default, undecodable bytes replaced).
    """

    def __init__(self, *, user_agent: str = USER_AGENT, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.user_agent = user_agent
        self.max_body_bytes = max_body_bytes
        self._opener = urllib.request.OpenerDirector()
        for handler in (
            urllib.request.ProxyHandler(),
            urllib.request.HTTPHandler(),
            urllib.request.HTTPSHandler(),
            _HttpOnlyRedirects(),
            urllib.request.HTTPDefaultErrorHandler(),
            urllib.request.HTTPErrorProcessor(),
        ):
            self._opener.add_handler(handler)

    def fetch(self, url: str, *, timeout_s: float) -> str:
        check_scheme(url)
        request = urllib.request.Request(url, headers={"User-Agent": self.user_agent}, method="GET")
        try:
            with self._opener.open(request, timeout=timeout_s) as response:
                body = response.read(self.max_body_bytes)
                charset = response.headers.get_content_charset() or "utf-8"
        except urllib.error.HTTPError as exc:
            raise FetchError(f"HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise FetchError(f"{type(exc.reason).__name__}: {exc.reason}") from None
        except (TimeoutError, OSError, ValueError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}") from None
        try:
            return body.decode(charset, errors="replace")
        except LookupError:  # an unknown charset name in the header
            return body.decode("utf-8", errors="replace")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_ELEMENTS:
            self._skipping.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._skipping:
            while self._skipping and self._skipping.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def page_text(body: str, max_chars: int) -> str:
    """The readable text of ``body``: script/style contents and all tags removed, entities decoded,
    whitespace collapsed, cut to ``max_chars`` characters."""
    extractor = _TextExtractor()
    extractor.feed(body)
    extractor.close()
    return " ".join(" ".join(extractor.parts).split())[:max_chars]


__all__ = [
    "ALLOWED_SCHEMES",
    "FetchError",
    "UrlFetcher",
    "UrllibFetcher",
    "check_scheme",
    "page_text",
]
