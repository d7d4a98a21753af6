"""The shared rollout runner: what every benchmark's rollouts have in common.

``run_item`` builds the target's prompt from the benchmark (the skill as the target sees it,
``skill_render.render_inline``: empty protected blocks left out), calls the ``target`` role, runs
self-check turns, records the trajectory, scores the reply, appends the evaluation event (the only
way gold reaches the optimizer) and returns the ``ItemResult``. A model-call error propagates (the
Prefect task then fails and nothing is cached); a bad answer is a scored row. Anything else the plug-in's
own code raises, and a result the runner cannot use (``score`` returning no ``Score``, or a score outside
[0, 1]), is a ``BenchmarkPluginError`` that stops the run (``plugin_call``). ``check_infrastructure`` turns a
rollout in which no item got any answer into ``RolloutInfrastructureError`` instead of a zero score.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from skillopt.benchmarks.base import Benchmark, Judge, RolloutInfrastructureError, Score
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.item_limit import item_limit_s
from skillopt.core.config import RetryPolicy
from skillopt.core.data import Item
from skillopt.core.errors import BenchmarkPluginError, SkillOptError, StorageError
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest, Message, TextPart, assistant, user
from skillopt.llm.clients import RoleClient
from skillopt.llm.errors import BackendError
from skillopt.llm.roles import ResolvedRole
from skillopt.skill.document import target_text
from skillopt.skill.render import render_inline

TASK_DESCRIPTION_CHARS = 2000
SELF_CHECK = (
    "Re-check your answer against the question. Then restate your final answer in the required format."
)
FORMAT_ONLY = "Your reply has no answer in the required format. Give only your final answer in that format."
READOUT_HEADING = "## Training readout"
#: The role a stand-in target (no ``RoleClient``) is timed as: a chat role with the default timeout.
_STAND_IN_ROLE = ResolvedRole(
    role="target", backend="scripted", model=None, price_model=None, reasoning_effort=None, max_tokens=None,
    temperature=None, seed=None, timeout_s=120.0, base_url=None, api_key_env=None, api_key_secret=None,
    key_required=False, rate_limit_key="scripted", extra_body={}, options={}, capabilities={},
    strict_params=False, provenance={})


def run_item(
    benchmark: Benchmark[Any],
    item: Item,
    skill: str,
    cfg: BaseModel,
    *,
    target: RoleClient,
    judge: Judge | None,
    probe_instruction: str | None = None,
    sample: int = 0,
    tags: dict[str, Any] | None = None,
) -> ItemResult:
    """Roll out one item with ``skill`` and score it."""
    started = time.monotonic()
    deadline = _item_deadline(cfg, target)
    messages = first_messages(benchmark, item, skill, cfg, probe_instruction=probe_instruction)
    system_text = "\n\n".join(m.text() for m in messages if m.role == "system")
    user_text = "\n\n".join(m.text() for m in messages if m.role == "user")
    trajectory: list[dict[str, Any]] = [
        {"type": "message", "role": m.role, "turn": 0, "content": m.text()} for m in messages
    ]
    call_tags = {"item_id": item.id, "sample": sample, **(tags or {})}

    context = EpisodeContext(target=target, messages=messages, cfg=cfg, record=trajectory.append,
                             deadline=started + deadline, tags=call_tags)
    with plugin_call(benchmark, "run_episode", item.id):
        episode = benchmark.run_episode(item, render_inline(skill), context)
    if episode is not None and not isinstance(episode, EpisodeResult):
        what = f"returned {type(episode).__name__}, not EpisodeResult or None, on item {item.id}"
        raise plugin_bug(benchmark, "run_episode", what)
    if episode is not None:  # multi-step items drive the target themselves
        text, turn, answered = episode.response_text, episode.n_turns, episode.answered
    elif _is_exec(target):  # an agentic CLI: one run in a per-item workspace
        # The skill goes in as SKILL.md, so the task messages are the prompt without it.
        task_messages = first_messages(benchmark, item, "", cfg, probe_instruction=probe_instruction)
        text = _exec_turn(target, item, target_text(skill), task_messages, trajectory, call_tags)
        turn, answered = 1, True
    else:
        text, turn, answered = _turns(benchmark, target, messages, trajectory, cfg, call_tags,
                                      deadline_at=started + deadline)
    if time.monotonic() - started > deadline:
        return _timeout_row(item, deadline, trajectory, turn, answered, text)

    score = scored(benchmark, item, text, judge)
    trajectory.append({"type": "evaluation", "content": evaluation_event(item, score)})
    return ItemResult(
        id=item.id,
        task_type=str(item.get("task_type") or "default"),
        hard=score.hard,
        soft=score.soft,
        fail_reason=score.fail_reason,
        task_description=_task_description(item, messages),
        predicted_answer=score.predicted_answer,
        trajectory=trajectory,
        n_turns=turn,
        answered=answered,
        phase="done",
        extras=score.extras,
        target_system_prompt=system_text,
        target_user_prompt=user_text,
    )


def _item_deadline(cfg: BaseModel, target: Any) -> float:
    """``benchmark.item_timeout_s``: bound by run assembly (``benchmarks.resolve``); an item run on its own
    derives it from its target client's role and retry policy."""
    bound = getattr(cfg, "item_timeout_s", None)
    if bound:
        return float(bound)
    role, retrier = getattr(target, "role", None), getattr(target, "retrier", None)
    if role is None or retrier is None:  # a stand-in target without a role: the limit's plain default
        return item_limit_s(cfg, _STAND_IN_ROLE, None, RetryPolicy(), exec_target=False)
    return item_limit_s(cfg, role, None, retrier.policy, exec_target=_is_exec(target))


