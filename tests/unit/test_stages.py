"""The optimizer's pure stages: the exact prompt formats, reply parsing and the fallbacks."""

from __future__ import annotations

import json
import re

import pytest

from skillopt.core.prompts import OPTIMIZER_PROMPTS, ReplyModel, optimizer_prompt
from skillopt.core.records import Diagnosis, ItemResult, Patch
from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.merge import (
    MergeReply,
    concat_fallback,
    merge_groups,
    merge_request,
    patch_from_merge,
    plan_merge_levels,
)
from skillopt.optimizer.meta_skill import MetaSkillReply, memory_from_reply, meta_skill_request
from skillopt.optimizer.probe import probe_request
from skillopt.optimizer.reflect import (
    AnalystReply,
    analyst_fallback,
    analyst_request,
    minibatches,
    patch_from_reply,
    split_and_batch,
)
from skillopt.optimizer.select import RankingReply, needs_ranking, ranking_request, select_edits
from skillopt.optimizer.slow_update import (
    SlowUpdateReply,
    guidance_from_reply,
    pair_by_id,
    select_pairs,
    slow_update_request,
)
from skillopt.optimizer.step_buffer import StepBuffer, StepBufferEntry, failure_patterns
from skillopt.optimizer.trajectory import format_trajectory
from skillopt.skill.document import Edit

SKILL = "# Skill\n\n- Answer briefly.\n\n<!-- SLOW_UPDATE_START -->\nBe careful.\n<!-- SLOW_UPDATE_END -->\n"
EVALUATION = "[EVALUATION RESULT] task: capital of X\npredicted: Paris\nexpected: Lyon\nverdict: wrong"
PROTECTED_MARKERS = ("<!-- SLOW_UPDATE_START -->", "<!-- APPENDIX_START -->")


def make_row(item_id: str, *, solved: bool = False, events: list[dict] | None = None) -> ItemResult:
    trajectory = events if events is not None else [
        {"type": "message", "role": "system", "turn": 0, "content": "SYSTEM PROMPT WITH THE SKILL"},
        {"type": "message", "role": "user", "turn": 0, "content": f"Question {item_id}?\nThink first."},
        {"type": "message", "role": "assistant", "turn": 1, "content": "<answer>Paris</answer>"},
    ]
    return ItemResult(
        id=item_id, task_type="lookup", hard=1.0 if solved else 0.0, soft=1.0 if solved else 0.0,
        fail_reason="" if solved else "wrong: predicted 'Paris'", task_description=f"Question {item_id}?",
        predicted_answer="Paris",
        trajectory=[*trajectory, {"type": "evaluation", "content": EVALUATION}],
    )


def edit(content: str, source: str = "failure", support: int = 1) -> Edit:
    return Edit(op="append", content=content, source=source, support_count=support)


def system_and_user(request: ChatRequest) -> tuple[str, str]:
    assert [m.role for m in request.messages] == ["system", "user"]
    return request.system_text(), request.last_user_text()


# --------------------------------------------------------------------------------------------------
# Trajectory blocks


def test_trajectory_block_shows_header_events_and_evaluation_but_not_the_system_message():
    row = make_row(
        "q-1",
        events=[
            {"type": "message", "role": "system", "content": "SYSTEM PROMPT WITH THE SKILL"},
            {"type": "message", "role": "user", "content": "Question q-1?\nThink first."},
            {
                "type": "tool_call",
                "turn": 1,
                "name": "search",
                "command": "search capital",
                "observation": "a\nb",
            },
            {
                "type": "env_step",
                "step": 2,
                "reasoning": "",
                "action": "go to desk",
                "observation": "You arrive.",
            },
            {"type": "feedback", "role": "user", "content": "Check your answer."},
            {"type": "message", "role": "assistant", "content": "<answer>Paris</answer>"},
        ],
    )
    assert format_trajectory(row, index=3) == "\n".join([
        "### Trajectory 3: id `q-1`",
        "Task type: lookup",
        "Task: Question q-1?",
        "Outcome: failed; wrong: predicted 'Paris'",
        "Events:",
        "- [user] Question q-1? / Think first.",
        "- [tool] search capital -> a / b",
        "- [step 2] go to desk -> You arrive.",
        "- [feedback] Check your answer.",
        "- [assistant] <answer>Paris</answer>",
        EVALUATION,
    ])


