"""The Prefect server skillopt starts begins SQLite transactions IMMEDIATE (``skillopt.prefect_server``).

With Prefect's own DEFERRED transactions, a subflow created right after a wave of task runs was refused
by SQLite ("database is locked"), answered 503, and Prefect's client retried it ~2 s later. The session's
server (tests/integration/conftest.py) is started through ``skillopt.prefect_server`` and logs every
request it answers 503 (``PREFECT_API_LOG_RETRYABLE_ERRORS``).
"""

from __future__ import annotations

import logging

from prefect import flow, task


@task
def _item(index: int) -> int:
    return index


@flow
def _epoch(index: int) -> int:
    return index


@flow
def _waves(waves: int, items: int) -> None:
    for wave in range(waves):
        for future in [_item.submit(i) for i in range(items)]:
            future.result()
        _epoch(wave)


def test_a_subflow_after_a_wave_of_task_runs_is_not_refused(prefect_settings, prefect_home, caplog):
    server_log = prefect_home / "server.log"
    before = server_log.read_text(errors="replace").count("retryable exception")
    with caplog.at_level(logging.DEBUG, logger="prefect.client"):
        _waves(3, 16)
    retried = [r.getMessage() for r in caplog.records if "retryable status code" in r.getMessage()]
    assert retried == []
    assert server_log.read_text(errors="replace").count("retryable exception") == before


def test_the_patch_is_applied_once_and_keeps_the_original_transaction(monkeypatch):
    from prefect.server.database.configurations import AioSqliteConfiguration

    from skillopt.prefect_server import immediate_sqlite_transactions

    original = AioSqliteConfiguration.begin_transaction
    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", original)
    assert immediate_sqlite_transactions()
    patched = AioSqliteConfiguration.begin_transaction
    assert patched is not original and patched._skillopt_immediate
    assert immediate_sqlite_transactions()  # a second call leaves the patch as it is
    assert AioSqliteConfiguration.begin_transaction is patched
