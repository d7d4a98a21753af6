"""Process checks the tests share."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (a killed process stays one until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def servers_of(prefect_home: str) -> list[int]:
    """The running processes with ``PREFECT_HOME=prefect_home`` in their environment whose command line
    is a Prefect server's (a temporary server lives on a moment after the run that started it)."""
    wanted = f"PREFECT_HOME={prefect_home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline, open(f"/proc/{entry}/environ", "rb") as env:
                argv, environ = cmdline.read(), env.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if wanted in environ and (b"uvicorn" in argv or b"prefect_server" in argv) and alive(int(entry)):
            found.append(int(entry))
    return found


def servers_stopped(prefect_home: str, timeout_s: float = 60.0) -> bool:
    """Wait up to ``timeout_s`` until no Prefect server of ``prefect_home`` runs (``servers_of``)."""
    deadline = time.monotonic() + timeout_s
    while servers_of(prefect_home):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def exit_while_making(monkeypatch: pytest.MonkeyPatch, prefix: str, work: Callable[[], Any],
                      folders: Callable[[], list[Path]]) -> tuple[list[Path], list[BaseException]]:
    """Run the clean-up at exit (``process_group.end_leftovers``) while a worker thread running ``work`` has
    just made a temporary folder named ``prefix*``: the thread is paused right after ``tempfile.mkdtemp``
    made it (as if it lost the processor there) until the clean-up ran or half a second passed.

    Returns what ``folders()`` listed the moment the clean-up returned, which is what a forced exit
    (``os._exit`` right after it) leaves for good, and what ``work`` raised. The caller patches
    ``process_group._exiting`` back (``monkeypatch``) and points ``tempfile.tempdir`` where ``folders``
    looks."""
    from skillopt.sandbox import process_group

    made, go = threading.Event(), threading.Event()
    mkdtemp = tempfile.mkdtemp

    def slow_mkdtemp(*args: Any, **kwargs: Any) -> str:
        folder = mkdtemp(*args, **kwargs)
        if Path(folder).name.startswith(prefix) and not made.is_set():
            made.set()
            go.wait(10)
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", slow_mkdtemp)
    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - the caller checks it
            raised.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    assert made.wait(30), f"work() made no folder {prefix}*"
    left: list[Path] = []

    def exit_cleanup() -> None:
        process_group.end_leftovers(grace_s=0.2)
        left.extend(folders())

    ender = threading.Thread(target=exit_cleanup)
    ender.start()
    ender.join(0.5)  # a clean-up that does not wait for the folder's listing returns meanwhile
    go.set()
    ender.join(30)
    worker.join(30)
    assert not ender.is_alive() and not worker.is_alive()
    return left, raised