def test_solved_trajectory_says_solved_and_no_failure():
    block = format_trajectory(make_row("ok", solved=True), index=1)
    assert "Outcome: solved; no failure" in block.splitlines()


def test_env_step_reasoning_is_its_own_line_before_the_step():
    row = make_row("e", events=[
        {"type": "env_step", "step": 1, "reasoning": "look first", "action": "look", "observation": "a room"},
    ])
    lines = format_trajectory(row, index=1).splitlines()
    assert lines[5:7] == ["- [reasoning] look first", "- [step 1] look -> a room"]


def test_long_trajectory_elides_the_middle_of_its_longest_fields_and_keeps_the_evaluation_verbatim():
    long_evaluation = "[EVALUATION RESULT] " + "detail " * 300
    events = [{"type": "message", "role": "assistant", "content": f"start{k} " + "x" * 3000 + f" end{k}"}
              for k in range(4)]
    row = make_row("long", events=[*events])
    row = row.model_copy(update={"trajectory": [*events, {"type": "evaluation", "content": long_evaluation}]})
    block = format_trajectory(row, index=1, max_chars=4000)
    assert len(block) <= 4000
    assert block.endswith(long_evaluation)
    assert len(re.findall(r"\[… \d+ characters elided …\]", block)) == 4
    assert all(f"start{k}" in block and f"end{k}" in block for k in range(4))


def test_many_events_keep_both_ends_and_say_how_many_were_left_out():
    events = [{"type": "env_step", "step": k, "reasoning": "", "action": f"act {k}", "observation": "o" * 200}
              for k in range(200)]
    block = format_trajectory(make_row("many", events=events), index=1, max_chars=3000)
    assert len(block) <= 3000
    assert "[step 0] act 0" in block and "[step 199] act 199" in block
    assert re.search(r"^- \[… \d+ events elided …\]$", block, re.M)
    assert block.endswith(EVALUATION)


# --------------------------------------------------------------------------------------------------
# Analysts


def test_analyst_user_message_has_the_sections_in_order_and_the_budget_sentence():
    rows = [make_row("a"), make_row("b")]
    request = analyst_request(kind="failure", skill=SKILL, budget=3, rows=rows, step_buffer="BUFFER TEXT",
                              meta_skill="MEMORY TEXT")
    _, text = system_and_user(request)
    expected_start = (
        f"## Current skill\n{SKILL.rstrip()}\n\n## Edit budget\nYou may propose at most 3 edits.\n\n"
    )
    assert text.startswith(expected_start)
    headings = re.findall(r"^## .*$", text, re.M)
    assert headings == ["## Current skill", "## Edit budget", "## Step buffer", "## Optimizer memory",
                        "## Trajectories"]
    assert "## Step buffer\nBUFFER TEXT\n\n## Optimizer memory\nMEMORY TEXT\n\n## Trajectories\n" in text
    assert format_trajectory(rows[0], index=1) + "\n\n" + format_trajectory(rows[1], index=2) in text
    assert request.stage == "analyst"
    assert request.tags == {"kind": "failure", "item_ids": ["a", "b"]}


def test_analyst_message_leaves_out_empty_buffer_and_memory_and_shows_an_empty_skill():
    _, text = system_and_user(
        analyst_request(kind="success", skill="", budget=0, rows=[make_row("a", solved=True)])
    )
    assert text.startswith("## Current skill\n(empty)\n\n## Edit budget\nYou may propose at most 0 edits.\n\n"
                           "## Trajectories\n### Trajectory 1: id `a`")


