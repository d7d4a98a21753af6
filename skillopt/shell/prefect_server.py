"""The Prefect API server skillopt starts (``skillopt server start``, the temporary server of a run),
with four changes: every SQLite transaction begins ``IMMEDIATE``, task runs are recorded in batches,
concurrency leases are kept on disk, and a stopping server records the events it has received before its
services stop.

Prefect's SQLite configuration begins API transactions ``DEFERRED``: such a transaction reads, then tries
to write, and if the server's own services (the recorders of task-run events) wrote in between, SQLite
refuses the write at once with "database is locked" (a busy timeout cannot help a deferred transaction
that has read an older snapshot). The API answers 503 and Prefect's client retries after about 2 s. On a
run this hits the flow's own calls right after each wave of task runs, such as creating the ``skill-epoch``
subflow, each then waiting for the retry (``bench/README.md``). Begun ``IMMEDIATE``, the transaction takes
the write lock first and waits for it (Prefect sets a 60 s busy timeout) instead of failing. SQLite
serialises writers either way, so nothing is lost but the retries.

    python -m skillopt.shell.prefect_server server start --host 127.0.0.1 --port 4200   # Prefect's CLI,
    patched

Only SQLite databases are touched; a server on PostgreSQL is Prefect's own. If a Prefect version lacks the
hook, the server runs unchanged and says so in its log.

Prefect's task-run recorder (the service that turns a client's task-run events into task runs and their
states) writes each event in a transaction of its own by default (batch size 1): a statement built and
compiled anew per event, about half of the server's processor time during a run, on cores the run has to
share (``bench/README.md``).
skillopt's servers record up to ``RECORDER_SETTINGS["batch_size"]`` events per transaction, flushed at least
every ``RECORDER_SETTINGS["flush_interval"]`` seconds (the server's CPU halves); a task run then shows in the
UI up to a second after it changed. A value the user set (environment, profile, ``prefect.toml``) wins.

A deployment run holds its deployment's concurrency slot through a lease, which its process renews and which
frees the slot when it expires. Prefect keeps leases in the server's memory by default: a server that
restarts forgets them, so a run whose process died with the server held the slot for good, and a run still
alive was stopped at its next renewal ("Concurrency lease renewal failed"). skillopt's servers keep leases
in files under ``PREFECT_HOME`` (``LEASE_STORAGE``, Prefect's own file storage): after a restart a live run
renews its lease, and a dead run's lease expires (at most five minutes) and frees the slot. A lease storage
the user set wins.

A server stopping (SIGTERM: the temporary server at the end of its run, ``skillopt server stop``) cancels its
services, and the events still waiting in its in-memory queues for them were lost: task runs stayed RUNNING
in the database of a finished run (Prefect's per-event recorder fell behind the run's last wave). Before the
services stop, the server now waits until those queues are empty (at most ``DRAIN_TIMEOUT_S``); each
service then writes what it holds, as Prefect's own shutdown does.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

#: The task-run recorder's settings on skillopt's servers, where the user set none. Prefect reads the
#: interval as whole seconds (``int``): 1 is the shortest that is not a busy loop.
RECORDER_SETTINGS: dict[str, Any] = {"batch_size": 100, "flush_interval": 1}
#: The longest a stopping server waits for its services to take the events it has received.
DRAIN_TIMEOUT_S = 10.0
#: Prefect's concurrency lease storage in files under ``PREFECT_HOME/concurrency_leases``.
LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"


def immediate_sqlite_transactions() -> bool:
    """Make the server's SQLite transactions begin ``IMMEDIATE``; returns whether the hook was found."""
    try:
        from prefect.server.database.configurations import AioSqliteConfiguration
    except ImportError:
        return False
    original = getattr(AioSqliteConfiguration, "begin_transaction", None)
    if original is None or getattr(original, "_skillopt_immediate", False):
        return original is not None

    @asynccontextmanager
    async def begin_transaction(self: Any, session: Any, with_for_update: bool = False) -> AsyncIterator[Any]:
        async with original(self, session, with_for_update=True) as transaction:
            yield transaction

    begin_transaction._skillopt_immediate = True  # type: ignore[attr-defined]
    AioSqliteConfiguration.begin_transaction = begin_transaction  # type: ignore[method-assign]
    return True


