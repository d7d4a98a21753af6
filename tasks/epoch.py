"""Epoch-level tasks: the batch plan, the slow update and the optimizer's meta-skill memory."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from prefect import task
from pydantic import BaseModel

from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.meta_skill import MetaSkillReply, meta_skill_request
from skillopt.optimizer.slow_update import Pairs, SlowUpdateReply, slow_update_request
from skillopt.optimizer.stage_call import structured_or_fallback
from skillopt.optimizer.trajectory import trajectory_chars
from skillopt.run.assembly import Run
from skillopt.tasks.cache import OPTIMIZER_TASK_OPTIONS as _OPTIONS
from skillopt.tasks.cache import keyed_by_request


def _epoch_request(build: Callable[..., ChatRequest], schema: type[BaseModel]) -> Callable[..., ChatRequest]:
    """The request builder of an epoch-level optimizer task: the library's ``build`` on the task's texts
    and pairs, sized to ``prompt_chars`` (default: the room the optimizer's context window leaves for a
    ``schema`` reply)."""

    def request(run: Run, prompt_chars: int | None = None, **texts: Any) -> ChatRequest:
        if prompt_chars is None:
            prompt_chars = run.clients.optimizer.prompt_chars(schema)
        return build(**texts, prompt_chars=prompt_chars,
                     trajectory_chars=trajectory_chars(run.config.gradient.trajectory_tokens))

    return request


_slow_update_request = _epoch_request(slow_update_request, SlowUpdateReply)
_meta_skill_request = _epoch_request(meta_skill_request, MetaSkillReply)


@task(name="slow_update", cache_key_fn=keyed_by_request(_slow_update_request, SlowUpdateReply), **_OPTIONS)
def slow_update(run: Run, start_skill: str, current_skill: str, previous_guidance: str,
                pairs: Pairs) -> SlowUpdateReply | None:
    """New epoch guidance for the target; None when the reply cannot be used (the old guidance stays)."""
    request = partial(_slow_update_request, run, start_skill=start_skill, current_skill=current_skill,
                      previous_guidance=previous_guidance, pairs=pairs)
    return structured_or_fallback(run.clients.optimizer, request, SlowUpdateReply, fallback=lambda _: None)


@task(name="meta_skill", cache_key_fn=keyed_by_request(_meta_skill_request, MetaSkillReply), **_OPTIONS)
def meta_skill(run: Run, previous_skill: str, current_skill: str, previous_memory: str,
               pairs: Pairs) -> MetaSkillReply | None:
    """The optimizer's memory for the next epoch; None when the reply cannot be used (the old memory
    stays)."""
    request = partial(_meta_skill_request, run, previous_skill=previous_skill, current_skill=current_skill,
                      previous_memory=previous_memory, pairs=pairs)
    return structured_or_fallback(run.clients.optimizer, request, MetaSkillReply, fallback=lambda _: None)
