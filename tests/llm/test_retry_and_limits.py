"""The retry policy and the shared rate limiter, on a fake clock."""

from __future__ import annotations

import random
import threading

import pytest

from skillopt.core.config import ProviderLimits, RetryPolicy
from skillopt.llm.errors import AuthError, ConnectionFailed, RateLimited, ServerError
from skillopt.llm.limiter import LocalRateLimiter
from skillopt.llm.retry import Retrier, RetryNotes, parse_retry_after


class FakeClock:
    """A clock that only moves when someone sleeps; thread-safe."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += max(0.0, seconds)


def test_backoff_with_equal_jitter_stays_within_bounds():
    retrier = Retrier(RetryPolicy(base=1, cap=60), rng=random.Random(7))
    for attempt in range(1, 10):
        ceiling = min(60, 2 ** (attempt - 1))
        for _ in range(50):
            assert ceiling / 2 <= retrier.delay(attempt) <= ceiling


def test_retry_after_is_a_minimum_delay():
    retrier = Retrier(RetryPolicy(base=1, cap=60), rng=random.Random(1))
    assert retrier.delay(1, retry_after=7.5) == 7.5
    assert retrier.delay(8, retry_after=0.1) >= 32


@pytest.mark.parametrize("headers,expected", [
    ({"Retry-After": "3"}, 3.0),
    ({"retry-after-ms": "250"}, 0.25),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
    ({}, None),
])
def test_parse_retry_after(headers, expected):
    from email.utils import parsedate_to_datetime

    now = parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert parse_retry_after(headers, now=now) == expected


def test_retryable_errors_are_retried_until_success_and_sleeps_honour_retry_after():
    clock = FakeClock()
    outcomes = [RateLimited("slow down", retry_after=2.0), ServerError("boom"), "ok"]

    def call(attempt: int) -> str:
        outcome = outcomes[attempt - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    retried = []
    value, attempts = Retrier(RetryPolicy(), sleep=clock.sleep, clock=clock, rng=random.Random(0)).run(
        call, on_retry=lambda error, wait: retried.append((type(error).__name__, wait)))
    assert (value, attempts) == ("ok", 3)
    assert clock.sleeps[0] >= 2.0
    assert 1.0 <= clock.sleeps[1] <= 2.0  # second backoff: d = 2, sleep in [1, 2]
    assert [name for name, _ in retried] == ["RateLimited", "ServerError"]


def test_non_retryable_error_is_raised_after_one_attempt():
    calls = []

    def call(attempt: int) -> str:
        calls.append(attempt)
        raise AuthError("HTTP 401")

    with pytest.raises(AuthError) as info:
        Retrier(RetryPolicy(), sleep=lambda s: None).run(call)
    assert calls == [1]
    assert info.value.attempts == 1


def test_attempts_are_capped_by_max_attempts():
    clock = FakeClock()
    with pytest.raises(ServerError) as info:
        Retrier(RetryPolicy(max_attempts=3), sleep=clock.sleep, clock=clock).run(
            lambda attempt: (_ for _ in ()).throw(ServerError("down")))
    assert info.value.attempts == 3
    assert len(clock.sleeps) == 2


def test_server_wait_longer_than_the_limit_fails_at_once():
    with pytest.raises(RateLimited) as info:
        Retrier(RetryPolicy(max_server_wait_s=300), sleep=lambda s: None).run(
            lambda attempt: (_ for _ in ()).throw(RateLimited("429", retry_after=900)))
    assert info.value.attempts == 1
    assert "asked to wait 900 s" in str(info.value)


def test_deadline_stops_retries():
    clock = FakeClock()
    with pytest.raises(ServerError) as info:
        Retrier(
            RetryPolicy(base=10, cap=60, max_attempts=50, deadline_s=100), sleep=clock.sleep, clock=clock
        ).run(lambda attempt: (_ for _ in ()).throw(ServerError("down")))
    assert clock.now <= 100
    assert "deadline_s" in str(info.value)


def test_limiter_holds_twenty_concurrent_callers_to_the_rpm():
    clock = FakeClock()
    limiter = LocalRateLimiter({"p": ProviderLimits(rpm=30)}, clock=clock, sleep=lambda s: None)
    starts: list[float] = []
    lock = threading.Lock()

    def caller() -> None:
        start = limiter.reserve("p", tokens=10)
        with lock:
            starts.append(start)

    threads = [threading.Thread(target=caller) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    starts.sort()
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(starts) == 20
    assert all(gap == pytest.approx(2.0) for gap in gaps)  # 30 rpm = one start every 2 s
    # No sliding 60 s window holds more than 30 starts (here: exactly 20 over 38 s).
    assert starts[-1] - starts[0] == pytest.approx(38.0)


def test_limiter_tpm_spaces_calls_by_their_token_estimate():
    clock = FakeClock()
    limiter = LocalRateLimiter({"p": ProviderLimits(tpm=6000)}, clock=clock, sleep=clock.sleep)
    assert limiter.reserve("p", tokens=3000) == 0.0
    assert limiter.reserve("p", tokens=3000) == pytest.approx(30.0)
    assert limiter.reserve("p", tokens=100000) == pytest.approx(60.0)  # an estimate above the limit is capped


def test_a_429_pauses_the_whole_bucket():
    clock = FakeClock()
    limiter = LocalRateLimiter({}, clock=clock, sleep=clock.sleep)
    limiter.pause("p", 5.0)
    with limiter.acquire("p", tokens=1):
        pass
    waited = clock.now
    assert 5.0 <= waited <= 7.5  # the pause, plus this caller's own jitter of up to half the pause
    with limiter.acquire("other", tokens=1):
        pass
    assert clock.now == waited


def test_max_concurrency_caps_calls_in_flight():
    limiter = LocalRateLimiter({"p": ProviderLimits(max_concurrency=2)})
    in_flight, peak = 0, 0
    lock = threading.Lock()
    release = threading.Event()

    def caller() -> None:
        nonlocal in_flight, peak
        with limiter.acquire("p", tokens=1):
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            release.wait(0.05)
            with lock:
                in_flight -= 1

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2


def test_a_role_s_retries_of_one_kind_are_one_line_then_summed_up():
    """An endpoint that goes down makes every call in flight retry: the first retry of a kind says why, the
    next ones are counted and summed up in one line at most every ``every_s``."""
    now = [100.0]
    notes = RetryNotes("target", every_s=30, clock=lambda: now[0])
    down = ConnectionFailed("cannot reach http://127.0.0.1:8080/v1: ConnectError")
    first = notes.line(down, "rollout", 0.7)
    assert first == ("[target] retrying stage rollout after ConnectionFailed in 0.7 s: cannot reach "
                     "http://127.0.0.1:8080/v1: ConnectError; further ConnectionFailed retries of this role "
                     "are summed up every 30 s")
    for _ in range(40):
        now[0] += 0.5
        assert notes.line(down, "rollout", 1.0) is None
    # another kind of error gets its own first line, with its HTTP status
    assert notes.line(ServerError("HTTP 503 from 127.0.0.1", status=503), "analyst", 2.0).startswith(
        "[target] retrying stage analyst after ServerError (HTTP 503) in 2.0 s: HTTP 503 from 127.0.0.1;")
    now[0] += 12.0
    summed = notes.line(down, "rollout", 4.5)
    assert summed == "[target] 41 ConnectionFailed retries in the last 32 s (stage rollout, next in 4.5 s)"
    assert notes.line(down, "rollout", 4.5) is None
