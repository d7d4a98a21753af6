"""How long one benchmark item may take: ``benchmark.item_timeout_s``, stated or derived.

Unset, the limit is what the item's model calls may take at worst: each of ``benchmark.max_turns`` target
calls and one judge call (when there is a judge) may run ``model.<role>.timeout_s`` per attempt for up to
``model.retry.max_attempts`` attempts with backoff (at most ``model.retry.cap`` between them), and no call
retries past ``model.retry.deadline_s`` (its last attempt still gets its full timeout). An agentic CLI target
gets at least ``benchmark.exec_timeout`` plus a minute; a plug-in whose items are whole episodes
(``benchmark.task_timeout``) gets at least that. ``skillopt config show`` prints the figure.

An item that runs out of time is an error row (``skillopt.core.error_rows``): it says nothing about the skill.
"""

from __future__ import annotations

from typing import Any

from skillopt.core.config import RetryPolicy
from skillopt.llm.roles import ResolvedRole

#: What an agentic CLI target gets beyond ``benchmark.exec_timeout`` (workspace set-up, grading).
EXEC_MARGIN_S = 60.0


def call_limit_s(timeout_s: float, retry: RetryPolicy) -> float:
    """The longest one model call can take with its retries."""
    attempts = retry.max_attempts
    with_backoff = timeout_s * attempts + retry.cap * (attempts - 1)
    return min(with_backoff, retry.deadline_s + timeout_s)


def item_limit_s(bench_cfg: Any, target: ResolvedRole, judge: ResolvedRole | None, retry: RetryPolicy, *,
                 exec_target: bool = False) -> float:
    """``benchmark.item_timeout_s`` when set, else the derived limit (see the module docstring)."""
    stated = getattr(bench_cfg, "item_timeout_s", None)
    if stated:
        return float(stated)
    turns = int(getattr(bench_cfg, "max_turns", 1) or 1)
    limit = turns * call_limit_s(target.timeout_s, retry)
    if judge is not None:
        limit += call_limit_s(judge.timeout_s, retry)
    if exec_target:
        limit = max(limit, float(getattr(bench_cfg, "exec_timeout", 120)) + EXEC_MARGIN_S)
    return max(limit, float(getattr(bench_cfg, "task_timeout", 0) or 0))


def describe_limit(bench_cfg: Any, target: ResolvedRole, judge: ResolvedRole | None, retry: RetryPolicy, *,
                   exec_target: bool = False) -> str:
    """One line for ``config show``: the limit and where it comes from."""
    limit = item_limit_s(bench_cfg, target, judge, retry, exec_target=exec_target)
    if getattr(bench_cfg, "item_timeout_s", None):
        return f"benchmark.item_timeout_s: {limit:g} s (set)"
    turns = int(getattr(bench_cfg, "max_turns", 1) or 1)
    parts = [f"{turns} target call(s) of up to {call_limit_s(target.timeout_s, retry):g} s "
             f"(model.target.timeout_s {target.timeout_s:g} x {retry.max_attempts} attempts, "
             f"model.retry.deadline_s {retry.deadline_s:g})"]
    if judge is not None:
        parts.append(f"1 judge call of up to {call_limit_s(judge.timeout_s, retry):g} s")
    return f"benchmark.item_timeout_s: {limit:g} s (derived: {' + '.join(parts)})"
