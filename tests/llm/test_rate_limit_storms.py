"""429 storms: callers keep their own jitter after a shared pause, and the give-up policy
(``model.retry.rate_limit_patience_s``) decides how long a refusing provider is waited out.

Time is scaled down, never measured: the limiter's schedule runs on a fake clock, and the loopback
fake runs with ``model.retry.base``/``cap`` in milliseconds; assertions are on the schedule, the
attempts the fake counted and the messages.
"""

from __future__ import annotations

import random
import threading

import pytest

from skillopt.core.config import ProviderLimits, RetryPolicy, load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.errors import RateLimited
from skillopt.llm.limiter import LocalRateLimiter
from skillopt.llm.retry import Retrier
from tests.fakes.http_fakes import ok, status
from tests.llm.test_retry_and_limits import FakeClock


def test_callers_meeting_a_shared_pause_each_keep_their_own_jitter():
    clock = FakeClock()
    limiter = LocalRateLimiter({}, clock=clock, sleep=clock.sleep, rng=random.Random(3))
    for wait in (4.0, 6.0, 10.0):  # three callers got a 429 and paused the bucket with their own waits
        limiter.pause("p", wait)
    starts = [limiter.reserve("p", tokens=1) for _ in range(20)]
    # The pause holds everyone until its end (10 s) and then spreads them over half the longest pause,
    # instead of releasing all twenty at the same instant.
    assert min(starts) >= 10.0 and max(starts) <= 15.0
    assert len(set(starts)) == 20
    assert max(starts) - min(starts) > 2.5


def test_rpm_spacing_still_applies_after_a_pause():
    clock = FakeClock()
    limiter = LocalRateLimiter({"p": ProviderLimits(rpm=60)}, clock=clock, sleep=clock.sleep,
                               rng=random.Random(1))
    limiter.pause("p", 2.0)
    starts = [limiter.reserve("p", tokens=1) for _ in range(5)]
    assert starts[0] >= 2.0
    assert all(b - a >= 1.0 - 1e-9 for a, b in zip(starts, starts[1:], strict=False))


def test_a_call_ends_with_no_pause_once_the_pause_is_over():
    clock = FakeClock()
    limiter = LocalRateLimiter({}, clock=clock, sleep=clock.sleep, rng=random.Random(1))
    limiter.pause("p", 1.0)
    clock.sleep(5.0)
    assert limiter.reserve("p", tokens=1) == 5.0


def storm(clock: FakeClock, seconds: float):
    """A call that the provider refuses with 429 until ``seconds`` on ``clock``."""
    attempts: list[float] = []

    def call(attempt: int) -> str:
        attempts.append(clock())
        if clock() < seconds:
            raise RateLimited("HTTP 429: slow down", status=429)
        return "answer"

    return call, attempts


def test_the_default_policy_survives_a_60_second_storm():
    clock = FakeClock()
    policy = RetryPolicy()
    call, attempts = storm(clock, 60.0)
    value, made = Retrier(policy, sleep=clock.sleep, clock=clock, rng=random.Random(5)).run(call)
    assert value == "answer" and made == len(attempts)
    assert made > policy.max_attempts  # 429s are waited out by time, not by the attempt count
    assert attempts[-1] >= 60.0


def test_past_the_patience_the_call_stops_and_names_the_setting():
    clock = FakeClock()
    call, attempts = storm(clock, 10_000.0)
    policy = RetryPolicy(rate_limit_patience_s=90)
    with pytest.raises(RateLimited) as caught:
        Retrier(policy, sleep=clock.sleep, clock=clock, rng=random.Random(5)).run(call)
    message = str(caught.value)
    assert "kept answering 429 (rate limited)" in message
    assert "model.retry.rate_limit_patience_s (90 s)" in message and "model.providers" in message
    assert attempts[-1] <= 90.0  # no attempt was made past the patience
    assert caught.value.attempts == len(attempts)


def test_other_retryable_errors_still_stop_at_max_attempts():
    from skillopt.llm.errors import ServerError

    clock = FakeClock()
    count = 0

    def call(attempt: int) -> str:
        nonlocal count
        count += 1
        raise ServerError("HTTP 500", status=500)

    with pytest.raises(ServerError):
        Retrier(RetryPolicy(max_attempts=3), sleep=clock.sleep, clock=clock).run(call)
    assert count == 3


def clients_for(server, *overrides: str) -> ModelClients:
    loaded = load_config("qa", overrides=[
        "model.target.backend=openai_compatible", f"model.target.base_url={server.openai_base_url}",
        "model.target.model=m", *overrides], env={"OPENAI_COMPATIBLE_API_KEY": "k-test-storm"})
    return ModelClients.from_config(loaded, env={"OPENAI_COMPATIBLE_API_KEY": "k-test-storm"},
                                    registry=BackendRegistry.default())


def test_concurrent_callers_ride_out_a_storm_longer_than_max_attempts(openai_server):
    # Time scale: milliseconds. Twelve 429s shared by four callers, two attempts allowed for other errors.
    openai_server.plan("/v1/chat/completions", *[status(429) for _ in range(12)], *[ok(text="fine")] * 4)
    bundle = clients_for(openai_server, "model.retry.base=0.002", "model.retry.cap=0.01",
                         "model.retry.max_attempts=2", "model.retry.rate_limit_patience_s=30")
    answers: list[str] = []
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            answers.append(bundle.target.chat(ChatRequest(messages=[user("hi")], stage="rollout")).text)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and answers == ["fine"] * 4
    assert openai_server.calls("/v1/chat/completions") == 16


def test_a_storm_past_the_patience_fails_the_call_with_the_give_up_message(openai_server):
    openai_server.plan("/v1/chat/completions", *[status(429) for _ in range(400)])
    bundle = clients_for(openai_server, "model.retry.base=0.002", "model.retry.cap=0.004",
                         "model.retry.rate_limit_patience_s=0.05")
    with pytest.raises(RateLimited) as caught:
        bundle.target.chat(ChatRequest(messages=[user("hi")], stage="rollout"))
    message = str(caught.value)
    assert "kept answering 429" in message and "model.retry.rate_limit_patience_s" in message
    assert str(caught.value).startswith("[target] openai_compatible")
    assert 1 < openai_server.calls("/v1/chat/completions") < 400