@pytest.mark.parametrize("kind", ["failure", "success"])
def test_analyst_system_message_holds_the_output_keys_and_protected_block_warning_not_the_evidence(kind):
    request = analyst_request(kind=kind, skill=SKILL, budget=2, rows=[make_row("zz-item")],
                              benchmark_guidance="Use kinds evidence_miss and reading_error.")
    system_text, user_text = system_and_user(request)
    for key in ('"diagnosis"', '"ids"', '"kind"', '"description"', '"patch"', '"reasoning"', '"edits"',
                '"op"', '"target"', '"content"', '"execution_notes"'):
        assert key in system_text
    assert all(marker in system_text for marker in PROTECTED_MARKERS)
    assert system_text.rstrip().endswith("## Benchmark guidance\nUse kinds evidence_miss and reading_error.")
    assert "zz-item" not in system_text and "[EVALUATION RESULT] task" not in system_text
    assert "zz-item" in user_text and "Benchmark guidance" not in user_text


def test_execution_notes_instructions_only_with_the_appendix_and_only_for_failures():
    def system_text(kind, use_appendix):
        return analyst_request(kind=kind, skill="", budget=1, rows=[make_row("a")],
                               use_appendix=use_appendix).system_text()

    assert "## Execution notes" in system_text("failure", True)
    assert "## Execution notes" not in system_text("failure", False)
    assert "## Execution notes" not in system_text("success", True)


def test_a_lapse_gets_a_note_not_a_body_edit_and_the_failure_analyst_says_the_same():
    text = analyst_request(
        kind="failure", skill="", budget=1, rows=[make_row("a")], use_appendix=True
    ).system_text()
    notes = text[text.index("## Execution notes"):]
    assert "**not a body edit**" in notes and "prefer the note" in notes
    assert "then a lapse gets a note there, not a body edit" in text[:text.index("## Execution notes")]


def test_the_deep_probe_says_what_a_good_probe_asks_and_what_it_must_not_do():
    text = probe_request(skill="", rows=[make_row("a")]).system_text()
    assert "runner-up" in text and "decisive cue" in text and "counted unit" in text
    assert "Do not prescribe a new solving procedure" in text
    assert "full chain of thought" in text and "exhaustive enumeration" in text


def analyst_reply(n_edits: int, ids: list) -> AnalystReply:
    return AnalystReply.model_validate(
        {
            "diagnosis": [{"ids": ids, "kind": "rule_missing", "description": "no rule for capitals"}],
            "patch": {
                "reasoning": "why",
                "edits": [{"op": "append", "content": f"rule {i}"} for i in range(n_edits)],
            },
            "execution_notes": ["Follow rule 1.", " ", "Follow rule 1."],
        }
    )


def test_patch_from_reply_keeps_at_most_budget_edits_in_order():
    rows = [make_row("a"), make_row("b")]
    patch = patch_from_reply(analyst_reply(5, ["a"]), kind="failure", rows=rows, budget=2)
    assert [e.content for e in patch.edits] == ["rule 0", "rule 1"]
    assert all(e.source == "failure" and e.support_count == 1 and e.merge_level == 0 for e in patch.edits)
    assert patch.support == 2 and patch.source == "failure" and patch.fallback is None
    assert patch.execution_notes == ["Follow rule 1."]
    assert patch_from_reply(analyst_reply(5, ["a"]), kind="failure", rows=rows, budget=0).edits == []


def test_patch_from_reply_drops_diagnosis_ids_outside_the_minibatch():
    rows = [make_row("a"), make_row("7")]
    reply = AnalystReply.model_validate({
        "diagnosis": [{"ids": ["a", "`a`", "val-99", 7], "kind": "rule_wrong", "description": "d"},
                      {"ids": ["test-1"], "kind": "other", "description": "unknown items only"}],
        "patch": {"edits": []},
    })
    patch = patch_from_reply(reply, kind="failure", rows=rows, budget=4)
    assert patch.diagnosis == [Diagnosis(ids=["a", "7"], kind="rule_wrong", description="d")]


def test_analyst_fallback_has_no_edits_and_records_why():
    patch = analyst_fallback(kind="success", rows=[make_row("a", solved=True)], reason="parse error: no JSON")
    assert patch.edits == [] and patch.fallback == "parse error: no JSON"
    assert patch.source == "success" and patch.support == 1


