"""Constrained structured output over a real HTTP peer: a training run asks the OpenAI-compatible server for
schema-constrained replies, so a server that answers JSON only under a schema (as llama.cpp or vLLM with a
small model do) parses on the first attempt; a server that refuses the field gets the schema in the prompt
once it has said so, and the run still trains."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from skillopt.llm.clients import CORRECTION_LEAD
from tests.fakes.demo_world_http import TWO_STEPS, DemoWorldServer, constraining_schema, role_overrides

pytestmark = pytest.mark.slow


class Kept(logging.Handler):
    """Keeps the records of the logger it is added to (the flow's log setup may not reach pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def train(world: DemoWorldServer, run_name: str) -> dict:
    from skillopt.flows.train import skill_train

    with world.server:
        overrides = [*role_overrides(world.server.openai_base_url), *TWO_STEPS, "model.retry.base=0.01",
                     "model.retry.cap=0.02"]
        return skill_train(benchmark="demo", overrides=overrides, run_name=run_name)


def chat_bodies(world: DemoWorldServer) -> list[dict]:
    return [r.body for r in world.server.requests_for("/v1/chat/completions") if isinstance(r.body, dict)]


def optimizer_bodies(world: DemoWorldServer) -> list[dict]:
    return [b for b in chat_bodies(world) if b["model"] == "demo-optimizer"]


def optimizer_replies(summary: dict) -> dict:
    return json.loads((Path(summary["run_dir"]) / "summary.json").read_text())["counts"]["optimizer_replies"]


def usage_lines(summary: dict) -> list[dict]:
    path = Path(summary["run_dir"]) / "usage.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_structured_call_parses_first_time_against_a_server_that_answers_json_only_under_a_schema(
        prefect_settings, in_tmp):
    world = DemoWorldServer(schema_only=True)
    summary = train(world, "schema-only")

    bodies = optimizer_bodies(world)
    stages = {world.as_chat_request(b).stage for b in bodies}
    assert "analyst" in stages
    assert bodies and all(constraining_schema(b) is not None for b in bodies)
    assert all(b["response_format"]["json_schema"]["strict"] for b in bodies)
    # not one re-ask: every structured reply parsed on its first attempt
    assert not [b for b in chat_bodies(world) if CORRECTION_LEAD in json.dumps(b)]
    optimizer_calls = [u for u in usage_lines(summary) if u["role"] == "optimizer"]
    assert optimizer_calls and all(u["status"] == "ok" for u in optimizer_calls)
    replies = optimizer_replies(summary)
    assert replies["fallback"] == 0 and replies["parsed"] > 0
    # and the run learned: the demo's optimizer edits reached the skill
    best = Path(summary["run_dir"]) / "best_skill.md"
    assert best.read_text(encoding="utf-8").strip()


def test_a_server_that_refuses_response_format_gets_the_schema_in_the_prompt_after_one_note(
        prefect_settings, in_tmp):
    world = DemoWorldServer(refuse_schema=True)
    records = Kept()
    logging.getLogger("skillopt.llm").addHandler(records)
    try:
        summary = train(world, "refused")
    finally:
        logging.getLogger("skillopt.llm").removeHandler(records)

    bodies = optimizer_bodies(world)
    refused = [b["response_format"]["type"] for b in bodies if "response_format" in b]
    prompted = [b for b in bodies if "response_format" not in b]
    assert refused == ["json_schema", "json_object"]  # the endpoint's first structured call probed; no more
    assert prompted and all("must match this JSON schema" in b["messages"][0]["content"] for b in prompted)
    notes = [r.getMessage() for r in records.records if "the server refused" in r.getMessage()]
    assert len(notes) == 2 and "structured_output" in notes[0]
    assert not [b for b in chat_bodies(world) if CORRECTION_LEAD in json.dumps(b)]
    replies = optimizer_replies(summary)
    assert replies["fallback"] == 0 and replies["parsed"] > 0


#: Step 1's edit budget as the default schedule gives it (3 of 2 steps), then 3 again instead of 2.
SAME_FIRST_BUDGET = ["optimizer.lr_scheduler=constant", "optimizer.learning_rate=3"]


