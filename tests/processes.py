"""Process checks the tests share."""

from __future__ import annotations

import os
import time


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