def test_minibatches_are_a_seeded_shuffle_cut_into_chunks():
    rows = [make_row(str(i)) for i in range(7)]
    batches = minibatches(rows, size=3, seed=5)
    assert [len(b) for b in batches] == [3, 3, 1]
    assert sorted(r.id for b in batches for r in b) == sorted(r.id for r in rows)
    assert batches == minibatches(rows, size=3, seed=5)
    assert [r.id for r in rows] == [str(i) for i in range(7)]  # the input is not shuffled in place


def test_split_and_batch_shuffles_failures_with_the_seed_and_successes_with_seed_plus_one():
    failures = [make_row(f"f{i}") for i in range(5)]
    successes = [make_row(f"s{i}", solved=True) for i in range(5)]
    rows = [r for pair in zip(failures, successes, strict=True) for r in pair]
    fail_batches, success_batches = split_and_batch(rows, size=2, seed=11, failure_only=False)
    assert fail_batches == minibatches(failures, size=2, seed=11)
    assert success_batches == minibatches(successes, size=2, seed=12)
    assert split_and_batch(rows, size=2, seed=11, failure_only=True)[1] == []


# --------------------------------------------------------------------------------------------------
# Merge


def test_merge_groups_are_consecutive_chunks_of_fan_in():
    patches = [Patch(reasoning=str(i)) for i in range(5)]
    groups = merge_groups(patches, 2)
    assert [[p.reasoning for p in g] for g in groups] == [["0", "1"], ["2", "3"], ["4"]]
    assert plan_merge_levels(5, 2) == 3 and plan_merge_levels(8, 8) == 1 and plan_merge_levels(1, 8) == 0
    with pytest.raises(ValueError, match="at least 2"):
        merge_groups(patches, 1)


def test_merge_message_patch_blocks_hold_json_that_round_trips():
    patches = [
        Patch(reasoning="first", source="failure", support=8,
              edits=[Edit(op="replace", target="- Answer briefly.", content="- Answer in ```one``` word.",
                          support_count=2)]),
        Patch(reasoning="second", source="success", support=3, edits=[edit("Check units.", "success")]),
    ]
    request = merge_request(kind="failure", skill=SKILL, patches=patches, level=2, meta_skill="MEMORY")
    _, text = system_and_user(request)
    assert text.startswith(f"## Current skill\n{SKILL.rstrip()}\n\n## Optimizer memory\nMEMORY\n\n## Patches "
                           "to merge (level 2)\n### Patch 1 (source: failure, support: 8)\n```json\n")
    blocks = re.findall(
        r"^### Patch (\d+) \(source: (\w+), support: (\d+)\)\n```json\n(.*?)\n```$", text, re.M | re.S
    )
    assert [(i, s, n) for i, s, n, _ in blocks] == [("1", "failure", "8"), ("2", "success", "3")]
    first = json.loads(blocks[0][3])
    assert first == {"reasoning": "first", "edits": [{"op": "replace", "target": "- Answer briefly.",
                                                      "content": "- Answer in ```one``` word.",
                                                      "support_count": 2, "source": "failure"}]}
    assert [Edit.model_validate(e) for e in first["edits"]] == patches[0].edits
    assert request.stage == "merge" and request.tags == {"kind": "failure", "level": 2, "n_patches": 2}


def test_merge_system_message_holds_the_keys_and_the_final_merge_prefers_failures():
    tree = merge_request(kind="success", skill="", patches=[Patch(), Patch()], level=1).system_text()
    final = merge_request(kind="final", skill="", patches=[Patch(), Patch()], level=3).system_text()
    for text in (tree, final):
        for key in ('"reasoning"', '"edits"', '"op"', '"target"', '"content"', '"support_count"', '"source"'):
            assert key in text
        assert all(marker in text for marker in PROTECTED_MARKERS)
    assert "keep the failure version" in final and final != tree
    assert (
        "## Optimizer memory"
        not in merge_request(kind="final", skill="", patches=[], level=1).last_user_text()
    )


