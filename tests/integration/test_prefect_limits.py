"""`model.rate_limit_mode: prefect`: calls go through Prefect global concurrency limits.

They use the session's Prefect server (tests/integration/conftest.py).
"""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _api(prefect_settings):
    """Every test here talks to the session's Prefect server (tests/integration/conftest.py)."""


def create_limit(name: str, limit: int, decay: float = 0.0) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=limit, slot_decay_per_second=decay))


def test_concurrency_limit_holds_calls_in_flight_across_threads():
    from skillopt.core.config import ProviderLimits
    from skillopt.tasks.limits import PrefectRateLimiter, limit_name

    key = "openai_compatible:127.0.0.1:9999"
    assert limit_name(key, "conc") == "skillopt-openai-compatible-127-0-0-1-9999-conc"
    create_limit(limit_name(key, "conc"), 1)
    limiter = PrefectRateLimiter({key: ProviderLimits(max_concurrency=1)})
    in_flight, peak = 0, 0
    lock = threading.Lock()

    def call() -> None:
        nonlocal in_flight, peak
        with limiter.acquire(key, tokens=10):
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.3)
            with lock:
                in_flight -= 1

    # Each thread carries this test's settings (the API URL), as Prefect's task-runner threads do.
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(call,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert peak == 1


def test_a_missing_limit_fails_the_call_naming_it():
    from skillopt.core.config import ProviderLimits
    from skillopt.tasks.limits import PrefectRateLimiter

    limiter = PrefectRateLimiter({"anthropic:api.anthropic.com": ProviderLimits(rpm=50)})
    with pytest.raises(Exception, match="skillopt-anthropic-api-anthropic-com-rpm"), \
            limiter.acquire("anthropic:api.anthropic.com", tokens=100):
        pass


def test_keys_without_configured_limits_pass_straight_through():
    from skillopt.tasks.limits import PrefectRateLimiter

    with PrefectRateLimiter({}).acquire("anything", tokens=1):
        pass


def test_a_run_checks_its_limits_exist_before_any_call_and_gives_the_commands_to_create_them():
    from skillopt.core.config import ProviderLimits
    from skillopt.core.errors import ConfigError
    from skillopt.tasks.limits import check_limits_exist, limit_name

    key = "openai_compatible:127.0.0.1:7411"
    providers = {key: ProviderLimits(rpm=90, max_concurrency=3), "unlimited:host": ProviderLimits()}
    with pytest.raises(ConfigError) as info:
        check_limits_exist(providers)
    assert str(info.value) == (
        "model.rate_limit_mode: prefect needs Prefect global concurrency limits that do not exist on this "
        "server: skillopt-openai-compatible-127-0-0-1-7411-rpm, "
        "skillopt-openai-compatible-127-0-0-1-7411-conc; create them with: prefect gcl create "
        "skillopt-openai-compatible-127-0-0-1-7411-rpm --limit 90 --slot-decay-per-second 1.5; prefect gcl "
        "create skillopt-openai-compatible-127-0-0-1-7411-conc --limit 3")
    create_limit(limit_name(key, "rpm"), 90, decay=1.5)
    with pytest.raises(ConfigError, match=r"server: skillopt-openai-compatible-127-0-0-1-7411-conc; create"):
        check_limits_exist(providers)
    create_limit(limit_name(key, "conc"), 3)
    check_limits_exist(providers)  # all there: nothing to say
