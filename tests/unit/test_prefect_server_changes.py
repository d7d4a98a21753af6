"""skillopt's changes to the Prefect server it starts (``skillopt.shell.prefect_server``), in this process:
the
task-run recorder's batches and the wait for queued events before a stopping server stops its services. The
servers themselves are checked in tests/integration (test_prefect_server_sqlite.py,
test_temporary_server_recording.py).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from skillopt.shell.prefect_server import (
    LEASE_STORAGE,
    RECORDER_SETTINGS,
    batched_task_run_recorder,
    drained_event_queues_at_shutdown,
    leases_on_disk,
    queues_emptied,
)


def test_the_recorder_takes_skillopts_batches_unless_the_user_set_its_settings():
    import prefect.settings
    from prefect.server.services.task_run_recorder import TaskRunRecorder
    from prefect.settings import temporary_settings

    def recorder() -> tuple[int, float]:
        settings = TaskRunRecorder.service_settings()  # what the service reads when it starts
        return settings.batch_size, settings.flush_interval

    prefects = recorder()
    assert prefects[0] == 1  # Prefect's default: one event per transaction
    with batched_task_run_recorder() as changed:
        assert recorder() == (RECORDER_SETTINGS["batch_size"], RECORDER_SETTINGS["flush_interval"])
        assert set(changed) == {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE",
                                "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"}
    assert recorder() == prefects
    # a value the user chose (here as a settings update; a profile or variable sets it the same way) stays
    chosen = {prefect.settings.PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE: 7}
    with temporary_settings(updates=chosen), batched_task_run_recorder() as changed:
        assert recorder() == (7, RECORDER_SETTINGS["flush_interval"])
        assert list(changed) == ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"]


def test_leases_are_kept_on_disk_unless_the_user_chose_a_lease_storage(tmp_path):
    import prefect.settings
    from prefect.server.concurrency.lease_storage import get_concurrency_lease_storage
    from prefect.settings import temporary_settings

    with temporary_settings(updates={prefect.settings.PREFECT_HOME: tmp_path}), leases_on_disk() as changed:
        assert changed == {"PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": LEASE_STORAGE}
        storage = get_concurrency_lease_storage()  # what the server's policies and services use
        assert type(storage).__module__ == LEASE_STORAGE
        assert storage.storage_path == tmp_path / "concurrency_leases"
    memory = "prefect.server.concurrency.lease_storage.memory"
    chosen = {prefect.settings.PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE: memory}
    with temporary_settings(updates=chosen), leases_on_disk() as changed:
        assert changed == {}
        assert type(get_concurrency_lease_storage()).__module__ == memory


@pytest.fixture
def topic():
    from prefect.server.utilities.messaging.memory import MemoryMessage, Topic

    topic = Topic.by_name(f"skillopt-test-{uuid.uuid4().hex}")
    subscription = topic.subscribe()
    yield topic, subscription, lambda n: MemoryMessage(data=str(n).encode(), attributes={})
    topic.clear()
    Topic._topics.pop(topic.name, None)


def test_queues_emptied_waits_for_the_consumers_and_gives_up_at_its_timeout(topic):
    _, subscription, message = topic

    async def scenario() -> tuple[bool, bool, int]:
        for n in range(3):
            await subscription.deliver(message(n))
        nobody = await queues_emptied(0.1)  # no consumer: still three messages when the time is up
        taken = []

        async def consume() -> None:
            while len(taken) < 3:
                taken.append(await subscription.get())
                await asyncio.sleep(0.05)

        consumer = asyncio.create_task(consume())
        emptied = await queues_emptied(5.0)
        left = subscription._queue.qsize()
        await consumer
        return nobody, emptied, left

    nobody, emptied, left = asyncio.run(scenario())
    assert nobody is False
    assert emptied is True and left == 0


def test_a_stopping_server_stops_its_services_only_once_the_queues_are_empty(topic, monkeypatch):
    from prefect.server.services.base import Service

    monkeypatch.setattr(Service, "running", Service.__dict__["running"])  # put back after the test
    assert drained_event_queues_at_shutdown()
    assert drained_event_queues_at_shutdown()  # a second call leaves the hook as it is
    assert getattr(Service.__dict__["running"].__func__, "_skillopt_drained", False)
    _, subscription, message = topic
    order: list[str] = []

    class NoServices(Service):  # Service.running() on a class no service derives from runs none of Prefect's
        pass

    async def scenario() -> None:
        async def consume() -> None:
            for _ in range(4):
                order.append(f"took {(await subscription.get()).data.decode()}")
                await asyncio.sleep(0.05)

        async with NoServices.running():  # what the server's lifespan enters, on Service
            for n in range(4):
                await subscription.deliver(message(n))
            consumer = asyncio.create_task(consume())
        order.append("services stopped")
        await consumer

    asyncio.run(scenario())
    assert order == ["took 0", "took 1", "took 2", "took 3", "services stopped"]
