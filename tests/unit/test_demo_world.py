"""The demo world (skillopt.benchmarks.demo): generation, scoring, the scripted target and optimizer.

The last tests run a tiny training loop without Prefect — the real runner, stage request
builders, reply models, ``apply_edits`` and a strict gate — against the scripted ``demo`` set, and
check the dynamics the demo exists to show: a low baseline, convention edits that lift val to
~1.0, and harmful edits that the gate would reject.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from skillopt.benchmarks.base import Benchmark, benchmark_config, load_benchmark
from skillopt.benchmarks.demo import DemoConfig, plugin
from skillopt.benchmarks.demo.scripted import NOISE_RATE, DemoRules, analyst, merge, ranking, target
from skillopt.benchmarks.demo.world import (
    CONVENTIONS,
    HARMFUL_RULES,
    RULES,
    TASK_TYPES,
    USELESS_RULES,
    check_answer,
    generate_splits,
    parse_question,
    read_style,
    score_response,
)
from skillopt.core.config import BenchmarkSection
from skillopt.core.data import Item
from skillopt.core.records import ItemResult, Patch
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.merge import MergeReply, merge_request, patch_from_merge
from skillopt.optimizer.meta_skill import MetaSkillReply, meta_skill_request
from skillopt.optimizer.reflect import AnalystReply, analyst_request, patch_from_reply, split_and_batch
from skillopt.optimizer.select import RankingReply, needs_ranking, ranking_request, select_edits
from skillopt.optimizer.slow_update import SlowUpdateReply, pair_by_id, slow_update_request
from skillopt.optimizer.step_buffer import StepBuffer, StepBufferEntry
from skillopt.skill.document import Edit, apply_edits, replace_block, target_text
from tests.fakes.demo_world import INITIAL_SKILL, accuracy, ask, backend, items, rollout

SIZES = {"train": 24, "val": 12, "test": 24}
ALL_CONVENTIONS = INITIAL_SKILL + "\n" + "\n".join(rule.phrasings[0] for rule in CONVENTIONS)
#: The target overlooks the thousands comma unless a protected block repeats it (execution notes).
REMINDER = (
    "\n\n<!-- APPENDIX_START -->\n- " + RULES["thousands_comma"].phrasings[0] + "\n<!-- APPENDIX_END -->"
)
ALL_CONVENTIONS_REMINDED = ALL_CONVENTIONS + REMINDER


# ------------------------------------------------------------------------------------------ helpers


def answer_of(skill: str, question: str) -> str:
    request = ChatRequest(
        messages=[system(f"Solve it.\n\n## Skill\n{skill}"), user(question)], stage="rollout"
    )
    reply = target(request, 0)
    return reply.rsplit("<answer>", 1)[1].split("</answer>", 1)[0]


def analyst_message(skill: str, blocks: str, *, budget: int = 4, step_buffer: str = "") -> ChatRequest:
    sections = [f"## Current skill\n{skill}", f"## Edit budget\nYou may propose at most {budget} edits."]
    if step_buffer:
        sections.append(f"## Step buffer\n{step_buffer}")
    sections.append(f"## Trajectories\n{blocks}")
    return ChatRequest(messages=[system("analyst"), user("\n\n".join(sections))], stage="analyst",
                       tags={"kind": "failure"})


def block(index: int, item_id: str, conventions: str) -> str:
    return (f"### Trajectory {index}: id `{item_id}`\nTask type: city\nOutcome: failed; wrong\nEvents:\n- "
            f"[user] q\n[EVALUATION RESULT]\nPredicted: x\nExpected: y\nConventions: {conventions}")


# ---------------------------------------------------------------------------------------- generation


def test_generation_is_deterministic_and_has_the_configured_sizes(tmp_path: Path) -> None:
    first, again = generate_splits(42, SIZES), generate_splits(42, SIZES)
    assert first == again
    assert {name: len(rows) for name, rows in first.items()} == SIZES
    assert generate_splits(43, SIZES) != first
    assert [len(items(split, tmp_path)) for split in ("train", "val", "test")] == [24, 12, 24]
    assert len(items("train", tmp_path, train_size=10)) == 10


def test_ids_are_unique_and_name_their_split(tmp_path: Path) -> None:
    ids = [item.id for split in ("train", "val", "test") for item in items(split, tmp_path)]
    assert len(ids) == len(set(ids)) == 60
    assert items("train", tmp_path)[7].id == "demo-train-007"
    assert all(item.id.startswith("demo-test-") for item in items("test", tmp_path))


def test_every_split_holds_every_task_type_and_no_question_repeats(tmp_path: Path) -> None:
    splits = {split: items(split, tmp_path) for split in ("train", "val", "test")}
    for rows in splits.values():
        assert plugin.task_types(rows) == list(TASK_TYPES)
    questions = [item["question"] for rows in splits.values() for item in rows]
    assert len(questions) == len(set(questions))


def test_gold_applies_every_convention_of_its_type(tmp_path: Path) -> None:
    for item in items("train", tmp_path):
        check = check_answer(item.task_type, item["answer"], item["answer"])
        assert check.value_ok and all(check.conventions.values()), item
    prices = [item["answer"] for item in items("train", tmp_path) if item.task_type == "price"]
    assert any("," in price for price in prices)  # bulk orders make the thousands convention matter


def test_limit_keeps_the_first_items_of_each_split(tmp_path: Path) -> None:
    limited = items("val", tmp_path, limit=3)
    assert [item.id for item in limited] == [item.id for item in items("val", tmp_path)[:3]]


def test_split_dir_mode_reads_items_in_the_demo_form(tmp_path: Path) -> None:
    generated = generate_splits(5, {"train": 2, "val": 1, "test": 1})
    for split, rows in generated.items():
        (tmp_path / split).mkdir()
        (tmp_path / split / "items.json").write_text(json.dumps(rows), encoding="utf-8")
    loaded = items("train", tmp_path, split_mode="split_dir", split_dir=str(tmp_path))
    assert [dict(item) for item in loaded] == generated["train"]


def test_config_takes_the_common_keys_and_rejects_unknown_ones() -> None:
    section = BenchmarkSection.model_validate({"name": "demo", "split_mode": "generated", "train_size": 30})
    cfg = benchmark_config(plugin, section)
    assert isinstance(cfg, DemoConfig) and cfg.train_size == 30 and cfg.val_size == 12 and cfg.workers == 16
    with pytest.raises(ValidationError):
        DemoConfig(trian_size=3)


def test_the_plug_in_is_registered_and_implements_the_protocol() -> None:
    loaded = load_benchmark("demo")
    assert loaded is plugin and isinstance(loaded, Benchmark)
    assert (loaded.id, loaded.version, loaded.GOLD_FIELDS, loaded.default_split_mode) == (
        "demo", "2", ("answer",), "generated")
    assert not loaded.needs_judge(DemoConfig())
    loaded.preflight(DemoConfig())
    assert {p.name for p in loaded.prompts_dir.glob("*.md")} == {
        "initial_skill.md", "analyst_error.md", "analyst_success.md"}


# ------------------------------------------------------------------------------------------- scoring


def test_an_exact_answer_scores_one() -> None:
    score = score_response("distance", "33.8 km", "distance = 45 x 0.75\n<answer>33.8 km</answer>")
    assert (score.hard, score.soft, score.fail_reason, score.expected) == (1.0, 1.0, "", "33.8 km")
    assert score.detail == "Conventions: one_decimal=ok, unit_km=ok"


def test_a_right_value_missing_a_convention_gets_partial_credit() -> None:
    score = score_response("distance", "33.8 km", "<answer>33.75 km</answer>")
    assert score.hard == 0.0 and score.soft == 0.5
    assert score.fail_reason == "wrong: predicted '33.75 km', expected '33.8 km'"
    assert score.detail == "Conventions: one_decimal=missing, unit_km=ok"
    price = score_response("price", "$3,018.78", "<answer>3018.78</answer>")
    assert price.soft == pytest.approx(1 / 3)
    assert price.detail == "Conventions: dollar_prefix=missing, two_decimals=ok, thousands_comma=missing"


def test_a_wrong_value_gets_no_credit_whatever_its_format() -> None:
    score = score_response("city", "TOKYO", "<answer>OSAKA</answer>")
    assert (score.hard, score.soft) == (0.0, 0.0)
    assert score.detail == "Conventions: uppercase_city=ok; value=wrong"


def test_a_reply_without_an_answer_tag_is_a_no_answer_row() -> None:
    score = score_response("date", "2021-03-14", "It is 2021-03-14.")
    assert (score.hard, score.soft, score.predicted_answer) == (0.0, 0.0, "")
    assert score.fail_reason == "no-answer: no <answer> tag"
    assert score.detail == "Conventions: iso_date=missing; value=missing"
    assert (
        score_response("date", "2021-03-14", "<answer> </answer>").fail_reason
        == "no-answer: empty <answer> tag"
    )


def test_the_last_answer_tag_is_scored() -> None:
    assert score_response("count", "8", "<answer>eight</answer> no, <ANSWER>8</ANSWER>").hard == 1.0


# -------------------------------------------------------------------------------------------- target


def test_the_initial_skill_states_no_convention_and_names_the_answer_tag() -> None:
    assert dict(read_style(INITIAL_SKILL).positions) == {}
    assert "<answer>…</answer>" in INITIAL_SKILL


def test_gold_never_reaches_the_target_prompt(tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        for item in items(split, tmp_path):
            without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
            messages = plugin.build_messages(without_gold, ALL_CONVENTIONS, DemoConfig())
            assert [m.role for m in messages] == ["system", "user"]
            assert all(item["answer"] not in m.text() for m in messages), item.id
            assert "## Skill\n" in messages[0].text() and "<answer>" in messages[0].text()


@pytest.mark.parametrize("rule", CONVENTIONS, ids=lambda r: r.name)
def test_the_target_applies_exactly_the_conventions_the_skill_states(rule: Any, tmp_path: Path) -> None:
    for phrasing in rule.phrasings:
        for item in items("train", tmp_path):
            habit = check_answer(item.task_type, answer_of(INITIAL_SKILL, item["question"]), item["answer"])
            skill = INITIAL_SKILL + "\n" + phrasing
            if rule.name == "thousands_comma":
                skill += REMINDER  # stated in the body alone, this rule is overlooked (see the next test)
            predicted = answer_of(skill, item["question"])
            taught = check_answer(item.task_type, predicted, item["answer"])
            assert taught.value_ok, (item["question"], predicted)
            expected = {**habit.conventions, **({rule.name: True} if rule.name in habit.conventions else {})}
            assert dict(taught.conventions) == expected, (phrasing, predicted)


def test_the_untaught_target_matches_gold_only_by_habit(tmp_path: Path) -> None:
    rows = rollout(items("val", tmp_path), INITIAL_SKILL)
    solved = [row for row in rows if row.hard]
    assert 0 < len(solved) < len(rows) / 4
    assert all(row.task_type == "count" for row in solved)


def test_harmful_rules_override_conventions_stated_earlier_and_lose_to_later_ones() -> None:
    city = "What is the capital of Kenya?"
    uppercase, lowercase = RULES["uppercase_city"].phrasings[0], RULES["lowercase"].phrasings[0]
    assert answer_of(uppercase, city) == "NAIROBI"
    assert answer_of(f"{uppercase}\n{lowercase}", city) == "nairobi"
    assert answer_of(f"{lowercase}\n{uppercase}", city) == "NAIROBI"
    distance = "A bus travels at 45 km/h for 0.75 hours. How far does it travel?"
    whole = RULES["whole_numbers"].phrasings[0]
    assert answer_of(RULES["one_decimal"].phrasings[0] + "\n" + whole, distance) == "34"
    assert (
        answer_of(
            RULES["digits"].phrasings[0] + "\n" + RULES["spell_out"].phrasings[0],
            "A shelf has 3 blue books and 4 green books. How many books are there in total?",
        )
        == "seven"
    )


def test_the_target_answers_questions_it_cannot_parse_inside_the_tag() -> None:
    reply = target(ChatRequest(messages=[system("s"), user("What is love?")], stage="rollout"), 0)
    assert reply.endswith("<answer>unknown</answer>")
    assert parse_question("What is love?") is None


# -------------------------------------------------------------------------------------------- optimizer


def test_the_analyst_proposes_one_general_rule_per_missing_convention_within_the_budget() -> None:
    blocks = "\n\n".join([
        block(1, "demo-train-001", "uppercase_city=missing"),
        block(2, "demo-train-002", "one_decimal=missing, unit_km=ok"),
        block(3, "demo-train-003", "one_decimal=missing, unit_km=missing"),
        block(4, "demo-train-004", "iso_date=missing"),
    ])
    reply = AnalystReply.model_validate(analyst(analyst_message(INITIAL_SKILL, blocks, budget=2), 1))
    contents = [edit.content for edit in reply.patch.edits]
    assert len(contents) == 2
    assert contents[0] == RULES["one_decimal"].phrasings[0]  # the best-supported convention first
    assert all(edit.op == "append" for edit in reply.patch.edits)
    assert not any(item_id in "".join(contents) for item_id in ("demo-train-00", "NAIROBI"))
    by_kind = {tuple(d.ids): d.kind for d in reply.diagnosis}
    assert by_kind[("demo-train-002", "demo-train-003")] == "rule_missing"
    zero = AnalystReply.model_validate(analyst(analyst_message(INITIAL_SKILL, blocks, budget=0), 1))
    assert zero.patch.edits == []


def test_the_analyst_skips_stated_conventions_and_rejected_wordings() -> None:
    blocks = block(1, "demo-train-001", "uppercase_city=missing") + "\n\n" + block(
        2, "demo-train-002", "iso_date=missing")
    iso = RULES["iso_date"].phrasings[0]
    buffer = (
        f'Step 1: reject (2/8 failed)\n- rejected edits (score 0.500 -> 0.500):\n  - append content "{iso}"'
    )
    skill = INITIAL_SKILL + "\n" + RULES["uppercase_city"].phrasings[0]
    for seed in range(20):
        reply = AnalystReply.model_validate(analyst(analyst_message(skill, blocks, step_buffer=buffer), seed))
        contents = [edit.content for edit in reply.patch.edits]
        assert RULES["iso_date"].phrasings[1] in contents and iso not in contents
        assert not any(RULES["uppercase_city"].stated_by(c) for c in contents)


def test_the_analyst_deletes_a_harmful_rule_that_overrides_a_stated_convention() -> None:
    lowercase = RULES["lowercase"].phrasings[0]
    skill = f"{INITIAL_SKILL}\n{RULES['uppercase_city'].phrasings[0]}\n{lowercase}"
    reply = AnalystReply.model_validate(
        analyst(analyst_message(skill, block(1, "c-1", "uppercase_city=missing")), 0)
    )
    assert reply.patch.edits[0].model_dump() == {"op": "delete", "target": lowercase, "content": "",
                                                 "file": None}
    assert reply.diagnosis[0].kind == "rule_conflict"
    fixed, report = apply_edits(skill, [Edit(op="delete", target=lowercase)])
    assert report.n_applied == 1 and lowercase not in fixed


def test_the_analyst_sometimes_adds_a_harmful_or_useless_edit_deterministically() -> None:
    request = analyst_message(INITIAL_SKILL, block(1, "demo-train-009", "uppercase_city=missing"))
    noisy = []
    for seed in range(200):
        contents = [edit["content"] for edit in analyst(request, seed)["patch"]["edits"]]
        assert contents == [edit["content"] for edit in analyst(request, seed)["patch"]["edits"]]
        noise = [c for c in contents if c in USELESS_RULES or c in {r.phrasings[0] for r in HARMFUL_RULES}]
        assert RULES["lowercase"].phrasings[0] not in noise  # never contradicts its own proposal
        noisy.append(bool(noise))
    assert abs(sum(noisy) / len(noisy) - NOISE_RATE) < 0.1


def test_handlers_answer_a_message_without_their_sections_with_a_valid_empty_reply() -> None:
    empty = ChatRequest(
        messages=[system("s"), user("nothing here")], stage="analyst", tags={"kind": "failure"}
    )
    assert AnalystReply.model_validate(analyst(empty, 0)).patch.edits == []
    success = empty.model_copy(update={"tags": {"kind": "success"}})
    assert AnalystReply.model_validate(analyst(success, 0)).patch.edits == []
    assert MergeReply.model_validate(merge(empty.model_copy(update={"stage": "merge"}), 0)).edits == []
    assert (
        RankingReply.model_validate(
            ranking(empty.model_copy(update={"stage": "ranking"}), 0)
        ).selected_indices
        == []
    )


def test_merge_dedupes_sums_support_and_puts_failure_edits_first() -> None:
    upper, lower = RULES["uppercase_city"].phrasings[0], RULES["lowercase"].phrasings[0]
    patches = [
        Patch(
            source="success", support=2, edits=[Edit(op="append", content=USELESS_RULES[0], source="success")]
        ),
        Patch(
            source="failure",
            support=3,
            edits=[
                Edit(op="append", content=upper, support_count=2),
                Edit(op="append", content=USELESS_RULES[0]),
            ],
        ),
        Patch(
            source="failure",
            support=1,
            edits=[Edit(op="append", content=upper), Edit(op="append", content=lower)],
        ),
    ]
    reply = ask(merge_request(kind="final", skill=INITIAL_SKILL, patches=patches, level=2), MergeReply)
    assert [(e.content, e.support_count, e.source) for e in reply.edits] == [
        (upper, 3, "failure"), (USELESS_RULES[0], 2, "failure")]  # the weaker contradicting rule is dropped


def test_ranking_keeps_the_best_supported_edits_ties_by_index() -> None:
    pool = [Edit(op="append", content=f"- rule {i}", support_count=s) for i, s in enumerate([1, 3, 2, 3, 1])]
    reply = ask(ranking_request(skill=INITIAL_SKILL, pool=pool, budget=3), RankingReply)
    assert reply.selected_indices == [1, 3, 2]


def test_slow_update_and_meta_skill_read_the_comparison(tmp_path: Path) -> None:
    train = items("train", tmp_path)[:10]
    before = rollout(train, INITIAL_SKILL)
    after_skill = INITIAL_SKILL + "\n" + RULES["iso_date"].phrasings[0]
    pairs = pair_by_id(before, rollout(train, after_skill))
    request = slow_update_request(start_skill=INITIAL_SKILL, current_skill=after_skill, previous_guidance="",
                                  pairs=pairs)
    guidance = ask(request, SlowUpdateReply).guidance
    assert guidance.startswith("You ") and RULES["uppercase_city"].phrasings[0] in guidance
    assert f"Improved {len(pairs.improved)}" in ask(request, SlowUpdateReply).reasoning
    guided = replace_block(after_skill, "SLOW_UPDATE", guidance)
    assert accuracy(rollout(train, guided)) > accuracy(rollout(train, after_skill))
    memory = ask(
        meta_skill_request(
            previous_skill=INITIAL_SKILL, current_skill=after_skill, previous_memory="", pairs=pairs
        ),
        MetaSkillReply,
    ).memory
    assert f"{len(pairs.improved)} items improved and 0 regressed" in memory and "uppercase_city" in memory


class _AnyObject(BaseModel):
    reasoning: str = ""


@pytest.mark.parametrize("stage", ["judge", "preflight"])
def test_unscripted_stages_fall_back_to_the_auto_set(stage: str) -> None:
    tags = {"prediction": "Paris", "gold_answers": ["Paris"]} if stage == "judge" else {}
    request = ChatRequest(messages=[system("s"), user("u")], stage=stage, tags=tags,
                          response_schema=None if stage in ("judge", "preflight") else _AnyObject)
    response = backend().attempt(request, timeout_s=30)
    assert response.text
    assert isinstance(DemoRules().reply(request, role="optimizer", seed=0), type(DemoRules().reply(
        request, role="optimizer", seed=1)))


# ------------------------------------------------------------------------------------ training dynamics


def _step(skill: str, batch: list[ItemResult], *, budget: int, seed: int, buffer: StepBuffer) -> list[Edit]:
    """Reflect, merge and select for one batch, as the flow does, through the scripted optimizer."""
    trees: dict[str, list[Patch]] = {}
    for kind, minibatches in zip(("failure", "success"),
                                 split_and_batch(batch, size=4, seed=seed, failure_only=False), strict=True):
        for rows in minibatches:
            request = analyst_request(
                kind=kind, skill=skill, budget=budget, rows=rows, step_buffer=buffer.format()
            )
            trees.setdefault(kind, []).append(
                patch_from_reply(ask(request, AnalystReply), kind=kind, rows=rows, budget=budget))
    roots = []
    for kind, patches in trees.items():
        if len(patches) > 1:
            reply = ask(merge_request(kind=kind, skill=skill, patches=patches, level=1), MergeReply)
            patches = [patch_from_merge(reply, kind=kind, level=1, patches=patches)]
        roots.append(patches[0])
    if len(roots) > 1:
        reply = ask(merge_request(kind="final", skill=skill, patches=roots, level=2), MergeReply)
        roots = [patch_from_merge(reply, kind="final", level=2, patches=roots)]
    pool = roots[0].edits if roots else []
    ranked = ask(ranking_request(skill=skill, pool=pool, budget=budget), RankingReply) \
        if needs_ranking(pool, budget) else None
    return select_edits(pool, budget, ranked).edits


def test_training_on_the_scripted_optimizer_learns_the_conventions(tmp_path: Path) -> None:
    train, val = items("train", tmp_path), items("val", tmp_path)
    skill = INITIAL_SKILL
    current = baseline = accuracy(rollout(val, skill))
    decisions = []
    for epoch in (1, 2):
        buffer = StepBuffer()
        for step, start in enumerate(range(0, len(train), 8), 1):
            batch = rollout(train[start:start + 8], skill)
            edits = _step(skill, batch, budget=4, seed=100 * epoch + step, buffer=buffer)
            if not edits:
                decisions.append("skip")
                continue
            candidate, _ = apply_edits(skill, edits)
            score = accuracy(rollout(val, candidate))
            accepted = score > current
            decisions.append("accept" if accepted else "reject")
            buffer.add(StepBufferEntry(step=step, decision=decisions[-1], n_fail=sum(r.failed for r in batch),
                                       n_total=len(batch), rejected_edits=[] if accepted else edits,
                                       score_before=current, score_after=score))
            if accepted:
                skill, current = candidate, score
    assert baseline < 0.2
    assert current >= 0.9, (decisions, skill)
    assert "accept" in decisions and "reject" in decisions  # the noise edits give the gate work
    assert sum(read_style(target_text(skill)).states(rule.name) for rule in CONVENTIONS) >= 6
    harmed, _ = apply_edits(skill, [Edit(op="append", content=RULES["lowercase"].phrasings[0]),
                                    Edit(op="append", content=RULES["whole_numbers"].phrasings[0])])
    assert accuracy(rollout(val, harmed)) < current  # the strict gate would reject this candidate
    useless, _ = apply_edits(skill, [Edit(op="append", content=USELESS_RULES[0])])
    assert accuracy(rollout(val, useless)) == current  # a tie: rejected too


def test_all_conventions_solve_every_item_and_the_baseline_does_not(tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        rows = items(split, tmp_path)
        assert accuracy(rollout(rows, ALL_CONVENTIONS_REMINDED)) == 1.0
        assert accuracy(rollout(rows, INITIAL_SKILL)) < 0.2


def test_a_thousands_comma_rule_in_the_body_alone_is_overlooked_until_the_appendix_repeats_it(
        tmp_path: Path) -> None:
    bulk = [row for row in items("train", tmp_path) if "," in row["answer"]]
    assert bulk
    assert accuracy(rollout(bulk, ALL_CONVENTIONS)) == 0.0
    assert accuracy(rollout(bulk, ALL_CONVENTIONS_REMINDED)) == 1.0


def test_with_a_rules_file_the_analyst_adds_rules_there_and_deletes_where_a_line_lives() -> None:
    from skillopt.benchmarks.base import shipped_prompts_dir
    from skillopt.optimizer.reflect import current_skill_section
    from skillopt.skill.files import split_files
    from skillopt.skill.folder import load_skill

    folder = shipped_prompts_dir("demo") / "skill" / "demo-word-problems"
    skill = load_skill(folder, max_file_bytes=100_000).text
    lowercase = RULES["lowercase"].phrasings[0]
    stated = [RULES["uppercase_city"].phrasings[0], lowercase]
    appends = [Edit(op="append", content=line, file="references/rules.md") for line in stated]
    skill, _ = apply_edits(skill, appends)
    blocks = block(1, "c-1", "uppercase_city=missing") + "\n\n" + block(2, "d-1", "iso_date=missing")
    # The message as the analyst request lays it out: the current skill, then the file tree.
    message = (f"{current_skill_section(skill)}\n\n## Edit budget\nYou may propose at most 4 edits.\n\n"
               f"## Trajectories\n{blocks}")
    request = ChatRequest(messages=[system("analyst"), user(message)], stage="analyst",
                          tags={"kind": "failure"})
    reply = AnalystReply.model_validate(analyst(request, 0))
    edits = patch_from_reply(reply, kind="failure", rows=[], budget=4).edits
    assert [(e.op, e.file) for e in edits if e.op == "delete"] == [("delete", "references/rules.md")]
    adds = [e for e in edits if e.op == "append"]
    assert adds and all(e.file == "references/rules.md" for e in adds)
    new, report = apply_edits(skill, edits)
    assert report.n_applied == len(edits)
    rules = split_files(new)["references/rules.md"]
    assert lowercase not in rules and any(RULES["iso_date"].stated_by(line) for line in rules.splitlines())
