"""SWE-bench agent runners behind one interface.

An agent runner turns one instance into a patch. Every model call goes through skillopt's own
``target`` role (``ctx.target``, a ``RoleClient``): accounted in ``usage.jsonl`` as stage
``rollout``, rate-limited and budgeted like any target call; no litellm.

- :class:`FakeAgentRunner` asks the target once with the prompt the plug-in built and submits the
  reply's diff as the patch.
- :class:`MiniSweAgentRunner` runs mini-swe-agent's ``DefaultAgent`` (the 1.x API) with its SWE-bench
  config in the instance's SWE-bench container, talking to the model through :class:`RoleModel`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from skillopt.benchmarks.episode import EpisodeContext
from skillopt.llm.chat import ChatRequest, Message

_FENCED = re.compile(r"```(?:diff|patch)?[ \t]*\n(.*?)```", re.DOTALL)
_DIFF_START = re.compile(r"^(?:diff --git |--- )", re.MULTILINE)
DOCKER_WORKDIR = "/testbed"


@dataclass(frozen=True)
class AgentOutcome:
    """What the agent produced: the patch (possibly empty), its exit status and the model calls used."""

    patch: str
    exit_status: str
    n_calls: int


class AgentRunner(Protocol):
    """Runs the agent on one instance; model-call errors propagate (the item then ends as an error row)."""

    def run(self, instance: Mapping[str, Any], skill: str, ctx: EpisodeContext, *, task: str,
            timeout_s: float) -> AgentOutcome: ...


def extract_patch(text: str) -> str:
    """The unified diff in a reply: the first fenced block holding a diff, else the text from the first
    ``diff --git``/``---`` line; ``""`` when there is none. Ends with a newline (``git apply`` needs it)."""
    for block in _FENCED.findall(text or ""):
        if _DIFF_START.search(block):
            return block.strip("\n") + "\n"
    found = _DIFF_START.search(text or "")
    if found is None:
        return ""
    return text[found.start():].rstrip() + "\n"


class FakeAgentRunner:
    """One target call per instance with the plug-in's own prompt; the reply's diff is the patch."""

    def run(self, instance: Mapping[str, Any], skill: str, ctx: EpisodeContext, *, task: str,
            timeout_s: float) -> AgentOutcome:
        max_tokens = getattr(ctx.cfg, "max_tokens", None)
        response = ctx.target.chat(
            ChatRequest(
                messages=list(ctx.messages),
                stage="rollout",
                max_tokens=max_tokens,
                tags={**ctx.tags, "turn": 1},
            )
        )
        ctx.record({"type": "message", "role": "assistant", "turn": 1, "content": response.text})
        patch = extract_patch(response.text)
        return AgentOutcome(patch=patch, exit_status="Submitted" if patch else "NoPatch", n_calls=1)


class RoleModel:
    """mini-swe-agent's model interface over the ``target`` role: ``query(messages) -> {"content": …}``,
    with ``n_calls`` and ``cost`` (the accounted USD cost of each call, so ``cost_limit`` still applies).
    Past ``deadline`` it refuses to start a call, which ends the agent with the step-limit exit."""

    def __init__(self, ctx: EpisodeContext, *, deadline: float, model_name: str, max_tokens: int | None,
                 limits_exceeded: type[Exception]) -> None:
        self.ctx = ctx
        self.deadline = deadline
        self.max_tokens = max_tokens
        self.limits_exceeded = limits_exceeded
        self.config = _ModelConfig(model_name=model_name)
        self.n_calls = 0
        self.cost = 0.0

    def query(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> dict[str, Any]:
        if time.monotonic() > self.deadline:
            raise self.limits_exceeded("timeout_per_instance reached")
        request = ChatRequest(messages=[Message(role=m["role"], content=str(m["content"])) for m in messages],
                              stage="rollout", max_tokens=self.max_tokens,
                              tags={**self.ctx.tags, "turn": self.n_calls + 1})
        response = self.ctx.target.chat(request)
        self.n_calls += 1
        self.cost += float(response.cost_usd or 0.0)
        return {"content": response.text}

    def get_template_vars(self) -> dict[str, Any]:
        return {"n_model_calls": self.n_calls, "model_cost": self.cost, "model_name": self.config.model_name}


@dataclass
class _ModelConfig:
    model_name: str


def docker_image(instance: Mapping[str, Any]) -> str:
    """The SWE-bench evaluation image of an instance (``__`` is not allowed in image names)."""
    if instance.get("image_name"):
        return str(instance["image_name"])
    compatible = str(instance["instance_id"]).replace("__", "_1776_")
    return f"swebench/sweb.eval.x86_64.{compatible}:latest".lower()


class MiniSweAgentRunner:
    """mini-swe-agent in the instance's container; ``minisweagent`` is imported only here."""

    def __init__(self, *, step_limit: int, cost_limit: float, model_name: str) -> None:
        self.step_limit = step_limit
        self.cost_limit = cost_limit
        self.model_name = model_name

    def run(self, instance: Mapping[str, Any], skill: str, ctx: EpisodeContext, *, task: str,
            timeout_s: float) -> AgentOutcome:
        import yaml
        from minisweagent.agents.default import DefaultAgent, LimitsExceeded
        from minisweagent.config import builtin_config_dir
        from minisweagent.environments.docker import DockerEnvironment

        settings = (
            yaml.safe_load((builtin_config_dir / "extra" / "swebench.yaml").read_text(encoding="utf-8")) or {}
        )
        agent_settings = dict(settings.get("agent") or {})
        skill_text = skill.strip()
        if skill_text:
            agent_settings["system_template"] = (
                f"{agent_settings.get('system_template', '')}\n\n## Skill\n{skill_text}"
            )
        agent_settings.update(step_limit=self.step_limit, cost_limit=self.cost_limit)
        agent_settings.pop("output_path", None)
        environment = DockerEnvironment(**{"cwd": DOCKER_WORKDIR, **(settings.get("environment") or {}),
                                           "image": docker_image(instance)})
        model = RoleModel(
            ctx,
            deadline=min(ctx.deadline, time.monotonic() + timeout_s),
            model_name=self.model_name,
            max_tokens=getattr(ctx.cfg, "max_tokens", None),
            limits_exceeded=LimitsExceeded,
        )
        agent = DefaultAgent(model, environment, **agent_settings)
        try:
            exit_status, result = agent.run(task)
        finally:
            cleanup = getattr(environment, "cleanup", None)
            if cleanup is not None:
                cleanup()
        turn = 0
        for message in agent.messages:
            if message.get("role") == "system":
                continue
            turn += message.get("role") == "assistant"
            ctx.record({"type": "message", "role": message.get("role", "user"), "turn": turn,
                        "content": str(message.get("content", ""))})
        patch = str(result) if exit_status == "Submitted" else ""
        return AgentOutcome(patch=patch, exit_status=str(exit_status), n_calls=model.n_calls)
