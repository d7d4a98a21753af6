"""The scripted backend: rules, built-in sets, usage, and no network."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError
from skillopt.llm import scripted
from skillopt.llm.base import BackendContext, BackendRegistry, EnvSecrets
from skillopt.llm.chat import ChatRequest, ImagePart, Message, TextPart, system, user
from skillopt.llm.errors import AuthError, CallTimeout, ParseError, RateLimited, ServerError
from skillopt.llm.roles import ResolvedRole, resolve_roles
from skillopt.llm.scripted import ScriptedBackend, ScriptedNoMatch, normalise_answer

# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here runs with outgoing connections refused, so any socket use fails loudly."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the scripted backend tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def make_role(role: str = "target", seed: int | None = None, **options: Any) -> ResolvedRole:
    return ResolvedRole(
        role=role, backend="scripted", model="scripted", price_model="scripted", reasoning_effort=None,
        max_tokens=None, temperature=None, seed=seed, timeout_s=120.0, base_url=None, api_key_env=None,
        api_key_secret=None, key_required=False, rate_limit_key="scripted:local", extra_body={},
        options=options, capabilities={}, strict_params=False, provenance={},
    )


def backend(role: str = "target", context: BackendContext | None = None, **options: Any) -> ScriptedBackend:
    info = scripted.INFO
    return info.factory(make_role(role, **options), EnvSecrets({}), context or BackendContext())


def ask(b: ScriptedBackend, text: str = "hello", stage: str = "rollout", sys: str | None = None,
        schema: type[BaseModel] | None = None, **tags: Any) -> Any:
    messages = ([system(sys)] if sys else []) + [user(text)]
    request = ChatRequest(messages=messages, stage=stage, response_schema=schema, tags=tags)  # type: ignore[arg-type]
    return b.attempt(request, timeout_s=30.0)


# Representative optimizer schemas in the shapes the optimizer prompts ask for.
class Edit(BaseModel):
    op: Literal["add", "replace", "delete"]
    target: str
    content: str


class Diagnosis(BaseModel):
    ids: list[str]
    kind: str
    description: str = Field(min_length=3)


class Patch(BaseModel):
    reasoning: str
    edits: list[Edit]


class AnalystReply(BaseModel):
    diagnosis: list[Diagnosis]
    patch: Patch
    execution_notes: list[str] = []


class RankingReply(BaseModel):
    reasoning: str
    selected_indices: list[int] = Field(min_length=1)


class BudgetReply(BaseModel):
    learning_rate: int = Field(ge=1, le=8)
    reasoning: str
    confidence: Literal["low", "medium", "high"]
    risk_notes: list[str]


class RewriteReply(BaseModel):
    reasoning: str
    change_summary: list[str]
    new_skill: str | None
    previous: Patch | None = None


class Verdict(BaseModel):
    verdict: Literal["correct", "incorrect"]
    reason: str


# Handlers for the handler tests (looked up as "<this module>:<name>").
def seeded_handler(request: ChatRequest, seed: int) -> str:
    digest = hashlib.sha256(f"{seed}:{request.last_user_text()}".encode()).hexdigest()
    return f"answer-{digest[:8]}"


def object_handler(request: ChatRequest, seed: int) -> dict[str, Any]:
    return {"verdict": "correct", "reason": f"seed {seed}"}


def declining_handler(request: ChatRequest, seed: int) -> None:
    return None


HERE = __name__
OPTIMIZER_STAGES = ("analyst", "merge", "ranking", "lr", "rewrite", "slow_update", "meta_skill", "deep_probe")


# --- matching ---------------------------------------------------------------------------------


def test_first_matching_rule_wins_over_later_ones() -> None:
    b = backend(rules=[{"user": "capital", "text": "first"}, {"user": "capital", "text": "second"}])
    assert ask(b, "What is the capital of France?").text == "first"


@pytest.mark.parametrize(
    ("rule", "hit", "miss"),
    [
        (
            {"role": "optimizer"},
            {"role": "optimizer", "stage": "analyst"},
            {"role": "target", "stage": "analyst"},
        ),
        ({"stage": "judge"}, {"stage": "judge"}, {"stage": "rollout"}),
        ({"item_id": 7}, {"tags": {"item_id": "7"}}, {"tags": {"item_id": "8"}}),
        ({"system": r"^You grade"}, {"sys": "You grade answers."}, {"sys": "You solve tasks."}),
        ({"user": r"\bParis\b"}, {"text": "Is it Paris?"}, {"text": "Is it Parisian?"}),
    ],
    ids=["role", "stage", "item_id", "system", "user"],
)
def test_each_match_key_selects_its_requests(
    rule: dict[str, Any], hit: dict[str, Any], miss: dict[str, Any]
) -> None:
    def call(spec: dict[str, Any]) -> str:
        b = backend(
            spec.get("role", "target"), rules=[{**rule, "text": "matched"}], default={"text": "fallback"}
        )
        return ask(b, spec.get("text", "hello"), spec.get("stage", "rollout"), spec.get("sys"),
                   **spec.get("tags", {})).text

    assert call(hit) == "matched"
    assert call(miss) == "fallback"


def test_a_rule_applies_only_when_all_its_keys_match() -> None:
    b = backend(
        rules=[{"stage": "rollout", "user": "France", "item_id": "a", "text": "yes"}], default={"text": "no"}
    )
    assert ask(b, "France", item_id="a").text == "yes"
    assert ask(b, "France", item_id="b").text == "no"
    assert ask(b, "Spain", item_id="a").text == "no"


def test_user_pattern_reads_only_the_last_user_message() -> None:
    b = backend(rules=[{"user": "first question", "text": "stale"}], default={"text": "current"})
    request = ChatRequest(
        messages=[user("first question"), Message(role="assistant", content="ok"), user("second question")],
        stage="rollout",
    )
    assert b.attempt(request, timeout_s=5).text == "current"


def test_question_pattern_reads_the_first_user_message_on_every_turn() -> None:
    b = backend(rules=[{"question": "first question", "text": "same"}], default={"text": "other"})
    later_turn = ChatRequest(
        messages=[user("first question"), Message(role="assistant", content="ok"), user("check your answer")],
        stage="rollout",
    )
    assert b.attempt(later_turn, timeout_s=5).text == "same"
    assert ask(b, "another question").text == "other"
    with pytest.raises(ConfigError, match="question"):
        backend(rules=[{"question": "(", "text": "x"}])


# --- replies ----------------------------------------------------------------------------------


def test_text_reply_is_returned_verbatim() -> None:
    response = ask(backend(rules=[{"text": "<answer>42</answer>"}]))
    assert (response.text, response.parsed, response.model, response.backend) == (
        "<answer>42</answer>", None, "scripted", "scripted")


def test_json_reply_is_sent_as_json_text() -> None:
    response = ask(backend(rules=[{"json": {"verdict": "correct", "reason": "same"}}]), stage="judge")
    assert json.loads(response.text) == {"verdict": "correct", "reason": "same"}


def test_json_reply_is_validated_against_the_response_schema() -> None:
    response = ask(backend(rules=[{"json": {"verdict": "correct", "reason": "same", "extra": 1}}]),
                   stage="judge", schema=Verdict)
    assert response.parsed == Verdict(verdict="correct", reason="same")


def test_json_reply_that_does_not_fit_the_schema_is_a_parse_error_naming_the_rule() -> None:
    b = backend(rules=[{"name": "bad verdict", "json": {"verdict": "maybe"}}])
    with pytest.raises(ParseError) as caught:
        ask(b, stage="judge", schema=Verdict)
    message = str(caught.value)
    assert "rules[0] ('bad verdict')" in message
    assert "Verdict" in message and "verdict" in message and "reason" in message


def test_template_substitutes_numbered_and_named_groups() -> None:
    b = backend(rules=[
        {"user": r"capital of (?P<country>\w+) in (\d+)", "template": "{country}/{2}/{0} {{braces}}"},
    ])
    assert (
        ask(b, "What was the capital of France in 1900?").text
        == "France/1900/capital of France in 1900 {braces}"
    )


def test_template_uses_the_system_match_when_the_rule_has_no_user_pattern() -> None:
    b = backend(rules=[{"system": r"Answer in (\w+)", "template": "Reply in {1}."}])
    assert ask(b, "hi", sys="Answer in French please").text == "Reply in French."


def test_template_naming_a_missing_group_is_rejected_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"rules\[1\]: template: \{2\}"):
        backend(rules=[{"text": "ok"}, {"user": "(a)", "template": "{2}"}])


@pytest.mark.parametrize(
    ("name", "expected"),
    [("RateLimitError", RateLimited), ("RateLimited", RateLimited), ("ServerError", ServerError),
     ("AuthError", AuthError), ("APITimeoutError", CallTimeout)],
)
def test_error_reply_raises_the_named_backend_error(name: str, expected: type[Exception]) -> None:
    b = backend(rules=[{"stage": "rollout", "error": name}])
    with pytest.raises(expected) as caught:
        ask(b)
    assert caught.value.stage == "rollout" and caught.value.backend == "scripted"  # type: ignore[attr-defined]


def test_rate_limit_error_carries_retry_after_and_is_retryable() -> None:
    b = backend(rules=[{"error": "RateLimitError", "retry_after": 2.5}])
    with pytest.raises(RateLimited) as caught:
        ask(b)
    assert caught.value.retry_after == 2.5
    assert caught.value.retryable


def test_handler_reply_is_deterministic_given_request_and_seed() -> None:
    rules = [{"handler": f"{HERE}:seeded_handler"}]
    first = ask(backend(rules=rules, seed=3), "item 1").text
    assert first == ask(backend(rules=rules, seed=3), "item 1").text
    assert first != ask(backend(rules=rules, seed=4), "item 1").text
    assert first.startswith("answer-")


def test_backend_seed_falls_back_to_the_role_seed_then_zero() -> None:
    rules = [{"handler": f"{HERE}:object_handler"}]
    role = make_role(seed=11, rules=rules)
    b = scripted.INFO.factory(role, EnvSecrets({}), BackendContext())
    assert ask(b, stage="judge", schema=Verdict).parsed.reason == "seed 11"
    assert ask(backend(rules=rules), stage="judge", schema=Verdict).parsed.reason == "seed 0"


def test_handler_object_is_validated_like_json() -> None:
    response = ask(
        backend(rules=[{"handler": f"{HERE}:object_handler"}], seed=5), stage="judge", schema=Verdict
    )
    assert response.parsed == Verdict(verdict="correct", reason="seed 5")


def test_handler_returning_none_passes_to_the_next_rule() -> None:
    b = backend(rules=[{"handler": f"{HERE}:declining_handler"}, {"text": "next"}])
    assert ask(b).text == "next"


def test_unknown_handler_is_rejected_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]: handler: .* no callable 'missing'"):
        backend(rules=[{"handler": f"{HERE}:missing"}])


# --- default and no match ---------------------------------------------------------------------


def test_default_answers_when_no_rule_matches() -> None:
    b = backend(rules=[{"stage": "judge", "text": "judged"}], default={"text": "fallback"})
    assert ask(b).text == "fallback"


def test_no_match_without_default_names_the_stage_and_the_prompt() -> None:
    b = backend(rules=[{"stage": "judge", "text": "judged"}])
    with pytest.raises(ScriptedNoMatch) as caught:
        ask(b, "Which river is longest?\nThink step by step.", stage="rollout")
    message = str(caught.value)
    assert "stage rollout" in message
    assert "Which river is longest? Think step by step." in message
    assert not caught.value.retryable


def test_unknown_rule_keys_are_config_errors_naming_the_rule_index() -> None:
    with pytest.raises(ConfigError, match=r"model\.target\.options\.rules\[1\]\.reply: unknown key"):
        backend(rules=[{"text": "ok"}, {"reply": "typo"}])


def test_a_rule_needs_exactly_one_reply() -> None:
    with pytest.raises(
        ConfigError, match=r"rules\[0\]: a rule needs exactly one of .* \(found: text, json\)"
    ):
        backend(rules=[{"text": "a", "json": {}}])


def test_invalid_regular_expression_is_rejected_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]: user: invalid regular expression"):
        backend(rules=[{"user": "(unclosed", "text": "x"}])


def test_default_with_match_keys_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"model\.target\.options\.default\.stage: unknown key"):
        backend(rules=[], default={"stage": "rollout", "text": "x"})


# --- usage, latency, images -------------------------------------------------------------------


def test_usage_is_characters_over_four_unless_the_rule_says_otherwise() -> None:
    response = ask(backend(rules=[{"text": "x" * 20}]), "y" * 40)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (10, 5)
    assert response.latency_s == 0.0

    given = ask(backend(rules=[{"text": "x" * 20, "usage": {"completion_tokens": 99, "reasoning_tokens": 7},
                                "latency_s": 1.5}]), "y" * 40)
    assert (given.usage.prompt_tokens, given.usage.completion_tokens, given.usage.reasoning_tokens) == (
        10,
        99,
        7,
    )
    assert given.latency_s == 1.5


def test_rule_slower_than_the_deadline_times_out() -> None:
    b = backend(rules=[{"text": "late", "latency_s": 10}])
    with pytest.raises(CallTimeout, match="over the 2 s deadline"):
        b.attempt(ChatRequest(messages=[user("q")], stage="rollout"), timeout_s=2)


def test_images_are_matched_and_counted_as_image_basename(tmp_path: Path) -> None:
    picture = tmp_path / "shadow_101.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    b = backend(rules=[{"user": r"\[image\] shadow_101\.png", "template": "saw {0}"}])
    prompt = [TextPart(text="Which shadow?"), ImagePart(source=str(picture))]
    request = ChatRequest(messages=[user(prompt)], stage="rollout")
    response = b.attempt(request, timeout_s=5)
    assert response.text == "saw [image] shadow_101.png"
    assert request.last_user_text() == "Which shadow?\n[image] shadow_101.png"
    assert response.usage.prompt_tokens == 9  # 36 characters / 4: the image counts as its text line


# --- rule sources -----------------------------------------------------------------------------


def test_rules_load_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "- stage: rollout\n  user: 'capital of (\\w+)'\n  template: 'Paris, {1}'\n", encoding="utf-8"
    )
    assert ask(backend(rules=str(path)), "capital of France").text == "Paris, France"


def test_bad_rule_in_a_yaml_file_names_the_file_and_index(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("- text: ok\n- txt: typo\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"rules \(.*rules\.yaml\)\[1\]\.txt: unknown key"):
        backend(rules=str(path))


def test_unknown_rule_set_lists_the_built_in_and_plug_in_ones() -> None:
    with pytest.raises(ConfigError, match="unknown rule set 'nonsense'; known sets: auto, estimate, demo"):
        backend(rules="nonsense")


def test_missing_rules_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        backend(rules=str(tmp_path / "absent.yaml"))


def _resolve(tmp_path: Path, env: dict[str, str]) -> Any:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    env = {"SKILLOPT_TARGET_BACKEND": "scripted", "SKILLOPT_OPTIMIZER_BACKEND": "scripted", **env}
    return resolve_roles(
        load_config(config_file=config, env=env), env=env, registry=BackendRegistry([scripted.INFO])
    )


def test_options_reject_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.target\.options\.rule: unknown option"):
        _resolve(tmp_path, {"SKILLOPT_TARGET_RULE": "auto"})


def test_rules_from_the_environment_select_a_built_in_set(tmp_path: Path) -> None:
    roles = _resolve(tmp_path, {"SKILLOPT_TARGET_RULES": "estimate"})
    b = scripted.INFO.factory(roles.target, EnvSecrets({}), BackendContext())
    assert isinstance(b.rule_set, scripted.EstimateRules)
    assert roles.target.model == "scripted" and not roles.target.key_required


# --- the auto set -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "schema"),
    [("analyst", AnalystReply), ("ranking", RankingReply), ("lr", BudgetReply), ("rewrite", RewriteReply)],
)
def test_auto_optimizer_replies_are_minimal_and_schema_valid(stage: str, schema: type[BaseModel]) -> None:
    response = ask(backend("optimizer"), "evidence", stage=stage, schema=schema)
    assert isinstance(response.parsed, schema)
    assert schema.model_validate_json(response.text) == response.parsed


def test_auto_minimal_values_respect_simple_constraints() -> None:
    b = backend("optimizer")
    assert json.loads(ask(b, stage="lr", schema=BudgetReply).text) == {
        "learning_rate": 1, "reasoning": "", "confidence": "low", "risk_notes": []}
    assert ask(b, stage="ranking", schema=RankingReply).parsed.selected_indices == [0]
    assert ask(b, stage="rewrite", schema=RewriteReply).parsed.new_skill is None
    analyst = json.loads(ask(b, stage="analyst", schema=AnalystReply).text)
    assert analyst == {"diagnosis": [], "patch": {"reasoning": "", "edits": []}}


def test_auto_optimizer_without_schema_answers_an_empty_object() -> None:
    assert ask(backend("optimizer"), stage="merge").text == "{}"


def test_auto_reports_a_schema_it_cannot_satisfy() -> None:
    class Coded(BaseModel):
        code: str = Field(pattern=r"^[A-Z]{3}$")

    with pytest.raises(
        ScriptedNoMatch, match=r"cannot build a valid Coded \(code: .*add a rule for stage deep_probe"
    ):
        ask(backend("optimizer"), stage="deep_probe", schema=Coded)


@pytest.mark.parametrize(
    ("prediction", "golds", "verdict"),
    [
        ("  PARIS! ", ["paris"], "correct"),
        ("New   York.", ["Boston", "new york"], "correct"),
        ("Paris is not the answer", ["Paris"], "incorrect"),
        ("Paris", ["Paris is the answer"], "incorrect"),
        ("seven", ["7"], "incorrect"),
        ("7", "7", "correct"),
    ],
)
def test_auto_judge_grades_by_exact_normalised_equality(prediction: str, golds: Any, verdict: str) -> None:
    response = ask(backend("judge"), "grade this", stage="judge", schema=Verdict,
                   prediction=prediction, gold_answers=golds)
    assert response.parsed.verdict == verdict
    assert json.loads(response.text)["verdict"] == verdict


def test_auto_judge_without_prediction_tags_is_no_match() -> None:
    with pytest.raises(ScriptedNoMatch, match=r"tags\['prediction'\]"):
        ask(backend("judge"), "grade this", stage="judge", schema=Verdict)


def test_normalise_answer_lowercases_strips_punctuation_and_collapses_space() -> None:
    assert normalise_answer("  Hello,\tWORLD!!  it's_me ") == "hello world itsme"


def test_auto_rollout_uses_the_benchmark_target_rules() -> None:
    context = BackendContext(scripted_target_rules=(
        {"user": "item one", "text": "<answer>1</answer>"},
        {"item_id": "two", "text": "<answer>2</answer>"},
    ))
    b = backend(context=context)
    assert ask(b, "solve item one").text == "<answer>1</answer>"
    assert ask(b, "anything", item_id="two").text == "<answer>2</answer>"
    with pytest.raises(ScriptedNoMatch, match="none of the 2 rules of benchmark scripted_rules matched"):
        ask(b, "item three")


def test_auto_lets_the_data_rules_script_an_optimizer_stage_and_answers_the_rest_itself() -> None:
    from skillopt.optimizer.reflect import AnalystReply as Analyst

    edit = {"op": "append", "content": "Count the hidden cubes."}
    context = BackendContext(scripted_target_rules=(
        {"stage": "rollout", "text": "\\boxed{7}"},
        {"stage": "analyst", "system": "# Failure analyst",
         "json": {"diagnosis": [], "patch": {"reasoning": "r", "edits": [edit]}}},
    ))
    optimizer = backend("optimizer", context=context)
    scripted_reply = ask(optimizer, "trajectories", stage="analyst", sys="# Failure analyst", schema=Analyst)
    assert scripted_reply.parsed.patch.edits[0].model_dump(exclude_defaults=True) == edit
    # A request no rule answers (another analyst, another stage) gets the auto set's own reply.
    default = json.loads(ask(optimizer, "trajectories", stage="analyst", sys="# Success analyst",
                             schema=Analyst).text)
    assert default == {"diagnosis": [], "patch": {"edits": []}}
    assert ask(optimizer, stage="merge").text == "{}"
    assert ask(backend(context=context), "solve").text == "\\boxed{7}"


def test_auto_rollout_without_target_rules_is_no_match() -> None:
    with pytest.raises(ScriptedNoMatch, match="stage rollout.*no scripted target rules"):
        ask(backend(), "solve")


def test_bad_benchmark_target_rule_is_a_config_error() -> None:
    context = BackendContext(scripted_target_rules=({"txt": "typo"},))
    with pytest.raises(ConfigError, match=r"benchmark scripted_rules\[0\]\.txt: unknown key"):
        backend(context=context)


def test_auto_answers_every_stage_offline() -> None:
    context = BackendContext(scripted_target_rules=({"text": "<answer>x</answer>"},))
    for stage, role, schema, tags in [
        ("rollout", "target", None, {}),
        ("preflight", "target", None, {}),
        ("judge", "judge", Verdict, {"prediction": "x", "gold_answers": ["x"]}),
        *((s, "optimizer", AnalystReply, {}) for s in OPTIMIZER_STAGES),
    ]:
        response = ask(backend(role, context=context), "prompt", stage=stage, schema=schema, **tags)
        assert response.text
    assert ask(backend(), stage="preflight").text == "ok"


# --- the estimate set -------------------------------------------------------------------------


def test_estimate_rollout_is_about_four_hundred_tokens() -> None:
    response = ask(backend(rules="estimate"), "q")
    assert 380 <= response.usage.completion_tokens <= 420


def test_estimate_optimizer_replies_are_padded_and_schema_valid() -> None:
    b = backend("optimizer", rules="estimate")
    padded = ask(b, stage="analyst", schema=AnalystReply)
    minimal = ask(backend("optimizer"), stage="analyst", schema=AnalystReply)
    assert isinstance(padded.parsed, AnalystReply)
    assert len(padded.parsed.diagnosis) == 3 and len(padded.parsed.patch.edits) == 3
    assert padded.usage.completion_tokens > 1000 > minimal.usage.completion_tokens
    assert isinstance(ask(b, stage="lr", schema=BudgetReply).parsed, BudgetReply)
    rewrite = ask(b, stage="rewrite", schema=RewriteReply).parsed
    assert rewrite.new_skill and rewrite.previous is not None


def test_estimate_judge_answers_a_verdict_and_is_deterministic() -> None:
    b = backend("judge", rules="estimate")
    first = ask(b, stage="judge", schema=Verdict)
    assert first.parsed.verdict in ("correct", "incorrect")
    assert ask(backend("judge", rules="estimate"), stage="judge", schema=Verdict).text == first.text


def test_estimate_handles_recursive_schemas() -> None:
    class Node(BaseModel):
        label: str
        children: list[Node] = []

    response = ask(backend("optimizer", rules="estimate"), stage="merge", schema=Node)
    assert isinstance(response.parsed, Node) and response.parsed.children


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_calls_get_the_same_answers() -> None:
    b = backend(rules=[{"user": r"item (\d+)", "template": "answer {1}"}])
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        results[i] = ask(b, f"item {i}").text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"answer {i}" for i in range(16)}


def test_items_the_fixture_rules_do_not_know_are_said_once(caplog: pytest.LogCaptureFixture):
    rules_file = Path(__file__).resolve().parents[1] / "fixtures" / "qa" / "scripted_rules.yaml"
    table = scripted.RuleTable(scripted.load_rules_file(rules_file, where="qa rules"), where="qa rules")
    backend = ScriptedBackend(table)
    with caplog.at_level("WARNING", logger="skillopt.llm"):
        for question in ("What is the airspeed of a swallow?", "Who wrote my own data?"):
            reply = backend.attempt(ChatRequest(messages=[user(question)], stage="rollout"), timeout_s=5)
            assert reply.text == "I do not know.\n<answer>unknown</answer>"
    warnings = [r.getMessage() for r in caplog.records if "no reply of its own for some" in r.getMessage()]
    assert len(warnings) == 1
    assert "qa rules answers them with its catch-all rule ('qa other')" in warnings[0]
    assert "--backend" in warnings[0] and "for_other_items: true" in warnings[0]


def test_a_catch_all_meant_for_the_other_items_is_not_warned_about(caplog: pytest.LogCaptureFixture):
    """A fixture that scores its remaining items as failures on purpose (alfworld, swebench) says so."""
    rules = scripted.parse_rules([{"stage": "rollout", "question": "Italy", "text": "<answer>Rome</answer>"},
                                  {"stage": "rollout", "text": "no idea", "for_other_items": True}],
                                 where="mine")
    with caplog.at_level("WARNING", logger="skillopt.llm"):
        reply = ScriptedBackend(scripted.RuleTable(rules, where="mine")).attempt(
            ChatRequest(messages=[user("capital of France?")], stage="rollout"), timeout_s=5)
    assert reply.text == "no idea" and "no reply of its own" not in caplog.text


def test_a_table_of_only_catch_all_rules_is_not_warned_about(caplog: pytest.LogCaptureFixture):
    rules = scripted.parse_rules([{"stage": "rollout", "text": "42"}], where="mine")
    table = scripted.RuleTable(rules, where="mine")
    with caplog.at_level("WARNING", logger="skillopt.llm"):
        ScriptedBackend(table).attempt(ChatRequest(messages=[user("anything")], stage="rollout"), timeout_s=5)
    assert "no reply of its own" not in caplog.text


def test_the_quickstart_rehearsal_rules_give_the_optimizer_something_to_learn():
    """examples/qa/scripted_rules.yaml: arithmetic is answered once the skill asks for the working, and the
    failure analyst proposes that rule while the skill lacks it, then the capitals rule."""
    rules_file = Path(__file__).resolve().parents[2] / "examples" / "qa" / "scripted_rules.yaml"
    table = scripted.RuleTable(scripted.load_rules_file(rules_file, where="rehearsal"), where="rehearsal")
    backend = ScriptedBackend(table)

    def rollout(skill: str) -> str:
        question = user("## Question\nWhat is 12 times 12?")
        request = ChatRequest(messages=[system(skill), question], stage="rollout")
        return backend.attempt(request, timeout_s=5).text

    assert rollout("# Answer briefly").endswith("<answer>unknown</answer>")
    assert rollout("Work the calculation out step by step.").endswith("<answer>144</answer>")

    def proposed(skill: str) -> str:
        request = ChatRequest(messages=[system("# Failure analyst\n..."), user(f"## Current skill\n{skill}")],
                              stage="analyst")
        return json.loads(backend.attempt(request, timeout_s=5).text)["patch"]["edits"][0]["content"]

    assert "step by step" in proposed("# Answer briefly")
    assert "name the capital city" in proposed("- Work the calculation out step by step.")
