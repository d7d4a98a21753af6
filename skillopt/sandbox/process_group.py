"""Child processes in their own process group, and stopping the whole group.

A child that starts grandchildren (a shell, a command-line agent, a test harness, a server) must not leave
them running when it times out or is stopped. So such a child is started as the leader of a new process
group (a new session on POSIX, ``CREATE_NEW_PROCESS_GROUP`` on Windows) and stopping it signals the whole
group — and, because it is a different group, a Ctrl-C in the terminal does not reach it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any


def own_group() -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that make the child the leader of a new process group."""
    if os.name == "nt":  # pragma: no cover - exercised on Windows only
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
    return {"start_new_session": True}


def signal_group(process: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the whole group ``process`` leads (the process tree on Windows); a gone group is
    fine."""
    if os.name == "nt":  # pragma: no cover - exercised on Windows only
        if sig == signal.SIGTERM:
            process.terminate()
        else:
            subprocess.run(["taskkill", "/T", "/F", "/PID", str(process.pid)], capture_output=True,
                           check=False)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def end_group(process: subprocess.Popen[Any], *, grace_s: float) -> int:
    """Stop the group ``process`` leads and reap the leader; returns its exit code.

    A leader still running gets SIGTERM and ``grace_s`` seconds to exit (``grace_s=0``: none). Then the group
    gets SIGKILL in every case, so no grandchild outlives its leader.
    """
    if grace_s > 0 and process.poll() is None:
        signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    signal_group(process, getattr(signal, "SIGKILL", signal.SIGTERM))
    return process.wait()


def run_in_group(argv: Sequence[str], *, timeout_s: float, grace_s: float = 5.0,
                 **popen: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` with the child in its own group.

    At ``timeout_s`` the whole group is stopped (``end_group``) and ``subprocess.TimeoutExpired`` raised;
    ``subprocess.run`` alone would kill only the child and leave its children running.
    """
    process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               **own_group(), **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(process, grace_s=grace_s)
        process.communicate()
        raise
    finally:
        end_group(process, grace_s=0)
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)
