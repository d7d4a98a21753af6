"""Prefect global concurrency limits as the provider rate limiter (``model.rate_limit_mode: prefect``).

For several processes (runs, deployments, workers) that share one provider quota. Each call takes
``rate_limit("skillopt-<key>-rpm", occupy=1)``, then ``rate_limit("skillopt-<key>-tpm",
occupy=<estimate>)``, then holds ``concurrency("skillopt-<key>-conc")`` while it runs, all with
``strict=True``: a limit that does not exist fails the call, naming it. The limits are created by
the user with Prefect's CLI, for example::

    prefect gcl create skillopt-openai-api-openai-com-rpm --limit 500 --slot-decay-per-second 8.33

Prefect's limits are coarse (2-7x slower than ideal, measured on 2 cores): use the in-process limiter unless
processes really share a quota. A 429 pauses the key inside this process; other processes learn of it from
their own 429s.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from prefect.concurrency.sync import concurrency, rate_limit

from skillopt.core.config import ProviderLimits
from skillopt.core.errors import ConfigError
from skillopt.llm.limiter import Pause


def limit_name(key: str, kind: str) -> str:
    """``skillopt-<key>-<kind>`` with the key slugged to ``[a-z0-9-]``."""
    slug = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
    return f"skillopt-{slug}-{kind}"


def create_commands(providers: Mapping[str, ProviderLimits]) -> dict[str, str]:
    """Each Prefect limit ``providers`` needs, by name, with the ``prefect gcl create`` command that makes it:
    an rpm or tpm limit refills its slots over a minute, a concurrency limit holds them while a call runs."""
    commands: dict[str, str] = {}
    for key, limits in providers.items():
        for kind, size, decay in (("rpm", limits.rpm, True), ("tpm", limits.tpm, True),
                                  ("conc", limits.max_concurrency, False)):
            if size:
                name = limit_name(key, kind)
                refill = f" --slot-decay-per-second {size / 60:.4g}" if decay else ""
                commands[name] = f"prefect gcl create {name} --limit {size}{refill}"
    return commands


def check_limits_exist(providers: Mapping[str, ProviderLimits]) -> None:
    """Before any call: every limit ``providers`` needs exists on the Prefect server, else a ``ConfigError``
    giving the commands that create the missing ones (each call would otherwise fail with Prefect's
    'must be created before acquiring slots', as an error row)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    commands = create_commands(providers)
    if not commands:
        return
    missing = []
    with get_client(sync_client=True) as client:
        for name in commands:
            try:
                client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                missing.append(name)
    if missing:
        raise ConfigError("model.rate_limit_mode: prefect needs Prefect global concurrency limits that do "
                          f"not exist on this server: {', '.join(missing)}; create them with: "
                          + "; ".join(commands[name] for name in missing))


class PrefectRateLimiter:
    """The ``RateLimiter`` protocol over Prefect global concurrency limits."""

    def __init__(
        self,
        providers: Mapping[str, ProviderLimits],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.providers = providers
        self.clock = clock
        self.sleep = sleep
        self._pauses: dict[str, Pause] = {}
        self._rng = random.Random()
        self._lock = threading.Lock()

    @contextmanager
    def acquire(self, key: str, *, tokens: int) -> Iterator[None]:
        with self._lock:
            now = self.clock()
            wait = self._pauses[key].start(now, self._rng) - now if key in self._pauses else 0.0
        if wait > 0:
            self.sleep(wait)
        limits = self.providers.get(key)
        if limits is None:
            yield
            return
        if limits.rpm:
            rate_limit(limit_name(key, "rpm"), occupy=1, strict=True)
        if limits.tpm:
            rate_limit(limit_name(key, "tpm"), occupy=max(1, min(tokens, limits.tpm)), strict=True)
        if limits.max_concurrency:
            with concurrency(limit_name(key, "conc"), occupy=1, strict=True):
                yield
        else:
            yield

    def pause(self, key: str, seconds: float) -> None:
        with self._lock:
            self._pauses.setdefault(key, Pause()).extend(self.clock(), seconds)