def test_patch_from_merge_sums_support_and_labels_edits_with_the_tree_and_level():
    inputs = [
        Patch(source="success", support=4, edits=[edit("a", "success")], diagnosis=[Diagnosis(ids=["x"])]),
        Patch(source="success", support=3, edits=[edit("b", "success")]),
    ]
    reply = MergeReply.model_validate({"reasoning": "merged", "edits": [
        {"op": "append", "content": "a or b", "support_count": 99, "source": "failure"},
        {"op": "append", "content": "c", "support_count": None, "source": None},
    ]})
    patch = patch_from_merge(reply, kind="success", level=1, patches=inputs)
    assert patch.support == 7 and patch.merge_level == 1 and patch.source == "success"
    assert [(e.source, e.support_count, e.merge_level) for e in patch.edits] == [
        ("success", 2, 1),
        ("success", 1, 1),
    ]
    assert patch.diagnosis == [Diagnosis(ids=["x"])]
    final = patch_from_merge(reply, kind="final", level=2, patches=inputs)
    assert [e.source for e in final.edits] == ["failure", "failure"] and final.source == "failure"


def test_concat_fallback_puts_failure_edits_first_and_records_the_reason():
    inputs = [Patch(source="success", support=2, edits=[edit("s1", "success")], merge_level=1),
              Patch(source="failure", support=5, edits=[edit("f1"), edit("f2")]),
              Patch(source="success", support=1, edits=[edit("s2", "success")])]
    patch = concat_fallback(inputs, reason="merge failed: timeout")
    assert [e.content for e in patch.edits] == ["f1", "f2", "s1", "s2"]
    assert patch.fallback == "merge failed: timeout" and patch.support == 8 and patch.merge_level == 1
    assert patch.source == "failure"


# --------------------------------------------------------------------------------------------------
# Ranking and selection

POOL_LINE = re.compile(r"^\[(\d+)\] (\{.*\})$")


def test_ranking_lines_parse_back_into_the_pool():
    pool = [Edit(op="replace", target='say "hi"', content="line one\nline two", support_count=3),
            edit("b", "success"), edit("c")]
    request = ranking_request(skill=SKILL, pool=pool, budget=2)
    system_text, text = system_and_user(request)
    assert "## Candidate edits (budget = 2)\n" in text and "## Optimizer memory" not in text
    section = text.split("## Candidate edits (budget = 2)\n", 1)[1].rstrip("\n").split("\n")
    parsed = [POOL_LINE.match(line) for line in section]
    assert all(parsed)
    assert [int(m.group(1)) for m in parsed] == [0, 1, 2]
    assert [Edit.model_validate(json.loads(m.group(2))) for m in parsed] == pool
    assert list(json.loads(parsed[0].group(2))) == ["op", "target", "content", "support_count", "source"]
    assert '"selected_indices"' in system_text and '"reasoning"' in system_text
    assert all(marker in system_text for marker in PROTECTED_MARKERS)
    assert request.stage == "ranking"


def test_select_edits_drops_invalid_and_duplicate_indices_and_cuts_to_budget():
    pool = [edit(str(i)) for i in range(6)]
    selection = select_edits(pool, 3, RankingReply(selected_indices=[4, 9, 4, -1, 0, 2, 5]))
    assert selection.indices == [4, 0, 2]
    assert [e.content for e in selection.edits] == ["4", "0", "2"]
    assert selection.ignored_indices == [9, 4, -1] and selection.fallback is None


def test_select_edits_falls_back_to_the_first_budget_edits_when_ranking_failed():
    pool = [edit(str(i)) for i in range(5)]
    selection = select_edits(pool, 2, None)
    assert selection.indices == [0, 1] and selection.fallback == "ranking failed: kept the first 2"
    nothing_valid = select_edits(pool, 2, RankingReply(selected_indices=[7, 8]))
    assert nothing_valid.indices == [0, 1] and nothing_valid.fallback is not None


def test_budget_zero_selects_nothing_and_a_small_pool_needs_no_ranking():
    pool = [edit("a"), edit("b")]
    assert select_edits(pool, 0, RankingReply(selected_indices=[0])).edits == []
    assert not needs_ranking(pool, 2) and not needs_ranking(pool, 0) and needs_ranking(pool, 1)
    kept = select_edits(pool, 5, None)
    assert kept.edits == pool and kept.fallback is None


# --------------------------------------------------------------------------------------------------
# Step buffer


