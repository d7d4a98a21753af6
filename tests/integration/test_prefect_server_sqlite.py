"""The Prefect server skillopt starts begins SQLite transactions IMMEDIATE and records task runs in batches
(``skillopt.shell.prefect_server``).

With Prefect's own DEFERRED transactions, a subflow created right after a wave of task runs was refused
by SQLite ("database is locked"), answered 503, and Prefect's client retried it ~2 s later. The session's
server (tests/integration/conftest.py) is started through ``skillopt.shell.prefect_server`` and logs every
request it answers 503 (``PREFECT_API_LOG_RETRYABLE_ERRORS``).
"""

from __future__ import annotations

import logging
import time

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

    from skillopt.shell.prefect_server import immediate_sqlite_transactions

    original = AioSqliteConfiguration.begin_transaction
    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", original)
    assert immediate_sqlite_transactions()
    patched = AioSqliteConfiguration.begin_transaction
    assert patched is not original and patched._skillopt_immediate
    assert immediate_sqlite_transactions()  # a second call leaves the patch as it is
    assert AioSqliteConfiguration.begin_transaction is patched


def test_the_session_server_records_a_wave_of_task_runs_in_few_transactions(prefect_settings):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import TaskRunSort

    flow_run = _waves.with_options(flow_run_name="recorded-in-batches")(2, 16)
    assert flow_run is None
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["recorded-in-batches"])),
                sort=TaskRunSort.EXPECTED_START_TIME_ASC, limit=200)
            items = [r for r in runs if r.name.startswith("_item")]
            if len(items) >= 32 and all(r.state is not None and r.state.is_final() for r in items) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert len(items) == 32 and all(r.state is not None and r.state.is_completed() for r in items)
    # A transaction stamps every task run it creates with one time: one event per transaction (Prefect's
    # default) would give 32 different ones.
    created = {r.created for r in items}
    assert len(created) <= 16, sorted(created)
