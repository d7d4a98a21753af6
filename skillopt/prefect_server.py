"""The Prefect API server skillopt starts (``skillopt server start``, the temporary server of a run),
with one change to how it uses SQLite: every transaction begins ``IMMEDIATE``.

Prefect's SQLite configuration begins API transactions ``DEFERRED``: such a transaction reads, then tries
to write, and if the server's own services (the recorders of task-run events) wrote in between, SQLite
refuses the write at once with "database is locked" (a busy timeout cannot help a deferred transaction
that has read an older snapshot). The API answers 503 and Prefect's client retries after about 2 s. On a
run this hit the flow's own calls right after each wave of task runs: creating the ``skill-epoch`` subflow
took 2.1-6 s instead of 0.2 s (``bench/README.md``). Begun ``IMMEDIATE``, the transaction takes the write
lock first and waits for it (Prefect sets a 60 s busy timeout) instead of failing. SQLite serialises
writers either way, so nothing is lost but the retries.

    python -m skillopt.prefect_server server start --host 127.0.0.1 --port 4200   # Prefect's CLI, patched

Only SQLite databases are touched; a server on PostgreSQL is Prefect's own. If a Prefect version lacks the
hook, the server runs unchanged and says so in its log.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


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


def main(argv: list[str]) -> None:
    """Prefect's command line (``prefect <argv>``) in this process, with the SQLite change."""
    if not immediate_sqlite_transactions():
        print("skillopt: this Prefect version has no SQLite transaction hook; the server runs unchanged",
              file=sys.stderr)
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()


if __name__ == "__main__":  # pragma: no cover - the server process
    main(sys.argv[1:])