def first_messages(benchmark: Benchmark[Any], item: Item, skill: str, cfg: BaseModel, *,
                   probe_instruction: str | None = None) -> list[Message]:
    """The messages of a rollout's first request: the benchmark's prompt with ``skill`` as the target sees
    it (empty protected blocks left out) and the probe's training readout, if any. Rollout cache keys hash
    them."""
    with plugin_call(benchmark, "build_messages", item.id):
        built = benchmark.build_messages(item, render_inline(skill), cfg)
    if not isinstance(built, list | tuple) or not built:
        shown = "an empty list" if isinstance(built, list | tuple) else type(built).__name__
        what = f"returned {shown}, not a list of Message, on item {item.id}"
        raise plugin_bug(benchmark, "build_messages", what)
    if stray := next((m for m in built if not isinstance(m, Message)), None):
        what = f"returned a list holding {type(stray).__name__}, not only Message, on item {item.id}"
        raise plugin_bug(benchmark, "build_messages", what)
    messages = list(built)
    return _with_readout(messages, probe_instruction) if probe_instruction else messages


def scored(benchmark: Benchmark[Any], item: Item, text: str, judge: Judge | None) -> Score:
    """``benchmark.score`` of ``text`` for ``item``, checked: a ``Score`` whose ``hard`` and ``soft`` lie in
    [0, 1] (the gate averages them; a larger value would outweigh every other item)."""
    with plugin_call(benchmark, "score", item.id):
        score = benchmark.score(item, text, judge)
    if not isinstance(score, Score):
        raise plugin_bug(benchmark, "score", f"returned {type(score).__name__}, not Score, on item {item.id}")
    for field in ("hard", "soft"):
        value = getattr(score, field)
        if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):  # NaN fails the comparison too
            what = f"returned {field} {value!r} on item {item.id}, outside [0, 1]"
            raise plugin_bug(benchmark, "score", what)
    return score


#: How every stop for a plug-in's own code ends: after the fix, the run's finished calls are reused.
PLUGIN_FIX = "fix it and re-run the same command (finished calls are reused)"


@contextmanager
def plugin_call(benchmark: Benchmark[Any], method: str, item_id: str) -> Iterator[None]:
    """Around a call of the plug-in's own code for one item. A model-call error (``BackendError``: an error
    row once its retries are spent) and skillopt's own stops pass unchanged; anything else the plug-in
    raises stops the run as a ``BenchmarkPluginError`` naming the benchmark, the method and the item (an
    error row would leave the item out of the scores and blame the model)."""
    try:
        yield
    except (BackendError, StorageError, BenchmarkPluginError):
        raise
    except SkillOptError as error:  # raised on purpose (a missing requirement): its message says what's wrong
        raise BenchmarkPluginError(f"benchmark {benchmark.id}: {method}() stopped on item {item_id}: "
                                   f"{error}; {PLUGIN_FIX}") from error
    except Exception as error:
        raise plugin_bug(benchmark, method, f"raised {type(error).__name__} on item {item_id}: "
                                            f"{_one_line(error)}") from error


def plugin_bug(benchmark: Benchmark[Any], method: str, what: str) -> BenchmarkPluginError:
    """The stop for a bug in ``benchmark``'s ``method``: ``what`` says what it did and on which item."""
    return BenchmarkPluginError(f"benchmark {benchmark.id}: {method}() {what} — a bug in the plug-in, not a "
                                f"model failure; {PLUGIN_FIX}")


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line (a pydantic error spans several), at most 300 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:299] + "…"


