"""A write-through store of model replies, keyed by the content of the request.

Prefect caches task results, but it writes a task's result only after reporting the task's state
to the API; a process killed in that window would pay again for calls that had already answered.
Every successful reply is therefore written here the moment it arrives (atomically, one small
JSON file per reply under the run's ``cache_dir``), and a request with the same content is
answered from here: after a ``kill -9`` at any point, re-running repeats no completed call.

The key covers what decides a reply: the role's fingerprint (backend, model, effort, limits,
sampling parameters), the messages (images by content hash), the response schema, the per-call overrides and the tags
(item id, turn, sample index ...). ``refresh=True`` skips reads (``run.refresh_cache``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from skillopt.atomic import atomic_write_bytes
from skillopt.llm.chat import ChatRequest, ChatResponse


class ReplyStore:
    def __init__(self, folder: Path, *, refresh: bool = False) -> None:
        self.folder = folder
        self.refresh = refresh

    @staticmethod
    def key(fingerprint: str, request: ChatRequest) -> str:
        schema = request.response_schema.model_json_schema() if request.response_schema else None
        payload = {
            "role": fingerprint,
            # Images by content hash, not by path: a changed picture is a new request.
            "messages": [m.fingerprint() for m in request.messages],
            "schema": schema,
            "overrides": [request.max_tokens, request.temperature, request.reasoning_effort, request.seed],
            "stage": request.stage,
            "tags": request.tags,
        }
        text = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> ChatResponse | None:
        if self.refresh:
            return None
        path = self._path(key)
        try:
            return ChatResponse.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn or foreign file: call again and overwrite it

    def put(self, key: str, response: ChatResponse) -> None:
        atomic_write_bytes(self._path(key), response.model_dump_json(exclude={"parsed"}).encode("utf-8"))