def test_calls_refused_together_move_the_endpoint_one_step_not_two(prefect_settings, in_tmp):
    """A run whose first structured calls come from the reply store sends its first new ones side by side
    (the probe never reached the server): each is refused for json_schema, and the endpoint goes to
    json_object once, never on to the prompt (it went there when two refusals each took a step)."""
    from skillopt.flows.train import skill_train

    world = DemoWorldServer(refuse_json_schema_s=0.5)
    with world.server:
        overrides = [*role_overrides(world.server.openai_base_url), *TWO_STEPS, "model.retry.base=0.01",
                     "model.retry.cap=0.02"]
        skill_train(benchmark="demo", overrides=overrides, run_name="first")
        sent_before = len(optimizer_bodies(world))
        records = Kept()
        logging.getLogger("skillopt.llm").addHandler(records)
        try:  # step 1 comes from the reply store; step 2's budget differs, so its analysts (failure and
            # success, side by side) are the run's first calls sent
            summary = skill_train(benchmark="demo", overrides=[*overrides, *SAME_FIRST_BUDGET],
                                  run_name="second")
        finally:
            logging.getLogger("skillopt.llm").removeHandler(records)
    bodies = optimizer_bodies(world)[sent_before:]
    kinds = [(b.get("response_format") or {}).get("type") for b in bodies]
    assert kinds.count("json_schema") >= 2, kinds  # sent side by side, each refused
    assert None not in kinds, kinds  # never fell back to the schema in the prompt
    notes = [r.getMessage() for r in records.records if "the server refused" in r.getMessage()]
    assert len(notes) == 1 and "now use json_object" in notes[0], notes
    assert optimizer_replies(summary)["parsed"] > 0


def test_a_server_with_an_unreported_4096_token_window_is_learned_and_every_later_request_fits(
        prefect_settings, in_tmp):
    world = DemoWorldServer(window_tokens=4096, evidence_in_reply=True, reply_padding=5000)
    records = Kept()
    logging.getLogger("skillopt.llm").addHandler(records)
    with world.server:
        from skillopt.flows.train import skill_train

        overrides = [*role_overrides(world.server.openai_base_url), *TWO_STEPS, "model.retry.base=0.01",
                     "model.retry.cap=0.02", "model.target.model=small-model",
                     "model.optimizer.model=small-model"]
        try:
            summary = skill_train(benchmark="demo", overrides=overrides, run_name="window")
        finally:
            logging.getLogger("skillopt.llm").removeHandler(records)

    assert any(what != "ok" for *_, what in world.window_log), "the window never showed"
    learned = [r.created for r in records.records if "the context window is 4096 tokens" in r.getMessage()]
    assert len(learned) == 1
    # requests already on the wire when the window showed could not know it; every one sent after did
    later = [(prompt, cap, what) for received, prompt, cap, what in world.window_log if received > learned[0]]
    assert later, "nothing was sent after the window was learned"
    assert not [(prompt, cap) for prompt, cap, _ in later if prompt + (cap or 0) > 4096]
    assert all(what == "ok" for *_, what in later)
    written = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    windows = written["context_windows"]
    assert [entry["tokens"] for entry in windows.values()] == [4096]
    assert next(iter(windows)).endswith("|small-model")
    # a resumed run starts with it
    kept = json.loads((Path(summary["run_dir"]) / "context_windows.json").read_text())
    assert kept == windows


def test_a_run_whose_optimizer_is_never_usable_stops_naming_the_model_and_the_fix(prefect_settings, in_tmp):
    from skillopt.flows.train import UnusableOptimizer, skill_train

    world = DemoWorldServer(schema_only=True)  # prose unless the schema constrains the reply
    with world.server, pytest.raises(UnusableOptimizer) as stopped:
        overrides = [*role_overrides(world.server.openai_base_url), *TWO_STEPS, "model.retry.base=0.01",
                     "model.optimizer.structured_output=prompt", "optimizer.max_unusable_steps=2"]
        skill_train(benchmark="demo", overrides=overrides, run_name="unusable")
    message = str(stopped.value)
    assert "[optimizer] openai_compatible/demo-optimizer" in message
    assert "optimizer.max_unusable_steps" in message and "structured_output: json_schema" in message
    assert "; the last: analyst reply unusable" in message, message  # what went wrong, from the step
    history = [json.loads(line) for line in (in_tmp / "runs" / "unusable" / "history.jsonl").read_text()
               .splitlines()]
    steps = [r for r in history if r["kind"] == "step"]
    assert len(steps) == 2 and all(r["replies_parsed"] == 0 and r["replies_fallback"] for r in steps)


def test_a_structured_mode_set_by_hand_is_kept_and_its_refusal_names_the_setting(prefect_settings, in_tmp):
    """Only auto steps down: a server refusing json_schema that the user chose fails those calls, and the
    error says which setting chose it; no json_object request is ever sent."""
    from skillopt.flows.train import UnusableOptimizer, skill_train

    world = DemoWorldServer(refuse_json_schema_s=0.0)
    with world.server, pytest.raises(UnusableOptimizer) as stopped:
        overrides = [*role_overrides(world.server.openai_base_url), *TWO_STEPS, "model.retry.base=0.01",
                     "model.optimizer.structured_output=json_schema", "optimizer.max_unusable_steps=2"]
        skill_train(benchmark="demo", overrides=overrides, run_name="pinned")
    kinds = [b["response_format"]["type"] for b in optimizer_bodies(world) if "response_format" in b]
    assert kinds and set(kinds) == {"json_schema"}, kinds
    message = str(stopped.value)
    assert "model.optimizer.structured_output is json_schema, which this server refuses" in message
    assert message.endswith("; set model.optimizer.structured_output: auto, or use a model on a server that "
                            "takes the mode"), message
