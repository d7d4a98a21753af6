"""Context windows learned during a run, per endpoint and model, kept in the run directory.

A window a server did not report but showed (an overflow error naming it, a reply cut short far below its
``max_tokens``) holds for that endpoint and model for the rest of the run, for every role on it, and is
written to ``context_windows.json`` in the run directory so a resumed run starts with it. ``summary.json``
names each learned window.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from skillopt.core.atomic import atomic_write_bytes

#: The file in the run directory that keeps the learned windows.
WINDOWS_FILE = "context_windows.json"


class ContextWindows:
    """Learned windows by endpoint key (``backend|base_url|model``), optionally kept in ``path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._windows: dict[str, dict[str, Any]] = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # a damaged file only costs relearning the window
        return {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("tokens"), int)}

    def get(self, key: str) -> int | None:
        with self._lock:
            entry = self._windows.get(key)
            return int(entry["tokens"]) if entry else None

    def learn(self, key: str, tokens: int, source: str) -> bool:
        """Keep ``tokens`` for ``key`` when it is the first or a smaller window; whether it changed."""
        with self._lock:
            known = self._windows.get(key)
            if known is not None and known["tokens"] <= tokens:
                return False
            self._windows[key] = {"tokens": tokens, "source": source}
            if self.path is not None:
                merged = {**self._read(), **self._windows}
                atomic_write_bytes(self.path, (json.dumps(merged, indent=2, sort_keys=True) + "\n").encode())
            return True

    def learned(self) -> dict[str, dict[str, Any]]:
        """Every learned window, this process's and those other processes of the run wrote."""
        with self._lock:
            return {**self._read(), **self._windows}