def drained_event_queues_at_shutdown() -> bool:
    """Make the server wait, when it stops, until its in-memory message queues are empty before it stops its
    services; returns whether the hook was found."""
    try:
        from prefect.server.services.base import Service
    except ImportError:
        return False
    running = Service.__dict__.get("running")
    original = getattr(running, "__func__", None)
    if original is None or getattr(original, "_skillopt_drained", False):
        return original is not None

    @asynccontextmanager
    async def drained(cls: Any) -> AsyncIterator[None]:
        async with original(cls):
            try:
                yield
            finally:
                await queues_emptied(DRAIN_TIMEOUT_S)

    drained._skillopt_drained = True  # type: ignore[attr-defined]
    Service.running = classmethod(drained)  # type: ignore[method-assign,assignment]
    return True


async def queues_emptied(timeout_s: float) -> bool:
    """Wait until no subscription of Prefect's in-memory messaging holds a message (or ``timeout_s``);
    returns whether they emptied. Other messaging brokers keep their messages themselves: nothing to wait
    for."""
    import asyncio

    from prefect.server.utilities.messaging.memory import Topic

    def waiting() -> int:
        return sum(subscription._queue.qsize() + subscription._retry.qsize()
                   for topic in list(Topic._topics.values()) for subscription in list(topic._subscriptions))

    deadline = asyncio.get_running_loop().time() + timeout_s
    while waiting():
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@contextmanager
def batched_task_run_recorder() -> Iterator[dict[str, Any]]:
    """Within it, this process's Prefect settings record task runs in batches (``RECORDER_SETTINGS``) unless
    the user set the recorder's batch size or interval; yields the settings changed (name -> value)."""
    import prefect.settings
    from prefect.settings import get_current_settings, temporary_settings

    chosen = get_current_settings().server.services.task_run_recorder.model_fields_set
    changed = {f"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_{name.upper()}": value
               for name, value in RECORDER_SETTINGS.items() if name not in chosen}
    updates = {getattr(prefect.settings, name): value for name, value in changed.items()}
    with temporary_settings(updates=updates):
        yield changed


@contextmanager
def leases_on_disk() -> Iterator[dict[str, Any]]:
    """Within it, this process's Prefect settings keep concurrency leases in files (``LEASE_STORAGE``) unless
    the user chose a lease storage; yields the settings changed (name -> value), empty when the user chose or
    this Prefect version has no file storage."""
    import importlib.util

    import prefect.settings
    from prefect.settings import get_current_settings, temporary_settings

    chosen = "lease_storage" in get_current_settings().server.concurrency.model_fields_set
    if chosen or importlib.util.find_spec(LEASE_STORAGE) is None:
        yield {}
        return
    setting = prefect.settings.PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE
    with temporary_settings(updates={setting: LEASE_STORAGE}):
        yield {setting.name: LEASE_STORAGE}


@contextmanager
def skillopt_server() -> Iterator[None]:
    """Within it, a Prefect server started in this process has the four changes above (a change this Prefect
    version has no hook for is left out, and the server's log says so)."""
    if not immediate_sqlite_transactions():
        print("skillopt: this Prefect version has no SQLite transaction hook; transactions stay DEFERRED",
              file=sys.stderr)
    if not drained_event_queues_at_shutdown():
        print("skillopt: this Prefect version has no services hook; events still queued at shutdown are lost",
              file=sys.stderr)
    with batched_task_run_recorder(), leases_on_disk():
        yield


def main(argv: list[str]) -> None:
    """Prefect's command line (``prefect <argv>``) in this process, with skillopt's changes."""
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    with skillopt_server():
        app()


if __name__ == "__main__":  # pragma: no cover - the server process
    main(sys.argv[1:])
