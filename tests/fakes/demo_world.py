"""The demo world served by the real scripted ``demo`` backend, for tests that run training stages by
hand without Prefect: roll items out under a skill, and send optimizer requests.

``ask`` sends a request with its stage's reply model as the response schema, exactly as the flow's
``client.structured(request, Schema)`` does, and returns the validated reply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt.benchmarks.demo import DemoConfig, plugin
from skillopt.benchmarks.runner import run_item
from skillopt.core.data import Item
from skillopt.core.records import ItemResult
from skillopt.llm.base import BackendContext
from skillopt.llm.chat import ChatRequest, ChatResponse
from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set

INITIAL_SKILL = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")


def backend(role: str = "optimizer") -> ScriptedBackend:
    """The real scripted backend serving the built-in ``demo`` set, as a run configures it."""
    return ScriptedBackend(resolve_rule_set("demo", BackendContext(), where="test"), role=role, seed=7)


class TargetClient:
    """What the runner needs of a role client: ``chat``, answered here by the scripted backend."""

    def __init__(self) -> None:
        self._backend = backend("target")

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self._backend.attempt(request, timeout_s=30)


def items(split: str, tmp_path: Path, **cfg: Any) -> list[Item]:
    """The items of ``split`` of the generated demo world (``cfg``: ``DemoConfig`` overrides)."""
    return plugin.load_split(DemoConfig(**cfg), split, run_dir=tmp_path)


def rollout(rows: list[Item], skill: str, *, probe_instruction: str | None = None) -> list[ItemResult]:
    """Each item run once under ``skill`` by the shared runner (with a deep-probe readout if given)."""
    client = TargetClient()
    return [run_item(plugin, item, skill, DemoConfig(), target=client, judge=None,  # type: ignore[arg-type]
                     probe_instruction=probe_instruction) for item in rows]


def accuracy(rows: list[ItemResult]) -> float:
    return sum(row.hard for row in rows) / len(rows)


def ask(request: ChatRequest, schema: type[BaseModel]) -> Any:
    """One optimizer call through the scripted backend, validated against the stage's reply model."""
    response = backend().attempt(request.model_copy(update={"response_schema": schema}), timeout_s=30)
    assert isinstance(response.parsed, schema)
    return response.parsed
