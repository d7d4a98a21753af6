"""Results served from Prefect's cache, counted in the usage ledger as cache hits.

A task whose result comes from the cache never runs its body, so no model call is made and nothing
would be recorded: a cached re-run would report "model calls 0" and no cache hits. A completion
hook records one cache-hit line (cost 0, no tokens) per cached model-calling task, and one per item
for a cached whole-split evaluation, so the summary says how many calls the cache stood in for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skillopt.llm.chat import ROLE_OF_STAGE

#: The stage of each model-calling task (one model call each).
STAGE_OF_TASK = {
    "rollout_item": "rollout", "judge_item": "judge", "reflect_minibatch": "analyst",
    "merge_patches": "merge", "rank_edits": "ranking", "decide_budget": "lr", "rewrite_skill": "rewrite",
    "deep_probe": "deep_probe", "slow_update": "slow_update", "meta_skill": "meta_skill",
}
#: A cached evaluation stands for one rollout per item (its items' own tasks are not run at all).
EVALUATION_TASK = "evaluate_skill"


def cache_hit_hook(ctx: Any) -> Callable[[Any, Any, Any], None]:
    """A Prefect ``on_completion`` hook that records the cache hits of one run's tasks in its ledger."""

    def record_cache_hits(task: Any, task_run: Any, state: Any) -> None:
        if state.name != "Cached":
            return
        if task.name == EVALUATION_TASK:
            record_hits(ctx, "rollout", len(state.result().rows))
        elif task.name in STAGE_OF_TASK:
            record_hits(ctx, STAGE_OF_TASK[task.name], 1)

    return record_cache_hits


def record_hits(ctx: Any, stage: str, count: int) -> None:
    """``count`` cache-hit lines of ``stage`` (cost 0, no tokens) in the run's ledger."""
    role = ctx.clients.roles.get(ROLE_OF_STAGE[stage])
    if role is None:
        return
    for _ in range(count):
        ctx.clients.ledger.record(role=role.role, backend=role.backend, model_requested=role.model,
                                  model_served=None, stage=stage, usage=None, latency_s=0.0, attempts=0,
                                  status="ok", price_model=role.price_model, cache_hit=True)
