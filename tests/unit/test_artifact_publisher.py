"""The run's artifact publisher: each key's versions in order, other keys side by side, all sent by close."""

from __future__ import annotations

import threading

from skillopt.tasks.artifacts import Publisher


def test_versions_of_one_key_keep_their_order_while_another_key_is_not_held_behind_them() -> None:
    sent: list[tuple[str, int]] = []
    lock = threading.Lock()
    release_first = threading.Event()
    other_sent = threading.Event()

    def create(*, key: str, n: int) -> str:
        if (key, n) == ("gates", 1):
            assert release_first.wait(10), "the first gates version was never released"
        with lock:
            sent.append((key, n))
        if key == "cost":
            other_sent.set()
        return f"{key}-{n}"

    publisher = Publisher(lanes=2)
    publisher.send("gates", create, key="gates", n=1)
    publisher.send("gates", create, key="gates", n=2)
    publisher.send("cost", create, key="cost", n=1)
    # The cost artifact goes out while the first gates version is still being sent ...
    assert other_sent.wait(10), "an artifact of another key waited behind a slow one"
    assert sent == [("cost", 1)]
    release_first.set()
    publisher.close(timeout_s=10)
    # ... and the gates versions reach the API in the order they were made.
    assert [n for key, n in sent if key == "gates"] == [1, 2]
    assert len(sent) == 3


def test_close_sends_everything_queued_and_stops_the_threads() -> None:
    sent: list[int] = []

    def create(*, key: str, n: int) -> None:
        sent.append(n)

    publisher = Publisher(lanes=3)
    for n in range(20):
        publisher.send("table", create, key=f"key-{n % 5}", n=n)
    publisher.close(timeout_s=10)
    assert sorted(sent) == list(range(20))
    assert not any(thread.is_alive() for thread in publisher._threads)


def test_a_progress_update_queued_behind_a_newer_one_is_dropped(monkeypatch) -> None:
    from skillopt.tasks import artifacts

    created = threading.Event()
    release = threading.Event()
    updates: list[float] = []

    def create_progress(self, *, progress: float, key: str, description: str) -> str:
        created.set()
        assert release.wait(10)
        return "00000000-0000-0000-0000-000000000001"

    def update_progress(self, *, artifact_id, progress: float, description: str) -> None:
        updates.append(progress)

    monkeypatch.setattr(artifacts.Publisher, "progress", create_progress)
    monkeypatch.setattr(artifacts.Publisher, "update_progress", update_progress)
    publisher = Publisher(lanes=1)
    publisher.send_progress(10.0, "step 1", "progress")
    assert created.wait(10)
    for percent in (50.0, 100.0):  # queued while the artifact is being created
        publisher.send_progress(percent, f"{percent}", "progress")
    release.set()
    publisher.close(timeout_s=10)
    assert updates == [100.0]
    assert str(publisher.progress_id) == "00000000-0000-0000-0000-000000000001"