def _turns(benchmark: Benchmark[Any], target: RoleClient, messages: list[Message],
           trajectory: list[dict[str, Any]], cfg: BaseModel, tags: dict[str, Any], *,
           deadline_at: float) -> tuple[str, int, bool]:
    """Up to ``max_turns`` target calls: each later turn asks the target to re-check and restate its
    answer, stopping early once the parsed answer repeats."""
    max_turns = int(getattr(cfg, "max_turns", 1) or 1)
    # A benchmark's ``max_tokens`` is a per-call override of the target role's cap.
    max_tokens = getattr(cfg, "max_tokens", None)
    # Some benchmarks give self-check turns (2 and later) a smaller cap.
    check_tokens = getattr(cfg, "self_check_max_tokens", None) or max_tokens
    text, answered, previous, turn = "", False, None, 0
    for turn in range(1, max_turns + 1):
        if time.monotonic() > deadline_at:
            return text, turn - 1, answered
        response = target.chat(ChatRequest(messages=messages, stage="rollout",
                                           max_tokens=max_tokens if turn == 1 else check_tokens,
                                           tags={**tags, "turn": turn}))
        text, answered = response.text, True
        trajectory.append({"type": "message", "role": "assistant", "turn": turn, "content": text})
        if turn == max_turns:
            break
        with plugin_call(benchmark, "extract_answer", tags["item_id"]):
            answer = benchmark.extract_answer(text)
        if answer is not None and answer == previous:
            break
        previous = answer
        feedback = SELF_CHECK if answer is not None else FORMAT_ONLY
        trajectory.append({"type": "feedback", "role": "user", "turn": turn, "content": feedback})
        messages = [*messages, assistant(text), user(feedback)]
    return text, turn, answered


def _is_exec(target: Any) -> bool:
    return getattr(getattr(target, "info", None), "kind", "chat") == "exec"


def _exec_turn(target: Any, item: Item, skill: str, messages: list[Message], trajectory: list[dict[str, Any]],
               tags: dict[str, Any]) -> str:
    """One run of an exec target (``codex_exec``, ``claude_code_exec``): the prompt's text as ``task.md``,
    its images as attachments the prompt names, the skill as ``SKILL.md``; the answer is the CLI's
    final message (self-check turns do not apply)."""
    from skillopt.llm.exec_harness import exec_task_from_messages

    result = target.run_exec(exec_task_from_messages(item.id, skill, messages, tags={**tags, "turn": 1}))
    trajectory.append({"type": "message", "role": "assistant", "turn": 1, "content": result.answer})
    return result.answer


def evaluation_event(item: Item, score: Score) -> str:
    """The text of the evaluation event: task, predicted vs expected, metrics, verdict, detail."""
    verdict = "correct" if score.hard >= 1.0 else "incorrect"
    lines = [
        "[EVALUATION RESULT]",
        f"Predicted: {score.predicted_answer or '(none)'}",
        f"Expected: {score.expected or '(not shown)'}",
        f"Metrics: hard={score.hard:.3f} soft={score.soft:.3f}",
        f"Verdict: {verdict}" + (f" ({score.fail_reason})" if score.fail_reason else ""),
    ]
    if score.detail:
        lines.append(score.detail)
    return "\n".join(lines)


def error_row(item: Item, error: BaseException) -> ItemResult:
    """The row recorded for an item whose model call failed after its retries (its task ended Failed)."""
    message = str(error).splitlines()[0] if str(error) else ""
    return ItemResult(
        id=item.id, task_type=str(item.get("task_type") or "default"), hard=0.0, soft=0.0,
        fail_reason=f"error: {type(error).__name__}: {message}"[:500], phase="error", answered=False,
    )


def check_infrastructure(rows: Sequence[ItemResult], *, role_label: str) -> None:
    """Raise when a rollout had items but none of them got a model answer (an outage, not a zero)."""
    if not rows or any(row.answered for row in rows):
        return
    reasons = [row.fail_reason for row in rows[:3]]
    raise RolloutInfrastructureError(
        f"[target] {role_label}: none of {len(rows)} items got a model answer; stopping instead of "
        f"recording a score of 0. First errors: {reasons}"
    )


def _with_readout(messages: list[Message], instruction: str) -> list[Message]:
    """Append the deep-probe instruction to the last user message as a training readout section."""
    *head, last = messages
    readout = f"\n\n{READOUT_HEADING}\n{instruction.strip()}"
    if isinstance(last.content, str):
        return [*head, Message(role=last.role, content=last.content + readout)]
    return [*head, Message(role=last.role, content=[*last.content, TextPart(text=readout)])]


def _task_description(item: Item, messages: Sequence[Message]) -> str:
    for key in ("question", "task", "instruction", "prompt"):
        value = item.get(key)
        if isinstance(value, str) and value.strip():
            return value[:TASK_DESCRIPTION_CHARS]
    users = [m.text() for m in messages if m.role == "user"]
    return (users[0] if users else "")[:TASK_DESCRIPTION_CHARS]


def _timeout_row(item: Item, deadline: float, trajectory: list[dict[str, Any]], turns: int, answered: bool,
                 text: str) -> ItemResult:
    """An item past ``benchmark.item_timeout_s``: an error row (it says nothing about the skill), not a 0."""
    return ItemResult(
        id=item.id, task_type=str(item.get("task_type") or "default"), hard=0.0, soft=0.0,
        fail_reason=f"error: timeout: the item took longer than benchmark.item_timeout_s ({deadline:g} s)",
        phase="error", trajectory=trajectory, n_turns=turns, answered=False, predicted_answer="",
    )