def test_failure_patterns_group_failed_rows_by_diagnosis_and_item_id():
    rows = [make_row("c"), make_row("a"), make_row("b"), make_row("ok", solved=True), make_row("d")]
    diagnoses = [Diagnosis(ids=["c", "ok"], kind="rule_missing", description="no unit rule"),
                 Diagnosis(ids=["a"], kind="answer_format", description="extra words"),
                 Diagnosis(ids=["a", "zzz"], kind=" rule_missing ", description="no unit rule ")]
    patterns = failure_patterns(rows, diagnoses)
    assert [(p.kind, p.description, p.ids) for p in patterns] == [
        ("rule_missing", "no unit rule", ["a", "c"]),
        ("answer_format", "extra words", ["a"]),
        ("undiagnosed", "no analyst diagnosis names these failures", ["b", "d"]),
    ]


def test_step_buffer_format_is_empty_without_entries_and_tells_analysts_what_to_avoid():
    buffer = StepBuffer()
    assert buffer.format() == ""
    patterns = failure_patterns([make_row("a")], [Diagnosis(ids=["a"], kind="rule_missing", description="d")])
    buffer.add(StepBufferEntry(step=1, decision="accept", n_fail=1, n_total=4, failure_patterns=patterns))
    buffer.add(StepBufferEntry(step=2, decision="reject", n_fail=2, n_total=4, failure_patterns=patterns,
                               rejected_edits=[Edit(op="replace", target="old rule", content="new\nrule")],
                               score_before=0.5, score_after=0.25))
    text = buffer.format()
    assert "Do not re-propose a rejected edit" in text and "unsolved" in text
    assert "Step 1: accept (1/4 failed)" in text and "Step 2: reject (2/4 failed)" in text
    assert "- pattern [rule_missing] d (ids: a)" in text
    assert (
        '- rejected edits (score 0.500 -> 0.250):\n  - replace target "old rule" content "new / rule"' in text
    )
    assert "Recurring failure kinds: rule_missing (2 steps)" in text
    assert StepBuffer.model_validate_json(buffer.model_dump_json()).format() == text


# --------------------------------------------------------------------------------------------------
# Slow update and meta skill


def test_pairs_are_matched_by_id_not_by_position():
    before = [make_row("a"), make_row("b", solved=True), make_row("c"), make_row("d", solved=True)]
    after = [make_row("d", solved=True), make_row("c"), make_row("b"), make_row("a", solved=True)]
    pairs = pair_by_id(before, after)
    assert [(x.id, y.id) for x, y in pairs.improved] == [("a", "a")]
    assert [x.id for x, _ in pairs.regressed] == ["b"]
    assert [x.id for x, _ in pairs.persistent_fail] == ["c"]
    assert [x.id for x, _ in pairs.stable_success] == ["d"]


def test_pairing_rejects_mismatched_or_repeated_ids():
    with pytest.raises(ValueError, match="only before: b; only after: c"):
        pair_by_id([make_row("a"), make_row("b")], [make_row("a"), make_row("c")])
    with pytest.raises(ValueError, match="repeated in the after rows: a"):
        pair_by_id([make_row("a")], [make_row("a"), make_row("a")])


def test_pair_policies_choose_changed_or_unchanged_pairs():
    before = [make_row("a"), make_row("b", solved=True), make_row("c"), make_row("d", solved=True)]
    after = [make_row("a", solved=True), make_row("b"), make_row("c"), make_row("d", solved=True)]
    pairs = pair_by_id(before, after)
    assert select_pairs(pairs, "mixed").ids() == ["a", "b", "c", "d"]
    assert select_pairs(pairs, "changed").ids() == ["a", "b"]
    assert select_pairs(pairs, "unchanged").ids() == ["c", "d"]


def comparison_pairs():
    before = [make_row("imp"), make_row("reg", solved=True), make_row("per"), make_row("sta", solved=True)]
    after = [make_row("imp", solved=True), make_row("reg"), make_row("per"), make_row("sta", solved=True)]
    return pair_by_id(before, after), after


