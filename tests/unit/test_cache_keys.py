"""One key function: a task's cache key is the request it sends, and a training rollout's key names its
draw (epoch and sample index)."""

from __future__ import annotations

from pathlib import Path

import pytest

import skillopt.benchmarks.demo as demo
from skillopt.core.config import load_config
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.llm.reply_store import ReplyStore
from skillopt.optimizer.slow_update import Pairs
from skillopt.run.assembly import Run
from skillopt.run.cache_keys import call_key
from skillopt.run.rollouts import Draws, DrawTarget, rollout_key
from skillopt.tasks.epoch import slow_update
from skillopt.tasks.optimize import reflect_minibatch


@pytest.fixture
def run(tmp_path: Path, editable_prompts: Path) -> Run:
    overrides = [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}"]
    return Run.from_config(load_config("demo", overrides=overrides, env={}), env={}, run_name="keys")


def _analyst_key(run: Run, rows: list[ItemResult]) -> str:
    parameters = {"run": run, "kind": "failure", "skill": run.initial_skill, "rows": rows, "budget": 3,
                  "step_buffer": "", "meta_skill": ""}
    return reflect_minibatch.cache_key_fn(None, parameters)


def test_the_reply_store_and_the_task_keys_share_one_key_function():
    request = ChatRequest(messages=[system("Be brief."), user("2+2?")], stage="analyst",
                          tags={"kind": "failure"})
    assert ReplyStore.key("role-fp", request) == request.cache_key("role-fp")
    keyed = call_key("role-fp", request, Pairs)
    with_schema = request.model_copy(update={"response_schema": Pairs})
    assert keyed == "skillopt-analyst-" + with_schema.cache_key("role-fp")
    assert call_key("other-model", request, Pairs) != keyed  # the model identity is part of it


def test_editing_an_optimizer_template_changes_only_the_calls_that_send_it(run, editable_prompts):
    item = run.items[run.split_ids["train"][0]]
    rows = [ItemResult(id=item.id, task_type=item.task_type, hard=0.0, soft=0.0)]
    pairs = Pairs()
    slow_parameters = {"run": run, "start_skill": run.initial_skill, "current_skill": run.initial_skill,
                       "previous_guidance": "", "pairs": pairs}
    before = (_analyst_key(run, rows), slow_update.cache_key_fn(None, slow_parameters),
              rollout_key(run, item, run.initial_skill, training=True))

    template = editable_prompts / "optimizer" / "analyst_failure.md"
    template.write_text(template.read_text() + "\nName the unit of every number.\n")
    after = (_analyst_key(run, rows), slow_update.cache_key_fn(None, slow_parameters),
             rollout_key(run, item, run.initial_skill, training=True))
    assert after[0] != before[0]  # the failure analysts send the template
    assert after[1:] == before[1:]  # the slow update and the target's rollout do not


def test_editing_the_benchmark_prompt_changes_the_rollouts_that_send_it(run, monkeypatch):
    item = run.items[run.split_ids["val"][0]]
    before = rollout_key(run, item, run.initial_skill, training=False)
    assert rollout_key(run, item, run.initial_skill, training=False) == before  # deterministic
    monkeypatch.setattr(demo, "_SYSTEM_INTRO", demo._SYSTEM_INTRO + " Units matter.")
    assert rollout_key(run, item, run.initial_skill, training=False) != before
    assert rollout_key(run, item, run.initial_skill + "\n- a new rule", training=False) != before


def test_a_training_rollout_key_names_its_epoch_and_sample_and_an_evaluation_names_neither(run):
    item = run.items[run.split_ids["train"][0]]
    keys = {(epoch, sample): rollout_key(run, item, run.initial_skill, training=True, epoch=epoch,
                                         sample=sample)
            for epoch in (None, 1, 2) for sample in (0, 1)}
    assert len(set(keys.values())) == len(keys)


def test_draws_count_samples_within_an_epoch_and_replay_has_none():
    draws = Draws(3, resample=True)
    assert draws.epoch == 3
    assert draws.take(["a", "b"]) == [0, 0]
    # A peek (the next step's prefetched rollouts) says what the take will, and counts nothing.
    assert draws.peek(["b", "c", "b"]) == [1, 0, 2]
    assert draws.take(["b", "c", "b"]) == [1, 0, 2]
    assert draws.peek(["b"]) == [3] and draws.take(["b"]) == [3]
    replay = Draws(3, resample=False)
    assert replay.epoch is None and replay.take(["a", "a"]) == [0, 0]


class _Recorder:
    info = "the wrapped client's attributes stay visible"

    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    def chat(self, request: ChatRequest) -> None:
        self.seeds.append(request.seed)


def test_a_draw_sends_its_own_seed_unless_the_request_has_one():
    client = _Recorder()
    target = DrawTarget(client, 2042)
    target.chat(ChatRequest(messages=[user("q")], stage="rollout"))
    target.chat(ChatRequest(messages=[user("q")], stage="rollout", seed=7))
    assert client.seeds == [2042, 7] and target.info == _Recorder.info
