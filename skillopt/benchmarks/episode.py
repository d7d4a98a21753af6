"""What a multi-step benchmark's ``Benchmark.run_episode`` works with: the target, the recorder and
the deadline (``EpisodeContext``), and what it hands back to the shared runner (``EpisodeResult``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from skillopt.llm.chat import ChatRequest, ChatResponse, Message

__all__ = ["EpisodeContext", "EpisodeResult", "TargetClient"]


class TargetClient(Protocol):
    """The ``target`` role as an episode uses it (``skillopt.llm.clients.RoleClient`` satisfies it)."""

    def chat(self, request: ChatRequest) -> ChatResponse: ...


@dataclass(frozen=True)
class EpisodeContext:
    """What an optional ``Benchmark.run_episode(item, skill, ctx)`` gets from the shared runner.

    ``messages`` is the prompt the runner built (the skill as the target sees it, plus any training
    readout) and has already recorded as turn-0 events; ``record`` appends one trajectory event;
    ``deadline`` is a ``time.monotonic()`` value past which no call, tool use or fetch starts.
    """

    target: TargetClient
    messages: Sequence[Message]
    cfg: BaseModel
    record: Callable[[dict[str, Any]], None]
    deadline: float
    tags: Mapping[str, Any] = field(default_factory=dict)

    def ask(self, messages: Sequence[Message], *, turn: int, max_tokens: int | None = None) -> str:
        """One target call (stage ``rollout``) on ``messages``; its reply is recorded as the
        assistant message of ``turn`` and returned. A model-call error propagates."""
        request = ChatRequest(messages=list(messages), stage="rollout", max_tokens=max_tokens,
                              tags={**self.tags, "turn": turn})
        text = self.target.chat(request).text
        self.record({"type": "message", "role": "assistant", "turn": turn, "content": text})
        return text


@dataclass(frozen=True)
class EpisodeResult:
    """What ``score`` needs (``response_text``) and what the result row reports."""

    response_text: str
    n_turns: int
    answered: bool
    fetched_urls: tuple[str, ...] = ()
