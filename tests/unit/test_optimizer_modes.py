"""The optimizer's other modes: rewrite from suggestions, full rewrites, the autonomous budget, the deep
probe and the execution-notes appendix.

First the exact prompt formats, reply parsing, cuts and fallbacks of each pure stage; then the demo
world's scripted optimizer answering every new request; last, one small training loop per mode
without Prefect (the real runner, request builders, reply models and a strict gate), as
``test_demo_world`` runs patch mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from skillopt.benchmarks.demo.scripted import DROP_RATE, PROBE_INSTRUCTION, analyst, target
from skillopt.benchmarks.demo.world import CONVENTIONS, HARMFUL_RULES, RULES, USELESS_RULES, read_style
from skillopt.core.prompts import OPTIMIZER_PROMPTS, ReplyModel, optimizer_prompt
from skillopt.core.records import Diagnosis, ItemResult, Patch, Suggestion
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.appendix import merge_notes, with_execution_notes
from skillopt.optimizer.autonomous import BudgetReply, budget_request, decide_budget
from skillopt.optimizer.merge import MergeReply, merge_groups, merge_request, patch_from_merge
from skillopt.optimizer.probe import ProbeReply, pick_probe_items, probe_record, probe_request
from skillopt.optimizer.reflect import AnalystReply, analyst_request, patch_from_reply, split_and_batch
from skillopt.optimizer.rewrite import (
    FullRewriteAnalystReply,
    RewriteReply,
    SkillMergeReply,
    SuggestionAnalystReply,
    SuggestionMergeReply,
    concat_suggestions,
    finish_rewrite,
    keep_first_skill,
    merge_skills_request,
    merge_suggestions_request,
    patch_from_full_rewrite_reply,
    patch_from_skill_merge,
    patch_from_suggestion_merge,
    patch_from_suggestion_reply,
    rewrite_analyst_request,
    rewrite_as_edits,
    rewrite_request,
    suggestion_ranking_request,
)
from skillopt.optimizer.select import RankingReply, needs_ranking, ranking_request, select_edits, select_items
from skillopt.optimizer.step_buffer import StepBuffer, StepBufferEntry
from skillopt.optimizer.trajectory import format_trajectory
from skillopt.optimizer.update_modes import FullRewriteMode, Picked, SuggestionsMode, UpdateMode
from skillopt.skill.document import (
    APPENDIX,
    SLOW_UPDATE,
    Edit,
    apply_edits,
    extract_block,
    replace_block,
    target_text,
)
from tests.fakes.demo_world import INITIAL_SKILL, accuracy, ask, items, rollout

SKILL = "# Skill\n\n- Answer briefly.\n\n<!-- SLOW_UPDATE_START -->\nBe careful.\n<!-- SLOW_UPDATE_END -->\n"
PROTECTED_MARKERS = ("<!-- SLOW_UPDATE_START -->", "<!-- APPENDIX_START -->")
GUIDED_SKILL = replace_block(INITIAL_SKILL, SLOW_UPDATE, "You are graded on exact answers.")


def row(item_id: str, *, solved: bool = False, task_type: str = "lookup") -> ItemResult:
    return ItemResult(
        id=item_id, task_type=task_type, hard=float(solved), soft=float(solved),
        fail_reason="" if solved else "wrong", task_description=f"Question {item_id}?",
        trajectory=[{"type": "message", "role": "user", "content": f"Question {item_id}?"},
                    {"type": "message", "role": "assistant", "content": "<answer>x</answer>"},
                    {"type": "evaluation", "content": "[EVALUATION RESULT] expected: y"}],
    )


def suggestion(title: str, *, kind: str = "add_rule", source: str = "failure", support: int = 1,
               priority: int = 1) -> Suggestion:
    return Suggestion(type=kind, title=title, motivation=f"why {title}", instruction=f"do {title}",
                      priority=priority, support_count=support, source=source)


def headings(text: str) -> list[str]:
    return re.findall(r"^## .*$", text, re.M)


# --------------------------------------------------------------------------------------------------
# Request formats


def test_suggestion_analysts_state_a_suggestion_budget_and_full_rewrite_analysts_none():
    rows = [row("a"), row("b")]
    request = rewrite_analyst_request(mode="rewrite_from_suggestions", kind="failure", skill=SKILL, budget=3,
                                      rows=rows, step_buffer="BUFFER", meta_skill="MEMORY")
    text = request.last_user_text()
    assert text.startswith(f"## Current skill\n{SKILL.rstrip()}\n\n## Suggestion budget\n"
                           "You may propose at most 3 suggestions.\n\n## Step buffer\nBUFFER\n\n"
                           "## Optimizer memory\nMEMORY\n\n## Trajectories\n")
    assert format_trajectory(rows[0], index=1) + "\n\n" + format_trajectory(rows[1], index=2) in text
    assert request.stage == "analyst"
    assert request.tags == {"kind": "failure", "mode": "rewrite_from_suggestions", "item_ids": ["a", "b"]}

    full = rewrite_analyst_request(mode="full_rewrite_minibatch", kind="success", skill="", budget=3,
                                   rows=[row("c", solved=True)])
    assert full.last_user_text().startswith(
        "## Current skill\n(empty)\n\n## Trajectories\n### Trajectory 1: id `c`"
    )
    assert full.tags == {"kind": "success", "mode": "full_rewrite_minibatch", "item_ids": ["c"]}
    with pytest.raises(ValueError, match=">= 0"):
        rewrite_analyst_request(
            mode="rewrite_from_suggestions", kind="failure", skill="", budget=-1, rows=rows
        )


@pytest.mark.parametrize(
    "mode, keys",
    [
        (
            "rewrite_from_suggestions",
            (
                '"suggestions"',
                '"type"',
                '"title"',
                '"motivation"',
                '"instruction"',
                '"priority"',
                "add_rule",
                "remove_rule",
                "merge_rules",
                "reorganize",
                "compress",
                "clarify",
            ),
        ),
        ("full_rewrite_minibatch", ('"skill"',)),
    ],
)
def test_rewrite_analyst_system_messages_name_their_keys_and_keep_the_evidence_out(mode, keys):
    request = rewrite_analyst_request(mode=mode, kind="failure", skill=SKILL, budget=2, rows=[row("zz-item")],
                                      benchmark_guidance="Use kind evidence_miss.", use_appendix=True)
    system_text, user_text = request.system_text(), request.last_user_text()
    for key in (
        '"diagnosis"',
        '"ids"',
        '"kind"',
        '"description"',
        '"patch"',
        '"reasoning"',
        '"execution_notes"',
        *keys,
    ):
        assert key in system_text, key
    assert all(marker in system_text for marker in PROTECTED_MARKERS)
    assert "## Execution notes" in system_text
    assert system_text.rstrip().endswith("## Benchmark guidance\nUse kind evidence_miss.")
    assert "zz-item" not in system_text and "zz-item" in user_text
    success = rewrite_analyst_request(
        mode=mode, kind="success", skill="", budget=2, rows=[row("s", solved=True)], use_appendix=True
    )
    assert "## Execution notes" not in success.system_text()


def test_suggestion_merge_blocks_hold_json_that_round_trips():
    patches = [
        Patch(
            reasoning="first",
            source="failure",
            support=8,
            suggestions=[suggestion("units", support=2), suggestion("old", kind="remove_rule")],
        ),
        Patch(
            reasoning="second",
            source="success",
            support=3,
            suggestions=[suggestion("dates", source="success")],
        ),
    ]
    request = merge_suggestions_request(
        kind="final", skill=SKILL, patches=patches, level=2, meta_skill="MEMORY"
    )
    text = request.last_user_text()
    assert text.startswith(f"## Current skill\n{SKILL.rstrip()}\n\n## Optimizer memory\nMEMORY\n\n## Patches "
                           "to merge (level 2)\n### Patch 1 (source: failure, support: 8)\n```json\n")
    blocks = re.findall(
        r"^### Patch (\d+) \(source: (\w+), support: (\d+)\)\n```json\n(.*?)\n```$", text, re.M | re.S
    )
    assert [(i, s, n) for i, s, n, _ in blocks] == [("1", "failure", "8"), ("2", "success", "3")]
    first = json.loads(blocks[0][3])
    assert first["reasoning"] == "first"
    assert [Suggestion.model_validate(s) for s in first["suggestions"]] == patches[0].suggestions
    assert list(first["suggestions"][0]) == ["type", "title", "motivation", "instruction", "priority",
                                             "support_count", "source"]
    assert request.stage == "merge"
    assert request.tags == {"kind": "final", "mode": "rewrite_from_suggestions", "level": 2, "n_patches": 2}
    system_text = request.system_text()
    assert all(key in system_text for key in ('"reasoning"', '"suggestions"', '"support_count"', '"source"'))
    assert "keep the failure version" in system_text and all(m in system_text for m in PROTECTED_MARKERS)


def test_skill_merge_blocks_hold_whole_skills_in_a_fence_longer_than_any_inside():
    with_code = "# Skill\n\n```python\nprint(1)\n```\n"
    patches = [Patch(reasoning="added units\nand dates", source="failure", support=4, skill=with_code),
               Patch(source="success", support=2, skill=SKILL)]
    request = merge_skills_request(kind="failure", skill=SKILL, patches=patches, level=1)
    text = request.last_user_text()
    assert ("## Patches to merge (level 1)\n### Patch 1 (source: failure, support: 4)\n"
            "Reasoning: added units / and dates\n````markdown\n# Skill\n\n```python\nprint(1)\n```\n````\n\n"
            f"### Patch 2 (source: success, support: 2)\n```markdown\n{SKILL.rstrip()}\n```\n") in text
    assert request.tags == {"kind": "failure", "mode": "full_rewrite_minibatch", "level": 1, "n_patches": 2}
    assert '"skill"' in request.system_text() and all(m in request.system_text() for m in PROTECTED_MARKERS)


def test_suggestion_ranking_lines_parse_back_into_the_pool():
    pool = [suggestion("a", support=3), suggestion("b\nwith a line break", source="success"), suggestion("c")]
    request = suggestion_ranking_request(skill=SKILL, pool=pool, budget=2)
    text = request.last_user_text()
    lines = text.split("## Candidate suggestions (budget = 2)\n", 1)[1].rstrip("\n").split("\n")
    parsed = [re.fullmatch(r"\[(\d+)\] (\{.*\})", line) for line in lines]
    assert all(parsed) and [int(m.group(1)) for m in parsed] == [0, 1, 2]
    assert [Suggestion.model_validate(json.loads(m.group(2))) for m in parsed] == pool
    assert request.stage == "ranking" and request.tags == {
        "budget": 2,
        "n_pool": 3,
        "mode": "rewrite_from_suggestions",
    }
    assert '"selected_indices"' in request.system_text()
    assert all(marker in request.system_text() for marker in PROTECTED_MARKERS)


def test_rewrite_message_shows_the_skill_the_selected_suggestions_and_the_buffer():
    chosen = [suggestion("units", support=2), suggestion("old", kind="remove_rule")]
    request = rewrite_request(skill=SKILL, suggestions=chosen, step_buffer="BUFFER")
    lines = "\n".join(json.dumps({"type": s.type, "title": s.title, "motivation": s.motivation,
                                  "instruction": s.instruction, "priority": s.priority,
                                  "support_count": s.support_count, "source": s.source}) for s in chosen)
    assert request.last_user_text() == (
        f"## Current skill\n{SKILL.rstrip()}\n\n## Selected suggestions\n{lines}\n\n## Step buffer\nBUFFER\n"
    )
    assert request.stage == "rewrite" and request.tags == {"n_suggestions": 2}
    assert all(key in request.system_text() for key in ('"reasoning"', '"change_summary"', '"new_skill"'))
    assert all(marker in request.system_text() for marker in PROTECTED_MARKERS)
    assert headings(rewrite_request(skill="", suggestions=[]).last_user_text()) == [
        "## Current skill", "## Selected suggestions"]


def test_budget_message_shows_scores_buffer_memory_and_the_numbered_pool():
    pool = [Edit(op="append", content="- Use km.", support_count=2), Edit(op="delete", target="- Old.")]
    scores = {"current_score": 0.5, "best_score": 0.625, "rollout_hard": 0.25, "rollout_soft": 0.6,
              "n_fail": 6, "n_total": 8}
    request = budget_request(skill=SKILL, step_scores=scores, pool=pool, available=2, step_buffer="BUFFER",
                             meta_skill="MEMORY")
    assert request.last_user_text() == (
        f"## Current skill\n{SKILL.rstrip()}\n\n## Step scores\nSelection score: current 0.500, best 0.625\n"
        "This step's rollout: hard 0.250, soft 0.600; 6 of 8 items failed\n\n## Step buffer\nBUFFER\n\n"
        "## Optimizer memory\nMEMORY\n\n## Proposed edits (available = 2)\n"
        '[0] {"op": "append", "target": "", "content": "- Use km.", '
        '"support_count": 2, "source": "failure"}\n'
        '[1] {"op": "delete", "target": "- Old.", "content": "", "support_count": 1, "source": "failure"}\n'
    )
    assert request.stage == "lr" and request.tags == {"available": 2, "n_pool": 2}
    system_text = request.system_text()
    assert all(
        key in system_text for key in ('"learning_rate"', '"reasoning"', '"confidence"', '"risk_notes"')
    )
    assert "no default size" in system_text and all(marker in system_text for marker in PROTECTED_MARKERS)
    suggestions = budget_request(skill="", step_scores={"current_score": 0, "best_score": 0},
                                 pool=[suggestion("a")], available=1).last_user_text()
    assert "hard n/a, soft n/a; 0 of 0 items failed" in suggestions
    assert '## Proposed suggestions (available = 1)\n[0] {"type": "add_rule"' in suggestions
    with pytest.raises(ValidationError, match="rollout_hrad"):
        budget_request(
            skill="",
            step_scores={"current_score": 0, "best_score": 0, "rollout_hrad": 1},
            pool=[],
            available=0,
        )


def test_probe_message_has_no_budget_and_asks_for_a_readout_without_leaks():
    rows = [row("f1"), row("s1", solved=True)]
    request = probe_request(skill=SKILL, rows=rows, meta_skill="MEMORY")
    assert headings(request.last_user_text()) == [
        "## Current skill",
        "## Optimizer memory",
        "## Trajectories",
    ]
    assert format_trajectory(rows[1], index=2) in request.last_user_text()
    assert request.stage == "deep_probe" and request.tags == {"item_ids": ["f1", "s1"]}
    system_text = request.system_text()
    assert '"probe_instruction"' in system_text and '"reasoning"' in system_text
    assert "## Training readout" in system_text and "leak" in system_text
    assert all(marker in system_text for marker in PROTECTED_MARKERS)


def test_every_new_template_is_hashed_with_the_others():
    for name in ("analyst_suggestions", "analyst_full_rewrite", "merge_suggestions", "merge_skills",
                 "ranking_suggestions", "rewrite", "autonomous_budget", "deep_probe"):
        assert f"optimizer/{name}" in OPTIMIZER_PROMPTS
        assert "Reply with exactly one JSON object" in optimizer_prompt(name)


# --------------------------------------------------------------------------------------------------
# Replies, cuts and fallbacks


@pytest.mark.parametrize("model, data", [
    (SuggestionAnalystReply, {"diagnosis": [{"ids": ["a"], "extra": 1}],
                              "patch": {"suggestions": [{"type": "clarify", "why": "x"}], "n": 2}}),
    (FullRewriteAnalystReply, {"diagnosis": [], "patch": {"skill": "# S", "diff": "?"}}),
    (SuggestionMergeReply, {"suggestions": [{"type": "compress", "support_count": 2, "weight": 1}]}),
    (SkillMergeReply, {"skill": "# S", "sources": [1, 2]}),
    (RewriteReply, {"change_summary": [], "new_skill": "# S", "diff": ""}),
    (BudgetReply, {"learning_rate": 2, "alternatives": [1, 3]}),
    (ProbeReply, {"probe_instruction": "Say why.", "target": "all"}),
])
def test_every_new_reply_model_ignores_unknown_keys(model, data):
    reply = model.model_validate({**data, "unexpected": {"nested": True}})
    assert isinstance(reply, ReplyModel) and "unexpected" not in reply.model_dump()


def test_suggestion_patch_keeps_at_most_budget_suggestions_of_a_known_type():
    reply = SuggestionAnalystReply.model_validate({
        "diagnosis": [{"ids": ["a", "zzz"], "kind": "rule_missing", "description": "no unit rule"}],
        "patch": {"reasoning": " why ", "suggestions": [
            {"type": "Add rule", "title": "units", "instruction": "add it", "priority": "high"},
            {"type": "rewrite_everything", "title": "nope"},
            {"type": "remove-rule", "title": "old", "priority": 0},
            {"type": "clarify", "title": "cut by the budget"},
        ]},
        "execution_notes": ["Use km.", "Use km.", " "],
    })
    patch = patch_from_suggestion_reply(reply, kind="failure", rows=[row("a"), row("b")], budget=2)
    assert [(s.type, s.title, s.priority, s.source, s.support_count) for s in patch.suggestions] == [
        ("add_rule", "units", 1, "failure", 1), ("remove_rule", "old", 1, "failure", 1)]
    assert patch.reasoning == "why" and patch.support == 2 and patch.edits == [] and patch.skill is None
    assert patch.diagnosis == [Diagnosis(ids=["a"], kind="rule_missing", description="no unit rule")]
    assert patch.execution_notes == ["Use km."]
    assert patch_from_suggestion_reply(reply, kind="success", rows=[], budget=0).suggestions == []


def test_full_rewrite_reply_becomes_a_skill_patch_and_an_empty_skill_a_fallback():
    fenced = FullRewriteAnalystReply.model_validate(
        {
            "diagnosis": [{"ids": ["a"], "kind": "rule_missing"}],
            "patch": {"reasoning": "r", "skill": "```markdown\n# New\n\n- Use km.\n```"},
            "execution_notes": ["n"],
        }
    )
    patch = patch_from_full_rewrite_reply(fenced, kind="failure", rows=[row("a")])
    assert patch.skill == "# New\n\n- Use km.\n" and patch.fallback is None and patch.support == 1
    blocks_only = FullRewriteAnalystReply.model_validate(
        {
            "diagnosis": [{"ids": ["a"]}],
            "patch": {"skill": "\n<!-- SLOW_UPDATE_START -->\nx\n<!-- SLOW_UPDATE_END -->"},
        }
    )
    empty = patch_from_full_rewrite_reply(blocks_only, kind="success", rows=[row("a")])
    assert empty.skill is None and empty.fallback == "analyst returned an empty skill"
    assert empty.source == "success" and empty.diagnosis[0].ids == ["a"]


def test_suggestion_merge_clamps_support_and_labels_the_tree():
    inputs = [Patch(source="success", support=4, suggestions=[suggestion("a", source="success")],
                    diagnosis=[Diagnosis(ids=["x"])], execution_notes=["n1"]),
              Patch(source="success", support=3, suggestions=[suggestion("b", source="success")],
                    execution_notes=["n1", "n2"])]
    reply = SuggestionMergeReply.model_validate({"reasoning": "merged", "suggestions": [
        {"type": "merge_rules", "title": "a+b", "support_count": 99, "source": "failure"},
        {"type": "unknown", "title": "dropped"},
        {"type": "clarify", "title": "c", "support_count": None, "source": None, "priority": 3},
    ]})
    patch = patch_from_suggestion_merge(reply, kind="success", level=1, patches=inputs)
    assert [(s.type, s.support_count, s.source, s.priority) for s in patch.suggestions] == [
        ("merge_rules", 2, "success", 1), ("clarify", 1, "success", 3)]
    assert (patch.support, patch.merge_level, patch.source) == (7, 1, "success")
    assert patch.diagnosis == [Diagnosis(ids=["x"])] and patch.execution_notes == ["n1", "n2"]
    final = patch_from_suggestion_merge(reply, kind="final", level=2, patches=inputs)
    assert [s.source for s in final.suggestions] == ["failure", "failure"] and final.source == "failure"


def test_a_failed_suggestion_merge_concatenates_failures_first():
    inputs = [
        Patch(source="success", support=2, suggestions=[suggestion("s1", source="success")], merge_level=1),
        Patch(source="failure", support=5, suggestions=[suggestion("f1"), suggestion("f2")]),
    ]
    patch = concat_suggestions(inputs, reason="merge failed: timeout")
    assert [s.title for s in patch.suggestions] == ["f1", "f2", "s1"]
    assert (patch.fallback, patch.support, patch.merge_level, patch.source) == ("merge failed: timeout", 7, 1,
                                                                                "failure")


def test_skill_merge_keeps_the_merged_document_or_falls_back_to_the_first_failure_skill():
    inputs = [
        Patch(source="success", support=2, skill="# Success\n"),
        Patch(source="failure", support=3, skill=None, fallback="empty"),
        Patch(source="failure", support=1, skill="# Failure\n", reasoning="fix", merge_level=1),
    ]
    merged = patch_from_skill_merge(
        SkillMergeReply(reasoning="r", skill="# Both\n\n- a\n"), kind="final", level=2, patches=inputs
    )
    assert (merged.skill, merged.merge_level, merged.support, merged.fallback) == (
        "# Both\n\n- a\n",
        2,
        6,
        None,
    )
    blank = patch_from_skill_merge(SkillMergeReply(skill="  "), kind="final", level=2, patches=inputs)
    assert (blank.skill, blank.reasoning, blank.fallback) == (
        "# Failure\n",
        "fix",
        "skill merge returned an empty skill",
    )
    assert keep_first_skill(inputs[:1], reason="x").skill == "# Success\n"
    nothing = keep_first_skill(inputs[1:2], reason="merge failed")
    assert nothing.skill is None and nothing.fallback == "merge failed"


def test_select_items_ranks_any_pool_and_select_edits_is_unchanged():
    pool = [suggestion(str(i)) for i in range(5)]
    selection = select_items(pool, 2, RankingReply(selected_indices=[3, 3, 9, 1, 0]))
    assert [s.title for s in selection.items] == ["3", "1"] and selection.ignored_indices == [3, 9]
    assert select_items(pool, 2, None).fallback == "ranking failed: kept the first 2"
    assert select_items(pool, 9, None).items == pool and select_items(pool, 0, None).items == []
    edits = [Edit(op="append", content=str(i)) for i in range(3)]
    assert select_edits(edits, 1, RankingReply(selected_indices=[2])).edits == [edits[2]]


def test_a_rewrite_reply_needs_a_whole_skill_and_loses_a_wrapping_fence():
    reply = RewriteReply.model_validate(
        {"change_summary": "Added units.", "new_skill": "```\n# S\n\n- a\n```\n"}
    )
    assert reply.new_skill == "# S\n\n- a\n" and reply.change_summary == ["Added units."]
    kept = RewriteReply.model_validate(
        {"change_summary": [], "new_skill": "```\ncode\n```\ntext\n```\nmore\n```"}
    )
    assert kept.new_skill.startswith("```\ncode")  # not one fence around the whole document
    for bad in ({"change_summary": [], "new_skill": " \n"}, {"new_skill": "# S"}):
        with pytest.raises(ValidationError):
            RewriteReply.model_validate(bad)


def test_finish_rewrite_restores_a_dropped_protected_block_and_reports_it():
    current = replace_block(SKILL, APPENDIX, "- Check units.")
    candidate, restored = finish_rewrite(current, "# Skill\n\n- Answer briefly.\n- Use km.\n")
    assert restored
    assert extract_block(candidate, SLOW_UPDATE) == "Be careful." and extract_block(candidate, APPENDIX) == (
        "- Check units.")
    assert candidate.startswith("# Skill\n\n- Answer briefly.\n- Use km.\n\n<!-- SLOW_UPDATE_START -->")
    intact, restored = finish_rewrite(current, current.replace("- Answer briefly.", "- Answer in one line."))
    assert not restored and "- Answer in one line." in intact
    altered, restored = finish_rewrite(current, current.replace("Be careful.", "Be bold."))
    assert restored and extract_block(altered, SLOW_UPDATE) == "Be careful."
    with pytest.raises(ValueError, match="empty"):
        finish_rewrite(current, "<!-- SLOW_UPDATE_START -->\nx\n<!-- SLOW_UPDATE_END -->")


def test_rewrite_as_edits_describes_the_line_changes_for_the_step_buffer():
    current = "# Skill\n\n- a\n- b\n- c\n\n<!-- SLOW_UPDATE_START -->\ng\n<!-- SLOW_UPDATE_END -->\n"
    candidate = "# Skill\n\n- a\n- new\n- c\n- d\n\n<!-- SLOW_UPDATE_START -->\ng\n<!-- SLOW_UPDATE_END -->\n"
    edits = rewrite_as_edits(current, candidate)
    assert [(e.op, e.target, e.content) for e in edits] == [
        ("replace", "- b", "- new"),
        ("insert_after", "- c", "- d"),
    ]
    assert apply_edits(current, edits)[0] == candidate
    assert [(e.op, e.target, e.content) for e in rewrite_as_edits("- c\n", "- b\n- c\n")] == [
        ("replace", "- c", "- b\n- c")]
    assert [(e.op, e.content) for e in rewrite_as_edits("", "# New\n")] == [("append", "# New")]
    assert rewrite_as_edits(current, current) == []


# --------------------------------------------------------------------------------------------------
# Autonomous budget, deep probe, appendix


def test_decide_budget_clamps_to_what_is_available_and_records_the_answer():
    reply = BudgetReply.model_validate({"learning_rate": "9", "reasoning": " many ", "confidence": "High",
                                        "risk_notes": "may overfit"})
    decision = decide_budget(reply, 3)
    assert decision == {"learning_rate": 3, "requested": 9, "available": 3, "reasoning": "many",
                        "confidence": "high", "risk_notes": ["may overfit"], "fallback": None}
    assert decide_budget(BudgetReply(learning_rate=-2), 3)["learning_rate"] == 0
    assert decide_budget(BudgetReply(learning_rate=2), 3)["learning_rate"] == 2
    assert json.loads(json.dumps(decision)) == decision


def test_an_unusable_budget_answer_means_zero_edits_with_a_recorded_fallback():
    decision = decide_budget(None, 4)
    assert decision["learning_rate"] == 0 and decision["requested"] is None
    assert "no usable answer" in decision["fallback"]
    for bad in ({"learning_rate": True}, {"learning_rate": 2.5}, {"learning_rate": "three"},
                {"learning_rate": 1, "confidence": "sure"}, {"reasoning": "no number"}):
        with pytest.raises(ValidationError):
            BudgetReply.model_validate(bad)
    with pytest.raises(ValueError):
        decide_budget(None, -1)


def test_probe_items_are_one_per_task_type_first_then_the_rest_by_id():
    rows = [row("f5", task_type="city"), row("f1", task_type="date"), row("f2", task_type="date"),
            row("f3", task_type="city"), row("f4", task_type="count"), row("f1", task_type="date"),
            row("s2", solved=True, task_type="date"), row("s1", solved=True, task_type="date"),
            row("s3", solved=True, task_type="city")]
    picked = pick_probe_items(rows, failures=4, successes=2)
    assert [r.id for r in picked] == ["f1", "f3", "f4", "f2", "s1", "s3"]
    assert [r.id for r in pick_probe_items(list(reversed(rows)), failures=4, successes=2)] == [
        r.id for r in picked
    ]
    assert [r.id for r in pick_probe_items(rows, failures=2, successes=0)] == ["f1", "f3"]
    assert pick_probe_items(rows, failures=0, successes=0) == []
    with pytest.raises(ValueError):
        pick_probe_items(rows, failures=-1, successes=0)
    assert probe_record("Say why.", picked[:2]) == {
        "instruction": "Say why.",
        "item_ids": ["f1", "f3"],
        "n_fail": 2,
        "fallback": None,
    }


def test_a_probe_instruction_is_stripped_and_never_blank():
    assert ProbeReply(probe_instruction="  Say why.<!-- APPENDIX_END -->\n").probe_instruction == "Say why."
    with pytest.raises(ValidationError):
        ProbeReply(probe_instruction=" \n")


def test_merge_notes_dedupes_ignoring_case_and_whitespace_and_keeps_the_newest_under_the_cap():
    existing = "- Check the units.\n* Keep dates in ISO form.\n"
    merged = merge_notes(existing, ["check  THE units.", "- Name the rule you apply\nbefore answering.", " "])
    assert merged == ("- Check the units.\n- Keep dates in ISO form.\n"
                      "- Name the rule you apply / before answering.")
    capped = merge_notes(merged, [f"Note {i}." for i in range(3)], max_notes=4)
    assert capped.splitlines() == ["- Name the rule you apply / before answering.", "- Note 0.", "- Note 1.",
                                   "- Note 2."]
    assert merge_notes(None, []) == "" and merge_notes(None, ["a"], max_notes=0) == ""
    with pytest.raises(ValueError):
        merge_notes(None, ["a"], max_notes=-1)


def test_execution_notes_fill_only_the_appendix_block():
    skill = with_execution_notes(SKILL, ["Use km.", "<!-- APPENDIX_END -->Use km."])
    assert extract_block(skill, APPENDIX) == "- Use km."
    assert skill.startswith(SKILL.rstrip()) and extract_block(skill, SLOW_UPDATE) == "Be careful."
    assert with_execution_notes(skill, ["use KM."]) == skill
    assert (
        with_execution_notes(SKILL, []) == SKILL
        and extract_block(with_execution_notes(SKILL, []), APPENDIX) is None
    )


# --------------------------------------------------------------------------------------------------
# The demo world's scripted optimizer


def demo_rows(tmp_path: Path, skill: str = GUIDED_SKILL, n: int = 10) -> list[ItemResult]:
    return rollout(items("train", tmp_path)[:n], skill)


def test_demo_handlers_answer_every_new_request_with_a_valid_reply(tmp_path):
    rows = demo_rows(tmp_path)
    failures = [r for r in rows if r.failed][:4]
    for mode, schema in (("rewrite_from_suggestions", SuggestionAnalystReply),
                         ("full_rewrite_minibatch", FullRewriteAnalystReply)):
        for kind, batch in (("failure", failures), ("success", [r for r in rows if not r.failed])):
            ask(
                rewrite_analyst_request(mode=mode, kind=kind, skill=GUIDED_SKILL, budget=3, rows=batch),
                schema,
            )
    patches = [Patch(source="failure", support=2, suggestions=[suggestion("a")], skill=GUIDED_SKILL)] * 2
    ask(
        merge_suggestions_request(kind="failure", skill=GUIDED_SKILL, patches=patches, level=1),
        SuggestionMergeReply,
    )
    ask(merge_skills_request(kind="final", skill=GUIDED_SKILL, patches=patches, level=2), SkillMergeReply)
    ask(
        suggestion_ranking_request(skill=GUIDED_SKILL, pool=[suggestion("a"), suggestion("b")], budget=1),
        RankingReply,
    )
    ask(rewrite_request(skill=GUIDED_SKILL, suggestions=[suggestion("a")]), RewriteReply)
    ask(budget_request(skill=GUIDED_SKILL, step_scores={"current_score": 0.1, "best_score": 0.1}, pool=[],
                       available=0), BudgetReply)
    assert (
        ask(probe_request(skill=GUIDED_SKILL, rows=failures), ProbeReply).probe_instruction
        == PROBE_INSTRUCTION
    )


def test_demo_suggestion_analysts_propose_rules_for_missing_conventions_within_the_budget(tmp_path):
    failures = [r for r in demo_rows(tmp_path) if r.failed][:4]
    request = rewrite_analyst_request(
        mode="rewrite_from_suggestions", kind="failure", skill=GUIDED_SKILL, budget=2, rows=failures
    )
    reply = ask(request, SuggestionAnalystReply)
    assert len(reply.patch.suggestions) == 2 and {s.type for s in reply.patch.suggestions} == {"add_rule"}
    assert all(any(rule.stated_by(s.instruction) for rule in CONVENTIONS) for s in reply.patch.suggestions)
    assert reply.diagnosis and {d.kind for d in reply.diagnosis} == {"rule_missing"}
    # Without the mode tag (as over HTTP) the demo reads the mode from the message.
    untagged = request.model_copy(update={"tags": {"kind": "failure"}})
    assert SuggestionAnalystReply.model_validate(analyst(untagged, 7)) == reply


def test_demo_full_rewrites_add_the_rules_and_sometimes_drop_the_protected_blocks(tmp_path):
    failures = [r for r in demo_rows(tmp_path) if r.failed][:4]
    first = ask(
        rewrite_analyst_request(
            mode="full_rewrite_minibatch", kind="failure", skill=GUIDED_SKILL, budget=3, rows=failures
        ),
        FullRewriteAnalystReply,
    )
    assert extract_block(first.patch.skill, SLOW_UPDATE) is None  # the first step always drops them
    assert read_style(first.patch.skill).positions and first.patch.skill.startswith(INITIAL_SKILL.rstrip())
    later_skill = replace_block(INITIAL_SKILL + RULES["digits"].phrasings[0], SLOW_UPDATE, "Guidance.")
    dropped = []
    for seed in range(60):
        request = rewrite_analyst_request(mode="full_rewrite_minibatch", kind="failure", skill=later_skill,
                                          budget=3, rows=failures)
        reply = FullRewriteAnalystReply.model_validate(analyst(request, seed))
        dropped.append(extract_block(reply.patch.skill, SLOW_UPDATE) is None)
    assert 0 < sum(dropped) < len(dropped) and abs(sum(dropped) / len(dropped) - DROP_RATE) < 0.15


def test_demo_merges_dedupe_suggestions_and_unite_skill_lines():
    upper, lower, km = (RULES["uppercase_city"].phrasings[0], RULES["lowercase"].phrasings[0],
                        RULES["unit_km"].phrasings[0])

    def adding(line: str, **kw: Any) -> Suggestion:
        return Suggestion(type="add_rule", title=line, instruction=f'Add the rule line "{line}"', **kw)

    patches = [
        Patch(source="success", support=1, suggestions=[adding(USELESS_RULES[0], source="success")]),
        Patch(source="failure", support=3, suggestions=[adding(upper, support_count=2), adding(lower)]),
        Patch(source="failure", support=2, suggestions=[adding(upper, priority=2)]),
    ]
    reply = ask(merge_suggestions_request(kind="final", skill=INITIAL_SKILL, patches=patches, level=2),
                SuggestionMergeReply)
    assert [(s.title, s.support_count, s.source, s.priority) for s in reply.suggestions] == [
        # the weaker contradicting rule is dropped
        (upper, 3, "failure", 1), (USELESS_RULES[0], 1, "success", 1)]

    skills = [
        Patch(source="success", support=1, skill=f"{INITIAL_SKILL}{lower}\n"),
        Patch(
            source="failure",
            support=2,
            skill=replace_block(f"{INITIAL_SKILL}{upper}\n{km}\n", SLOW_UPDATE, "G."),
        ),
        Patch(source="failure", support=2, skill=f"{INITIAL_SKILL}{upper}\n"),
    ]
    merged = ask(
        merge_skills_request(kind="final", skill=INITIAL_SKILL, patches=skills, level=2), SkillMergeReply
    )
    assert merged.skill == replace_block(f"{INITIAL_SKILL}{upper}\n{km}\n", SLOW_UPDATE, "G.")


def test_demo_ranking_of_suggestions_prefers_support_then_priority():
    pool = [suggestion("a", support=1), suggestion("b", support=3, priority=2), suggestion("c", support=3),
            suggestion("d", support=1, priority=1)]
    assert ask(suggestion_ranking_request(skill="", pool=pool, budget=3), RankingReply).selected_indices == [
        2,
        1,
        0,
    ]


def test_demo_rewrite_applies_the_suggestions_and_summarises_the_changes():
    lower, upper = RULES["lowercase"].phrasings[0], RULES["uppercase_city"].phrasings[0]
    skill = replace_block(f"{INITIAL_SKILL}{lower}\n", SLOW_UPDATE, "Guidance.")
    chosen = [Suggestion(type="add_rule", title="upper", instruction=f'Add the rule line "{upper}"'),
              Suggestion(type="remove_rule", title="lower", instruction=f'Remove the line "{lower}"'),
              Suggestion(type="compress", title="shorter", instruction="Say it in fewer words.")]
    reply = ask(rewrite_request(skill=skill, suggestions=chosen), RewriteReply)
    assert reply.change_summary[:2] == [f"Added the rule: {upper[2:]}", f"Removed the rule: {lower[2:]}"]
    assert "No change for compress" in reply.change_summary[2]
    candidate, restored = finish_rewrite(skill, reply.new_skill)
    assert (
        upper in candidate and lower not in candidate and extract_block(candidate, SLOW_UPDATE) == "Guidance."
    )
    assert restored == (extract_block(reply.new_skill, SLOW_UPDATE) is None)


def test_demo_budget_counts_the_proposals_for_distinct_missing_conventions():
    km, upper = RULES["unit_km"].phrasings, RULES["uppercase_city"].phrasings[0]
    pool = [Edit(op="append", content=km[0], support_count=3), Edit(op="append", content=km[1]),
            Edit(op="append", content=USELESS_RULES[0]), Edit(op="append", content=upper),
            Edit(op="append", content=HARMFUL_RULES[1].phrasings[0])]
    scores = {"current_score": 0.2, "best_score": 0.2, "rollout_hard": 0.25, "rollout_soft": 0.5, "n_fail": 6,
              "n_total": 8}
    reply = ask(budget_request(skill=f"{INITIAL_SKILL}{upper}\n", step_scores=scores, pool=pool, available=5),
                BudgetReply)
    assert (reply.learning_rate, reply.confidence) == (1, "high")
    assert len(reply.risk_notes) == 2 and "unit_km" in reply.reasoning
    assert decide_budget(reply, 5)["learning_rate"] == 1


def test_the_demo_target_writes_a_readout_under_the_probe_without_changing_its_answer(tmp_path):
    train = items("train", tmp_path)[:10]
    skill = f"{INITIAL_SKILL}{RULES['unit_km'].phrasings[0]}\n"
    plain, probed = rollout(train, skill), rollout(train, skill, probe_instruction=PROBE_INSTRUCTION)
    assert [r.predicted_answer for r in probed] == [r.predicted_answer for r in plain]
    assert [r.hard for r in probed] == [r.hard for r in plain]
    replies = [r.trajectory[-2]["content"] for r in probed]
    assert all("\nReadout: conventions applied: " in reply for reply in replies)
    assert any(
        "Readout: conventions applied: unit_km" in reply
        for reply, r in zip(replies, probed, strict=True)
        if r.task_type == "distance"
    )
    assert not any("Readout:" in r.trajectory[-2]["content"] for r in plain)
    request = ChatRequest(
        messages=[system("s"), user("What is the capital of Peru?\n\n## Training readout\nSay.")],
        stage="rollout",
    )
    assert (
        target(request, 0)
        == "the capital of Peru.\nReadout: conventions applied: none\n<answer>Lima</answer>"
    )


def test_demo_analysts_cite_the_probe_readout_and_return_execution_notes_for_ignored_rules(tmp_path):
    skill = f"{INITIAL_SKILL}{RULES['unit_km'].phrasings[0]}\n"
    probed = [r for r in rollout(items("train", tmp_path)[:10], skill, probe_instruction=PROBE_INSTRUCTION)
              if r.failed]
    reply = ask(analyst_request(kind="failure", skill=skill, budget=4, rows=probed), AnalystReply)
    assert any("The probe readout says: conventions applied:" in d.description for d in reply.diagnosis)
    # A stated, unopposed rule that answers still break is "not followed": a note, not a new rule.
    stated = f"{skill}{RULES['uppercase_city'].phrasings[0]}\n"
    assert any(r.task_type == "city" for r in probed)
    noted = ask(analyst_request(kind="failure", skill=stated, budget=4, rows=probed), AnalystReply)
    assert noted.execution_notes == ["Apply the stated rule: city names are written in uppercase."]
    assert extract_block(with_execution_notes(stated, noted.execution_notes), APPENDIX) == (
        "- Apply the stated rule: city names are written in uppercase.")


# --------------------------------------------------------------------------------------------------
# Training without Prefect, one loop per mode


@dataclass
class Proposal:
    """What one step proposes: the candidate skill and what the record and the step buffer keep."""

    candidate: str
    rejected_as_edits: list[Edit]
    restored: bool = False
    change_summary: list[str] = field(default_factory=list)
    budget_decision: dict[str, Any] | None = None


@dataclass
class Run:
    baseline: float
    score: float
    skill: str
    decisions: list[str] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)


Step = Callable[[str, list[ItemResult], int, StepBuffer], Proposal | None]


def train(tmp_path: Path, step: Step, *, epochs: int = 2) -> Run:
    """Batches of 8 over the 24 train items per epoch, a strict gate on the 12 val items."""
    train_items, val = items("train", tmp_path), items("val", tmp_path)
    skill = GUIDED_SKILL
    baseline = current = accuracy(rollout(val, skill))
    run = Run(baseline, current, skill)
    for epoch in range(1, epochs + 1):
        buffer = StepBuffer()
        for index, start in enumerate(range(0, len(train_items), 8), 1):
            batch = rollout(train_items[start:start + 8], skill)
            proposal = step(skill, batch, 100 * epoch + index, buffer)
            if proposal is None:
                run.decisions.append("skip")
                continue
            run.proposals.append(proposal)
            score = accuracy(rollout(val, proposal.candidate))
            accepted = score > current
            run.decisions.append("accept" if accepted else "reject")
            buffer.add(
                StepBufferEntry(
                    step=index,
                    decision=run.decisions[-1],
                    n_fail=sum(r.failed for r in batch),
                    n_total=len(batch),
                    score_before=current,
                    score_after=score,
                    rejected_edits=[] if accepted else proposal.rejected_as_edits,
                )
            )
            if accepted:
                skill, current = proposal.candidate, score
    run.score, run.skill = current, skill
    return run


def reflect(skill: str, batch: list[ItemResult], seed: int, analyse: Callable[[str, list[ItemResult]], Patch],
            extra: list[list[ItemResult]] = ()) -> dict[str, list[Patch]]:
    """Patches per tree: failure and success minibatches of 4 (and any ``extra`` failure minibatches)."""
    failures, successes = split_and_batch(batch, size=4, seed=seed, failure_only=False)
    trees = {"failure": [analyse("failure", rows) for rows in [*failures, *extra]],
             "success": [analyse("success", rows) for rows in successes]}
    return {kind: patches for kind, patches in trees.items() if patches}


def aggregate(trees: dict[str, list[Patch]], skill: str, build: Callable[..., ChatRequest],
              schema: type[BaseModel], convert: Callable[..., Patch]) -> Patch | None:
    """Hierarchical merge (fan-in 2) of each tree, then the final merge of the two roots."""
    roots = []
    for kind, patches in trees.items():
        level = 1
        while len(patches) > 1:
            patches = [
                convert(
                    ask(build(kind=kind, skill=skill, patches=group, level=level), schema),
                    kind=kind,
                    level=level,
                    patches=group,
                )
                if len(group) > 1
                else group[0]
                for group in merge_groups(patches, 2)
            ]
            level += 1
        roots.append(patches[0])
    if len(roots) < 2:
        return roots[0] if roots else None
    level = max(root.merge_level for root in roots) + 1
    return convert(ask(build(kind="final", skill=skill, patches=roots, level=level), schema), kind="final",
                   level=level, patches=roots)


def patch_analyst(skill: str, buffer: StepBuffer) -> Callable[[str, list[ItemResult]], Patch]:
    """Patch-mode analysts with a budget of 4 edits."""
    def analyse(kind: str, rows: list[ItemResult]) -> Patch:
        request = analyst_request(kind=kind, skill=skill, budget=4, rows=rows, step_buffer=buffer.format())
        return patch_from_reply(ask(request, AnalystReply), kind=kind, rows=rows, budget=4)

    return analyse


def select(skill: str, pool: list[Edit], budget: int) -> list[Edit]:
    """At most ``budget`` edits of ``pool``, with a ranking call when there are more."""
    ranked = ask(ranking_request(skill=skill, pool=pool, budget=budget), RankingReply) \
        if needs_ranking(pool, budget) else None
    return select_edits(pool, budget, ranked).edits


def assert_it_learned(run: Run) -> None:
    assert run.baseline < 0.2
    assert run.score >= 0.9, (run.decisions, run.skill)
    assert sum(read_style(target_text(run.skill)).states(rule.name) for rule in CONVENTIONS) >= 6
    assert extract_block(run.skill, SLOW_UPDATE) == extract_block(GUIDED_SKILL, SLOW_UPDATE)


def mode_step(mode: UpdateMode, budget: int) -> Step:
    """One step of ``mode`` through its strategy: analysts, hierarchical merge, the budget's ranking when
    the mode has one, and the candidate (the rewrite call answering the selected suggestions)."""

    def step(skill: str, batch: list[ItemResult], seed: int, buffer: StepBuffer) -> Proposal | None:
        def analyse(kind: str, rows: list[ItemResult]) -> Patch:
            request = mode.analyst_request(kind=kind, skill=skill, budget=budget, rows=rows,
                                           step_buffer=buffer.format())
            return mode.patch_from_analyst(ask(request, mode.analyst_reply), kind=kind, rows=rows,
                                           budget=budget)

        def rewrite(suggestions: list[Suggestion]) -> RewriteReply:
            request = rewrite_request(skill=skill, suggestions=suggestions, step_buffer=buffer.format())
            return ask(request, RewriteReply)

        root = aggregate(reflect(skill, batch, seed, analyse), skill,
                         partial(mode.merge_request, meta_skill=""), mode.merge_reply, mode.patch_from_merge)
        if root is None or mode.nothing_to_apply(root):
            return None
        picked = Picked()
        if mode.budgeted:
            pool = mode.pool(root)
            ranked = ask(mode.ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=""),
                         RankingReply) if needs_ranking(pool, budget) else None
            picked = mode.pick(pool, budget, ranked)
            if not picked.count:
                return None
        update = mode.candidate(skill, root, picked, rewrite=rewrite)
        if update is None:
            return None
        return Proposal(update.candidate, mode.proposed_edits(skill, picked, update),
                        update.protected_restored, update.change_summary)

    return step


def test_rewrite_from_suggestions_learns_the_conventions_through_the_rewrite_call(tmp_path):
    step = mode_step(SuggestionsMode(), budget=3)

    run = train(tmp_path, step)
    assert_it_learned(run)
    assert "accept" in run.decisions and "reject" in run.decisions  # the noise suggestions give the gate work
    assert all(p.change_summary for p in run.proposals)
    assert any(p.restored for p in run.proposals)


def test_full_rewrite_minibatch_learns_the_conventions_from_whole_skills_and_restores_the_blocks(tmp_path):
    step = mode_step(FullRewriteMode(), budget=0)

    run = train(tmp_path, step)
    assert_it_learned(run)
    assert run.decisions[0] == "accept"  # one whole-skill rewrite fixes most conventions at once
    assert run.proposals[0].restored  # the first rewrite dropped the slow-update block


def test_the_autonomous_budget_applies_as_many_edits_as_the_evidence_supports(tmp_path):
    def step(skill: str, batch: list[ItemResult], seed: int, buffer: StepBuffer) -> Proposal | None:
        root = aggregate(
            reflect(skill, batch, seed, patch_analyst(skill, buffer)),
            skill,
            merge_request,
            MergeReply,
            patch_from_merge,
        )
        pool = root.edits if root else []
        scores = {
            "current_score": accuracy(rollout(items("val", tmp_path), skill)),
            "best_score": 0.0,
            "rollout_hard": accuracy(batch),
            "n_fail": sum(r.failed for r in batch),
            "n_total": len(batch),
        }
        request = budget_request(skill=skill, step_scores=scores, pool=pool, available=len(pool),
                                 step_buffer=buffer.format())
        decision = decide_budget(ask(request, BudgetReply), len(pool))
        edits = select(skill, pool, decision["learning_rate"])
        if not edits:
            return None
        return Proposal(apply_edits(skill, edits)[0], edits, budget_decision=decision)

    run = train(tmp_path, step)
    assert_it_learned(run)
    decisions = [p.budget_decision for p in run.proposals if p.budget_decision]
    assert all(d["fallback"] is None and 0 < d["learning_rate"] <= d["available"] for d in decisions)
    assert len({d["learning_rate"] for d in decisions}) > 1  # sized by the evidence, not a fixed schedule
    assert run.decisions[-1] == "skip"  # nothing left to fix: the optimizer chose 0 edits


def test_deep_probe_readouts_become_extra_minibatches_and_training_still_learns(tmp_path):
    probes: list[dict[str, Any]] = []

    def step(skill: str, batch: list[ItemResult], seed: int, buffer: StepBuffer) -> Proposal | None:
        picked = pick_probe_items(batch, failures=4, successes=2)
        instruction = ask(probe_request(skill=skill, rows=picked, step_buffer=buffer.format()),
                          ProbeReply).probe_instruction
        by_id = {item.id: item for item in items("train", tmp_path)}
        probed = rollout([by_id[r.id] for r in picked], skill, probe_instruction=instruction)
        probes.append(probe_record(instruction, probed))
        assert [r.predicted_answer for r in probed] == [r.predicted_answer for r in picked]

        extra = [[r for r in probed if r.failed]] if any(r.failed for r in probed) else []
        root = aggregate(
            reflect(skill, batch, seed, patch_analyst(skill, buffer), extra),
            skill,
            merge_request,
            MergeReply,
            patch_from_merge,
        )
        edits = select(skill, root.edits if root else [], 4)
        if not edits:
            return None
        readouts = [d for d in root.diagnosis if "probe readout" in d.description]
        assert readouts or not extra
        return Proposal(apply_edits(skill, edits)[0], edits)

    run = train(tmp_path, step, epochs=1)
    assert run.score > run.baseline + 0.4, run.decisions
    assert probes and all(p["instruction"] == PROBE_INSTRUCTION and p["item_ids"] for p in probes)
