"""Child processes in their own process group, and stopping the whole group.

A child that starts grandchildren (a shell, a command-line agent, a test harness, a server) must not leave
them running when it times out or is stopped. So such a child is started as the leader of a new process
group (a new session on POSIX, ``CREATE_NEW_PROCESS_GROUP`` on Windows) and stopping it signals the whole
group — and, because it is a different group, a Ctrl-C in the terminal does not reach it.

So skillopt keeps a list of the groups it started and has not reaped yet, and of the temporary folders
(per-item workspaces) still in use. When skillopt exits before they are done — Ctrl-C, SIGTERM, an error,
worker threads abandoned at exit — :func:`end_leftovers` stops those groups (SIGTERM, then SIGKILL) and
removes those folders. The command calls it on the way out; an ``atexit`` hook is the backstop.

Processes of skillopt's own that start such groups too (a local Dask cluster's workers) are listed with
:func:`end_with_leftovers`: at exit each gets SIGTERM, on which it ends its own leftovers and exits, and the
exit waits for that within the same grace.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

#: How long the groups left at exit get between SIGTERM and SIGKILL (seconds, all of them together).
EXIT_GRACE_S = 1.0
#: The same for a process listed with ``end_with_leftovers``, asked to end its own groups: less, so that it is
#: done within the grace of the process that asks (which waits for it).
HELPER_GRACE_S = EXIT_GRACE_S / 2

# The groups started by ``start_in_group`` and not reaped yet (by leader pid), and the folders made by
# ``temp_folder`` and not given to ``keep_at_exit``. Worker threads add and remove; the lock guards both.
_live: dict[int, subprocess.Popen[Any]] = {}
_folders: dict[Path, None] = {}  # in the order listed: a folder made from another one is removed after it
_lock = threading.Lock()
# What lists the processes of skillopt's own that end their own leftovers on SIGTERM (``end_with_leftovers``).
_helpers: list[Callable[[], Iterable[Helper]]] = []
# Set once ``end_leftovers`` ran: skillopt is exiting, so a group started after that is stopped at once.
_exiting = False
# The leaders ``end_leftovers`` stopped: their owners raise ``Exiting`` instead of reporting a failure.
_stopped: set[int] = set()


class Helper(Protocol):
    """A process of skillopt's own, as ``multiprocessing.Process`` (or Dask's ``AsyncProcess``) shows it."""

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...


class Exiting(BaseException):
    """Skillopt stopped this child (or refused to start it) on its way out.

    Not an error of the item or the call: a ``BaseException``, so nothing records it as a failed item
    or a failed call (re-running the command does it again), as if the worker thread had been dropped.
    """


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
    code = process.wait()
    with _lock:
        _live.pop(process.pid, None)
    return code


def start_in_group(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)`` as the leader of a new group, which is stopped at exit if it is
    still running then (``end_leftovers``). Stop it with ``end_group``, which also reaps it."""
    try:
        process = subprocess.Popen(list(argv), **own_group(), **popen)
    except OSError as error:
        if exiting():  # e.g. its working folder was removed by the clean-up at exit meanwhile
            raise Exiting(f"skillopt is exiting: {argv[0]} is not started") from error
        raise
    with _lock:
        late = _exiting
        if not late:
            _live[process.pid] = process
    if late:  # started by a worker thread after the exit clean-up: it must not outlive skillopt either
        end_group(process, grace_s=0)
        raise Exiting(f"skillopt is exiting: stopped {argv[0]} at once")
    return process


def exiting() -> bool:
    """Whether the clean-up at exit ran (``end_leftovers``): skillopt is on its way out."""
    with _lock:
        return _exiting


def stopped_at_exit(process: subprocess.Popen[Any]) -> bool:
    """Whether ``end_leftovers`` stopped ``process`` (rather than it ending or timing out by itself)."""
    with _lock:
        return process.pid in _stopped


