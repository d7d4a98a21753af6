"""A write-through store of model replies, keyed by the content of the request.

Prefect caches task results, but it writes a task's result only after reporting the task's state
to the API; a process killed in that window would pay again for calls that had already answered.
Every successful reply is therefore written here the moment it arrives (atomically, one small
JSON file per reply under the run's ``cache_dir``), and a request with the same content is
answered from here: after a ``kill -9`` at any point, re-running repeats no completed call.

The key is ``ChatRequest.cache_key``: the role's fingerprint (backend, model, effort, limits, sampling
parameters), the messages (every prompt text; images by content hash), the response schema, the per-call
overrides and the tags (item id, turn, epoch, sample index ...). The task layer's Prefect keys come from the
same function, so a model-calling task's key names the reply file of its first call.
``refresh=True`` (``run.refresh_cache``, ``--no-cache``) reads only the replies stored since ``since`` (the
run's first start): a run asked to recompute calls again what earlier runs stored, and when it is resumed it
still takes the replies its own interrupted attempts paid for.

A reply is written before its usage line (``RoleClient.chat``), so a kill between the two costs at
most an unrecorded cache hit, never a second payment. A kill in the middle of a write leaves a
temporary file named after its host and pid; opening the store removes those whose process is gone
(and any older than an hour, e.g. from another host on shared storage).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from skillopt.core.atomic import atomic_write_bytes
from skillopt.llm.chat import ChatRequest, ChatResponse

#: A temporary reply file older than this is an orphan whoever wrote it (a write takes milliseconds).
ORPHAN_AGE_S = 3600.0
#: True while this context prefetches (``skillopt.run.prefetch``): a reply it gets is also kept in memory for
#: the
#: first task of this process that asks for the same request, which takes it as its own call.
PREFETCH = contextvars.ContextVar("skillopt_prefetch", default=False)


class ReplyStore:
    def __init__(self, folder: Path, *, refresh: bool = False, since: float | None = None) -> None:
        self.folder = folder
        self.refresh = refresh
        #: With ``refresh``: the first moment whose replies are read (a file modification time); None: none.
        self.since = since
        self._guard = threading.Lock()
        self._claims: dict[str, tuple[threading.Lock, list[int]]] = {}
        self._prefetched: dict[str, ChatResponse] = {}
        self.sweep_orphans()

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """Hold ``key`` while its request is answered: the same request asked meanwhile in this process waits
        for that answer (then finds it here) instead of paying for it a second time."""
        with self._guard:
            lock, users = self._claims.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._guard:
                users[0] -= 1
                if not users[0]:
                    del self._claims[key]

    def keep_prefetched(self, key: str, response: ChatResponse) -> None:
        """The reply of a prefetched call (``PREFETCH``), for the task that asks for it
        (``take_prefetched``)."""
        with self._guard:
            self._prefetched[key] = response

    def take_prefetched(self, key: str) -> ChatResponse | None:
        """The reply this process prefetched for ``key``, once: that call was made and accounted already, so
        the asking task's call is that same call, not a cache hit."""
        with self._guard:
            return self._prefetched.pop(key, None)

    @staticmethod
    def key(fingerprint: str, request: ChatRequest) -> str:
        """Where the reply to ``request`` by the role ``fingerprint`` is filed: ``request.cache_key``."""
        return request.cache_key(fingerprint)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> ChatResponse | None:
        path = self._path(key)
        try:
            if self.refresh and (self.since is None or path.stat().st_mtime < self.since):
                return None  # stored before this run: recompute it
            return ChatResponse.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn or foreign file: call again and overwrite it

    def put(self, key: str, response: ChatResponse) -> None:
        atomic_write_bytes(self._path(key), response.model_dump_json(exclude={"parsed"}).encode("utf-8"),
                           owner=_owner())

    def sweep_orphans(self) -> int:
        """Remove temporary reply files left by killed writers; returns how many."""
        if not self.folder.is_dir():
            return 0
        host, now, removed = socket.gethostname(), time.time(), 0
        for shard in os.scandir(self.folder):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                    continue
                with contextlib.suppress(OSError):
                    if _writer_gone(entry.name, host) or now - entry.stat().st_mtime > ORPHAN_AGE_S:
                        os.unlink(entry.path)
                        removed += 1
        return removed


def _owner() -> str:
    """Who writes a temporary file: ``<host>-<pid>`` (dots and dashes of the host name kept apart)."""
    return f"{socket.gethostname().replace('.', '_')}-{os.getpid()}"


def _writer_gone(name: str, host: str) -> bool:
    """``.<key>.json.<host>-<pid>.<random>.tmp`` written on this host by a process that no longer runs."""
    parts = name.split(".")
    if len(parts) < 6:
        return False
    writer_host, _, pid = parts[3].rpartition("-")
    if writer_host != host.replace(".", "_") or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
