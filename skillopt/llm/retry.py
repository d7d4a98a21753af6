"""The retry policy: the one layer that repeats failed model calls (docs/backends.md, "Reliability").

Only errors marked ``retryable`` (429, 5xx, 529, timeouts, connection resets, empty exec answers)
are repeated, with exponential backoff and equal jitter: ``d = min(cap, base * 2**(n-1))``, sleep
``d/2 + U(0, d/2)``. A server's ``Retry-After`` sets a minimum delay; a requested wait longer than
``max_server_wait_s`` fails at once. A provider refusing with 429 is waited out for up to
``rate_limit_patience_s`` from the call's first 429 (however many attempts that takes, within the
per-call deadline); past it the call fails with a message naming the setting. SDK retries are always off, so a
fake server sees exactly the attempts made here. ``sleep``, ``clock`` and the random source are injectable for
tests.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from skillopt.core.config import RetryPolicy
from skillopt.llm.errors import BackendError, RateLimited

log = logging.getLogger("skillopt.llm.retry")

T = TypeVar("T")


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


@dataclass
class Retrier:
    """Runs one call with the retry policy; ``on_retry(error, delay)`` hears about every retry."""

    policy: RetryPolicy
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """The wait before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        ceiling = min(self.policy.cap, self.policy.base * 2 ** (attempt - 1))
        wait = ceiling / 2 + self.rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait

    def run(
        self,
        call: Callable[[int], T],
        *,
        on_retry: Callable[[BackendError, float], None] | None = None,
    ) -> tuple[T, int]:
        """``call(attempt)`` until it succeeds; returns its value and the number of attempts.

        A non-retryable error, the last attempt's error, or a wait that would pass the per-call
        deadline is raised with ``attempts`` set.
        """
        started = self.clock()
        refused_since: float | None = None  # the first 429 of this call
        attempt = 0
        while True:
            attempt += 1
            try:
                return call(attempt), attempt
            except BackendError as error:
                error.attempts = attempt
                limited = isinstance(error, RateLimited)
                if limited and refused_since is None:
                    refused_since = self.clock()
                if not error.retryable or (attempt >= self.policy.max_attempts and not limited):
                    raise
                asked = error.retry_after if limited else None
                if asked is not None and asked > self.policy.max_server_wait_s:
                    error.hint = (
                        f"the server asked to wait {asked:.0f} s, more than "
                        f"model.retry.max_server_wait_s ({self.policy.max_server_wait_s:.0f} s)"
                    )
                    raise
                wait = self.delay(attempt, error.retry_after)
                if refused_since is not None and limited and \
                        self.clock() - refused_since + wait > self.policy.rate_limit_patience_s:
                    error.hint = (
                        "giving up: the provider kept answering 429 (rate limited) for "
                        f"{self.clock() - refused_since:.0f} s over {attempt} attempts, and the next retry "
                        "would pass model.retry.rate_limit_patience_s "
                        f"({self.policy.rate_limit_patience_s:.0f} s); lower the request rate "
                        "(model.providers.<key>.rpm or max_concurrency, or fewer benchmark.workers) or "
                        "raise model.retry.rate_limit_patience_s"
                    )
                    raise
                if self.clock() - started + wait > self.policy.deadline_s:
                    error.hint = ("giving up: the next retry would pass model.retry.deadline_s "
                                  f"({self.policy.deadline_s:.0f} s)")
                    raise
                if on_retry is not None:
                    on_retry(error, wait)
                self.sleep(wait)


#: After a role's first retry of one kind of error, its further retries of that kind are summed up in one line
#: at most this often.
RETRY_SUMMARY_S = 30.0


class RetryNotes:
    """The retry warnings of one role. The first retry of each kind of error is a line of its own, with the
    error's reason (it names the endpoint); the retries of that kind after it are counted, and a retry at
    least ``every_s`` after the last line says how many there were since.

    An endpoint that goes down makes every call in flight retry, each up to ``max_attempts`` times: one line
    per retry buried the run's story under a hundred of them in a minute."""

    def __init__(self, role: str, *, every_s: float = RETRY_SUMMARY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.role = role
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}  # error kind -> (its last line, retries since)

    def line(self, error: BackendError, stage: str, wait: float) -> str | None:
        """The warning to log for this retry, or None when it is counted for the next one."""
        kind, now = type(error).__name__, self._clock()
        with self._lock:
            last = self._kinds.get(kind)
            if last is not None and now - last[0] < self.every_s:
                self._kinds[kind] = (last[0], last[1] + 1)
                return None
            self._kinds[kind] = (now, 0)
        if last is None:
            status = "" if error.status is None else f" (HTTP {error.status})"
            return (f"[{self.role}] retrying stage {stage} after {kind}{status} in {wait:.1f} s: "
                    f"{error.reason}; further {kind} retries of this role are summed up every "
                    f"{self.every_s:.0f} s")
        return (f"[{self.role}] {last[1] + 1} {kind} retries in the last {now - last[0]:.0f} s "
                f"(stage {stage}, next in {wait:.1f} s)")