def run_in_group(argv: Sequence[str], *, timeout_s: float, grace_s: float = 5.0,
                 **popen: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` with the child in its own group.

    At ``timeout_s`` the whole group is stopped (``end_group``) and ``subprocess.TimeoutExpired`` raised;
    ``subprocess.run`` alone would kill only the child and leave its children running.
    """
    process = start_in_group(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(process, grace_s=grace_s)
        process.communicate()
        raise
    finally:
        end_group(process, grace_s=0)
    if stopped_at_exit(process):
        raise Exiting(f"skillopt is exiting: stopped {argv[0]}")
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)


def temp_folder(prefix: str, *, dir: Path | None = None) -> Path:
    """A new temporary folder (``tempfile.mkdtemp(prefix=prefix, dir=dir)``) that ``end_leftovers`` removes
    if it still exists when skillopt exits; its owner removes it and calls ``keep_at_exit`` when done with it.

    Created and listed in one step, which the clean-up at exit waits for: a worker thread creating a folder
    while skillopt exits leaves nothing behind (a folder created first and listed after could be created
    just before the clean-up and listed never, the process having exited in between). Raises ``Exiting``
    once that clean-up ran, creating nothing.
    """
    with _lock:
        if _exiting:
            raise Exiting(f"skillopt is exiting: no folder {prefix}* is made")
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
        _folders[folder] = None
    return folder


@contextlib.contextmanager
def scratch_folder(prefix: str, *, dir: Path | None = None) -> Iterator[Path]:
    """A ``temp_folder`` for the length of a ``with`` block: removed at the block's end, or by the clean-up
    at exit if skillopt exits first (where ``tempfile.TemporaryDirectory`` would leave it behind: a worker
    thread abandoned at exit never reaches its clean-up).

    An error in the block once that clean-up ran (it removed the folder under the block's work) is raised as
    ``Exiting``: not a failure of the item."""
    folder = temp_folder(prefix, dir=dir)
    try:
        yield folder
    except Exception as error:
        if exiting():
            raise Exiting(f"skillopt is exiting: {folder.name} was removed") from error
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        keep_at_exit(folder)


def keep_at_exit(folder: Path) -> None:
    """Forget ``folder``: its owner removed it, or keeps it on purpose."""
    with _lock:
        _folders.pop(folder, None)


def end_leftovers(grace_s: float = EXIT_GRACE_S) -> None:
    """Skillopt is exiting: stop every group still running and remove every folder still listed.

    Every group gets SIGTERM; once all leaders exited, or after ``grace_s``, every group gets SIGKILL (so no
    grandchild survives) and the leaders are reaped. The folders are removed after that, when nothing
    writes in them any more. Safe to call more than once.
    """
    global _exiting
    with _lock:
        _exiting = True
        processes = list(_live.values())
        _stopped.update(process.pid for process in processes)
        listers = list(_helpers)
    helpers = [(pid, helper) for helper in _listed(listers) if (pid := helper.pid) and helper.is_alive()]
    for pid, _ in helpers:  # each ends its own groups (within HELPER_GRACE_S) and exits
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    for process in processes:
        if process.poll() is None:
            signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while ((any(p.poll() is None for p in processes) or any(h.is_alive() for _, h in helpers))
           and time.monotonic() < deadline):
        time.sleep(0.05)
    for process in processes:
        end_group(process, grace_s=0)
    with _lock:
        folders = list(_folders)
        _folders.clear()
    for folder in folders:
        _remove(folder)


def end_with_leftovers(processes: Callable[[], Iterable[Helper]]) -> Callable[[], None]:
    """List processes of skillopt's own that start groups and folders of their own (a local Dask cluster's
    workers): at exit ``end_leftovers`` sends SIGTERM to each one ``processes()`` then lists as running and
    waits for it to exit within its grace. Such a process ends its own leftovers on SIGTERM (within
    ``HELPER_GRACE_S``) before it exits. Returns the call that takes ``processes`` off the list again."""
    with _lock:
        _helpers.append(processes)

    def forget() -> None:
        with _lock:
            if processes in _helpers:
                _helpers.remove(processes)

    return forget


def _listed(listers: list[Callable[[], Iterable[Helper]]]) -> list[Helper]:
    found: list[Helper] = []
    for lister in listers:
        with contextlib.suppress(Exception):  # exiting: a lister that fails lists nothing
            found.extend(lister())
    return found


def _remove(folder: Path, *, tries: int = 5) -> None:
    """Remove ``folder``. A worker thread still filling it can add an entry while it is being removed, which
    leaves it in place: try again (that thread fails on its first write once the folder is gone)."""
    for _ in range(tries):
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder):
            return


# The backstop: an exit that skipped the command's own call still stops the groups and removes the folders.
atexit.register(end_leftovers)
