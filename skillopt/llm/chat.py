"""The chat contract every backend speaks.

A ``ChatRequest`` carries messages (text and image parts), an optional response schema, per-call
overrides of the role's settings, the accounting ``stage`` and free-form ``tags``. A
``ChatResponse`` carries the answer text, the validated object when a schema was given, usage
(unreported counts are ``None``, never 0), latency, attempts, the served model id and whether the
output hit its cap.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import mimetypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Accounting labels, plus ``preflight`` for the one-token checks of
#: ``skillopt backends check``.
Stage = Literal[
    "rollout", "judge", "analyst", "merge", "ranking", "lr", "rewrite", "slow_update", "meta_skill",
    "deep_probe", "preflight",
]
STAGES: tuple[str, ...] = Stage.__args__  # type: ignore[attr-defined]

#: Which role serves each stage.
ROLE_OF_STAGE = {
    "rollout": "target",
    "judge": "judge",
    **{s: "optimizer" for s in ("analyst", "merge", "ranking", "lr", "rewrite", "slow_update", "meta_skill",
                                "deep_probe")},
}

_IMAGE_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
               ".gif": "image/gif"}


class TextPart(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    """An image: raw bytes, a file path, or a ``data:`` URI. Backends encode it for their wire format."""

    model_config = ConfigDict(frozen=True)

    type: Literal["image"] = "image"
    source: bytes | str
    mime: str | None = None
    detail: Literal["low", "high"] | None = None
    name: str | None = None

    def media_type(self) -> str:
        """The MIME type: given, from the data URI, or from the file extension (default png)."""
        if self.mime:
            return self.mime
        if isinstance(self.source, str) and self.source.startswith("data:"):
            return self.source[5:].split(";", 1)[0] or "image/png"
        if isinstance(self.source, str):
            suffix = Path(self.source).suffix.lower()
            return _IMAGE_MIME.get(suffix) or mimetypes.guess_type(self.source)[0] or "image/png"
        return "image/png"

    def data(self) -> bytes:
        """The image bytes."""
        if isinstance(self.source, bytes):
            return self.source
        if self.source.startswith("data:"):
            return base64.b64decode(self.source.split(",", 1)[1])
        return Path(self.source).read_bytes()

    def data_uri(self) -> str:
        """``data:<mime>;base64,<...>``."""
        if isinstance(self.source, str) and self.source.startswith("data:"):
            return self.source
        return f"data:{self.media_type()};base64,{base64.b64encode(self.data()).decode('ascii')}"

    def content_sha256(self) -> str:
        """``sha256`` of the image bytes: what cache keys use, so a changed file is a new request."""
        return hashlib.sha256(self.data()).hexdigest()

    def fingerprint(self) -> dict[str, Any]:
        """The image as cache keys see it: content hash, media type, detail and name (never the path)."""
        return {
            "type": "image",
            "sha256": self.content_sha256(),
            "mime": self.media_type(),
            "detail": self.detail,
            "name": self.basename(),
        }

    def basename(self) -> str:
        """How the image is named in traces and scripted matching: ``[image] <basename>``."""
        if self.name:
            return self.name
        if isinstance(self.source, str) and not self.source.startswith("data:"):
            return Path(self.source).name
        return f"image.{self.media_type().split('/')[-1]}"


Part = TextPart | ImagePart


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str | list[Part]

    def text(self) -> str:
        """The message as text; each image appears as ``[image] <basename>``."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(
            p.text if isinstance(p, TextPart) else f"[image] {p.basename()}" for p in self.content
        )

    def fingerprint(self) -> dict[str, Any]:
        """The message as cache keys see it: text parts verbatim, images by content hash."""
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content}
        parts = [
            p.model_dump(mode="json") if isinstance(p, TextPart) else p.fingerprint() for p in self.content
        ]
        return {"role": self.role, "content": parts}

    def chat_dict(self, image_block: Callable[[ImagePart], dict[str, Any]]) -> dict[str, Any]:
        """The message as chat APIs take it: string content as is; parts as ``{"type": "text"}``
        blocks, each image as ``image_block(part)`` (its shape is the provider's)."""
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content}
        blocks = [
            {"type": "text", "text": part.text} if isinstance(part, TextPart) else image_block(part)
            for part in self.content
        ]
        return {"role": self.role, "content": blocks}

    def images(self) -> list[ImagePart]:
        if isinstance(self.content, str):
            return []
        return [p for p in self.content if isinstance(p, ImagePart)]


def system(text: str) -> Message:
    return Message(role="system", content=text)


def user(content: str | list[Part]) -> Message:
    return Message(role="user", content=content)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


class ChatRequest(BaseModel):
    """One model call. ``None`` overrides mean "use the role's setting"."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    messages: list[Message]
    stage: Stage
    response_schema: type[BaseModel] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    seed: int | None = None
    timeout_s: float | None = None
    tags: dict[str, Any] = Field(default_factory=dict)

    def system_text(self) -> str:
        return "\n\n".join(m.text() for m in self.messages if m.role == "system")

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text()
        return ""

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages)

    def cache_key(self, role_fingerprint: str) -> str:
        """The one cache key of a model call: sha256 of everything that decides the reply.

        That is the role's fingerprint (backend, model, effort, limits, sampling parameters), the messages
        with every prompt text verbatim and images by content hash, the response schema, the per-call
        overrides, the stage and the tags (item id, turn, epoch, sample index ...). The reply store files
        replies under it and the task layer derives its Prefect cache keys from it, so editing any prompt
        text makes a new key for exactly the calls whose request it is part of.
        """
        schema = _json_schema(self.response_schema) if self.response_schema else None
        payload = {
            "role": role_fingerprint,
            "messages": [m.fingerprint() for m in self.messages],
            "schema": schema,
            "overrides": [self.max_tokens, self.temperature, self.reasoning_effort, self.seed],
            "stage": self.stage,
            "tags": self.tags,
        }
        text = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=256)
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema, generated once per class: every call's cache key holds it. Only read
    (serialised into the key), never changed."""
    return model.model_json_schema()


class Usage(BaseModel):
    """Token counts of one call; a count the provider did not report is ``None``, never 0."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    cache_write_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


class ChatResponse(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: str
    parsed: Any = None
    reasoning_text: str | None = None
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    attempts: int = 1
    model: str | None = None
    backend: str = ""
    finish_reason: str | None = None
    request_id: str | None = None
    truncated: bool = False
    cost_usd: float | None = None