def test_slow_update_message_has_both_skills_previous_guidance_and_the_comparison():
    pairs, after = comparison_pairs()
    request = slow_update_request(start_skill="# Old", current_skill=SKILL, previous_guidance="", pairs=pairs)
    system_text, text = system_and_user(request)
    assert text.startswith("## Skill at the start of the epoch\n# Old\n\n## Current "
                           f"skill\n{SKILL.rstrip()}\n\n## Previous guidance\n(none)\n\n## "
                           "Comparison\nImproved: 1\nRegressed: 1\nPersistent failures: 1\nStable "
                           "successes: 1\n\n### Improved\n")
    assert format_trajectory(after[0], index=1) in text  # the new skill's run
    assert "### Regressed\n" + format_trajectory(after[1], index=2) in text
    assert "### Persistent failures\n### Trajectory 3: id `per`" in text
    assert text.rstrip().endswith("### Stable successes\n- `sta`: before: solved (hard 1.00, soft 1.00), "
                                  "answer `Paris`; after: solved (hard 1.00, soft 1.00), answer `Paris`")
    assert "id `sta`" not in text
    assert '"guidance"' in system_text and "second person" in system_text
    assert all(marker in system_text for marker in PROTECTED_MARKERS)
    assert request.stage == "slow_update" and request.tags["item_ids"] == ["imp", "reg", "per", "sta"]


def test_meta_skill_message_has_both_skills_previous_memory_and_the_comparison():
    pairs, _ = comparison_pairs()
    request = meta_skill_request(previous_skill="# Old", current_skill="# New", previous_memory="Prefer X.",
                                 pairs=select_pairs(pairs, "changed"))
    system_text, text = system_and_user(request)
    assert text.startswith("## Previous epoch's last skill\n# Old\n\n## This epoch's last skill\n# New\n\n"
                           "## Previous memory\nPrefer X.\n\n## Comparison\nImproved: 1\nRegressed: 1\n"
                           "Persistent failures: 0\nStable successes: 0\n")
    assert "### Persistent failures\n(none)" in text
    assert '"memory"' in system_text and "never the target" in system_text
    assert all(marker in system_text for marker in PROTECTED_MARKERS)
    assert request.stage == "meta_skill"


def test_guidance_and_memory_lose_protected_markers():
    reply = SlowUpdateReply(guidance="  You check units.\n<!-- SLOW_UPDATE_END -->\n")
    assert guidance_from_reply(reply) == "You check units."
    assert memory_from_reply(MetaSkillReply(memory="\nPrefer short rules.<!-- APPENDIX_START -->")) == (
        "Prefer short rules.")


# --------------------------------------------------------------------------------------------------
# Reply models and templates


@pytest.mark.parametrize(
    "model, data",
    [
        (
            AnalystReply,
            {
                "diagnosis": [{"ids": ["a"], "kind": "k", "description": "d", "severity": 3}],
                "patch": {"reasoning": "r", "edits": [{"op": "append", "content": "c", "why": "x"}], "n": 1},
            },
        ),
        (MergeReply, {"reasoning": "r", "edits": [{"op": "append", "content": "c", "extra": 1}]}),
        (RankingReply, {"reasoning": "r", "selected_indices": [0], "confidence": "high"}),
        (SlowUpdateReply, {"reasoning": "r", "guidance": "g", "notes": []}),
        (MetaSkillReply, {"reasoning": "r", "memory": "m", "version": 2}),
    ],
)
def test_every_reply_model_ignores_unknown_keys(model, data):
    reply = model.model_validate({**data, "unexpected": {"nested": True}})
    assert isinstance(reply, ReplyModel)
    assert "unexpected" not in reply.model_dump()


def test_null_for_an_optional_key_means_its_default():
    reply = AnalystReply.model_validate(
        {
            "diagnosis": [],
            "execution_notes": None,
            "patch": {"reasoning": None, "edits": [{"op": "append", "target": None, "content": "c"}]},
        }
    )
    assert reply.execution_notes == [] and reply.patch.reasoning == "" and reply.patch.edits[0].target == ""


def test_every_optimizer_template_ships_and_an_unknown_one_is_an_error():
    assert all(optimizer_prompt(name.removeprefix("optimizer/")) for name in OPTIMIZER_PROMPTS)
    with pytest.raises(FileNotFoundError):
        optimizer_prompt("nope")
