"""Provider rate limits shared by every role and thread of a run (docs/backends.md, "Reliability").

One bucket per ``rate_limit_key`` (``<backend>:<host[:port]>`` by default), configured under
``model.providers.<key>: {rpm, tpm, max_concurrency}``. Each call reserves its start time: the
next request slot (``60/rpm`` apart) and room for its estimated tokens (``tokens * 60/tpm``), so the
requests a bucket lets through never exceed the configured rate in any window, however many
threads ask at once. ``max_concurrency`` caps calls in flight. A 429 pauses the bucket until the
server's retry time, so concurrent callers back off together, but not in lockstep: each caller that
meets a pause starts at its end plus its own random share of half the pause (a :class:`Pause`), so the
retries of a 429 storm are spread out instead of all hitting the provider within milliseconds.
Estimates are never refunded: the limiter errs on the safe side.

``RateLimiter`` is the protocol the clients use; the Prefect global-concurrency implementation
(``model.rate_limit_mode: prefect``) lives in the ``tasks`` package and is injected the same way.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from skillopt.core.config import ProviderLimits


class RateLimiter(Protocol):
    def acquire(self, key: str, *, tokens: int) -> AbstractContextManager[None]:
        """Wait for room for one call of about ``tokens`` tokens under ``key``; hold it while in use."""
        ...

    def pause(self, key: str, seconds: float) -> None:
        """Let no new call under ``key`` start for ``seconds`` (after a 429)."""
        ...


class NoLimits:
    """``model.rate_limit_mode: off``."""

    @contextmanager
    def acquire(self, key: str, *, tokens: int) -> Iterator[None]:
        yield

    def pause(self, key: str, seconds: float) -> None:
        return None


@dataclass
class Pause:
    """A provider's shared pause after 429s. Not thread-safe by itself: its owner holds a lock.

    ``until`` is the latest end any caller asked for; ``spread`` is half the longest pause asked for.
    A caller arriving during the pause starts at ``until + U(0, spread)``: together after the pause,
    yet each with its own jitter.
    """

    until: float = float("-inf")
    spread: float = 0.0

    def extend(self, now: float, seconds: float) -> None:
        self.until = max(self.until, now + seconds)
        self.spread = max(self.spread, seconds / 2)

    def start(self, now: float, rng: random.Random) -> float:
        """When a caller arriving at ``now`` may start (``now`` when there is no pause)."""
        if now >= self.until:
            self.spread = 0.0
            return now
        return self.until + rng.uniform(0, self.spread)


@dataclass
class _Bucket:
    limits: ProviderLimits
    request_at: float = float("-inf")  # earliest start of the next request slot
    tokens_at: float = float("-inf")  # when the token budget has room again
    pause: Pause = field(default_factory=Pause)
    semaphore: threading.BoundedSemaphore | None = None


@dataclass
class LocalRateLimiter:
    """In-process token reservation plus a semaphore per key; thread-safe."""

    providers: Mapping[str, ProviderLimits] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    #: Limits for keys with no entry in ``providers`` (e.g. the exec backends' ``max_parallel``).
    defaults: Mapping[str, ProviderLimits] = field(default_factory=dict)
    #: Each caller's jitter after a shared pause.
    rng: random.Random = field(default_factory=random.Random)
    _buckets: dict[str, _Bucket] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _bucket(self, key: str) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            limits = self.providers.get(key) or self.defaults.get(key) or ProviderLimits()
            semaphore = threading.BoundedSemaphore(limits.max_concurrency) if limits.max_concurrency else None
            bucket = self._buckets[key] = _Bucket(limits, semaphore=semaphore)
        return bucket

    def reserve(self, key: str, *, tokens: int) -> float:
        """Reserve a start time for one call and return it (may be now)."""
        with self._lock:
            bucket = self._bucket(key)
            now = self.clock()
            start = bucket.pause.start(now, self.rng)
            if bucket.limits.rpm:
                start = max(start, bucket.request_at)
                bucket.request_at = start + 60.0 / bucket.limits.rpm
            if bucket.limits.tpm:
                cost = min(tokens, bucket.limits.tpm)
                start = max(start, bucket.tokens_at)
                bucket.tokens_at = start + cost * 60.0 / bucket.limits.tpm
            return start

    @contextmanager
    def acquire(self, key: str, *, tokens: int) -> Iterator[None]:
        start = self.reserve(key, tokens=tokens)
        wait = start - self.clock()
        if wait > 0:
            self.sleep(wait)
        semaphore = self._bucket(key).semaphore
        if semaphore is None:
            yield
            return
        with semaphore:
            yield

    def pause(self, key: str, seconds: float) -> None:
        with self._lock:
            self._bucket(key).pause.extend(self.clock(), seconds)
