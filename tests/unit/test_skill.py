"""The skill document: protected blocks, edits, hashing and diffs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from skillopt.core.errors import SkillFormatError
from skillopt.skill.document import (
    APPENDIX,
    APPLY_STATUSES,
    SLOW_UPDATE,
    ApplyReport,
    Edit,
    SkillDocument,
    apply_edits,
    block_markers,
    extract_block,
    inject_block,
    replace_block,
    restore_protected,
    skill_hash,
    strip_markers,
    target_text,
    unified_diff,
)

SLOW_START, SLOW_END = block_markers(SLOW_UPDATE)
APP_START, APP_END = block_markers(APPENDIX)

BODY = "# Skill\n\n- Read the question twice.\n- Answer in one word.\n"
GUIDANCE = "Stop regressions on counting tasks."
NOTES = "Remember the unit."
SKILL = f"{BODY}\n{SLOW_START}\n{GUIDANCE}\n{SLOW_END}\n\n{APP_START}\n{NOTES}\n{APP_END}\n"


def apply_one(text: str, **edit: object) -> tuple[str, str]:
    """Apply one edit; return the new skill and its status."""
    new, report = apply_edits(text, [Edit.model_validate(edit)])
    return new, report.entries[0].status


def body_of(text: str) -> str:
    return SkillDocument.parse(text).body


# --- parsing and rendering ----------------------------------------------------------------------


def test_parse_splits_body_and_blocks() -> None:
    document = SkillDocument.parse(SKILL)

    assert document.body == BODY.rstrip()
    assert document.slow_update == GUIDANCE
    assert document.appendix == NOTES


def test_render_is_body_then_blocks_in_order_with_one_final_newline() -> None:
    document = SkillDocument(body="rules\n\n", slow_update="guide", appendix="notes")

    assert document.text == f"rules\n\n{SLOW_START}\nguide\n{SLOW_END}\n\n{APP_START}\nnotes\n{APP_END}\n"


def test_absent_and_empty_blocks_are_different() -> None:
    absent = SkillDocument.parse("rules\n")
    empty = SkillDocument.parse(f"rules\n\n{SLOW_START}\n{SLOW_END}\n")

    assert absent.slow_update is None
    assert empty.slow_update == ""
    assert SLOW_START in empty.text
    assert SLOW_START not in absent.text


def test_an_empty_skill_renders_as_empty_text() -> None:
    assert SkillDocument().text == ""
    assert SkillDocument.parse("  \n\n").body == ""


def test_markers_with_missing_spaces_are_recognised_and_rendered_exactly() -> None:
    document = SkillDocument.parse("rules\n<!--SLOW_UPDATE_START-->\nguide\n<!--\tSLOW_UPDATE_END -->")

    assert document.slow_update == "guide"
    assert SLOW_START in document.text


def test_constructor_removes_markers_from_body_and_content() -> None:
    document = SkillDocument(body=f"rules {APP_END}", slow_update=f"{SLOW_START} guide {SLOW_END}")

    assert document.body == "rules"
    assert document.slow_update == "guide"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"x\n{SLOW_START}\na\n{SLOW_END}\n{SLOW_START}\nb\n{SLOW_END}\n", "more than once"),
        (f"x\n{SLOW_START}\na\n", "never closed"),
        (f"x\n{APP_END}\n", "no matching"),
        (f"x\n{SLOW_END}\na\n{SLOW_START}\n", "comes before"),
        (f"x\n{APP_START}\na\n{APP_END}\n{SLOW_START}\nb\n{SLOW_END}\n", "out of order"),
        (f"x\n{SLOW_START}\n{APP_START}\na\n{APP_END}\n{SLOW_END}\n", "out of order or nested"),
        (f"x\n{SLOW_START}\na\n{SLOW_END}\nmore rules\n", "text after the SLOW_UPDATE block"),
        (f"x\n{SLOW_START}\na\n{SLOW_END}\nstray\n{APP_START}\nb\n{APP_END}\n", "text after"),
    ],
    ids=[
        "duplicate",
        "start-without-end",
        "end-without-start",
        "end-before-start",
        "wrong-order",
        "nested",
        "text-after",
        "text-between",
    ],
)
def test_malformed_markers_raise_a_skill_format_error(text: str, message: str) -> None:
    with pytest.raises(SkillFormatError, match=message):
        SkillDocument.parse(text)


def test_parse_error_names_the_line() -> None:
    with pytest.raises(SkillFormatError, match="line 3"):
        SkillDocument.parse(f"a\nb\n{SLOW_START}\nno end\n")


# --- target text and hash -----------------------------------------------------------------------


def test_target_text_omits_empty_blocks_but_keeps_filled_ones() -> None:
    text = f"rules\n\n{SLOW_START}\n\n{SLOW_END}\n\n{APP_START}\nnotes\n{APP_END}\n"

    shown = target_text(text)

    assert SLOW_START not in shown
    assert f"{APP_START}\nnotes\n{APP_END}" in shown


def test_hash_ignores_an_injected_empty_block() -> None:
    assert skill_hash(inject_block(BODY, SLOW_UPDATE)) == skill_hash(BODY)
    assert skill_hash(inject_block(BODY, APPENDIX, "   \n")) == skill_hash(BODY)


def test_hash_ignores_trailing_whitespace() -> None:
    assert skill_hash(BODY + "\n\n   \n") == skill_hash(BODY.rstrip())


def test_hash_changes_with_real_content() -> None:
    assert skill_hash(BODY + "- One more rule.\n") != skill_hash(BODY)
    assert skill_hash(replace_block(BODY, SLOW_UPDATE, "guide")) != skill_hash(BODY)
    assert skill_hash(replace_block(SKILL, APPENDIX, "other notes")) != skill_hash(SKILL)


def test_hash_is_sha256_hex_of_the_target_text() -> None:
    import hashlib

    assert skill_hash(SKILL) == hashlib.sha256(target_text(SKILL).encode()).hexdigest()


# --- block operations ---------------------------------------------------------------------------


def test_inject_adds_an_empty_block_in_its_place_and_never_touches_the_body() -> None:
    text = f"{BODY}\n{APP_START}\nnotes\n{APP_END}\n"

    injected = inject_block(text, SLOW_UPDATE)

    assert injected.index(SLOW_START) < injected.index(APP_START)
    assert extract_block(injected, SLOW_UPDATE) == ""
    assert body_of(injected) == body_of(text)


def test_inject_keeps_an_existing_blocks_content() -> None:
    assert extract_block(inject_block(SKILL, SLOW_UPDATE), SLOW_UPDATE) == GUIDANCE


def test_extract_returns_none_for_an_absent_block() -> None:
    assert extract_block(BODY, APPENDIX) is None
    assert extract_block(SKILL, APPENDIX) == NOTES


def test_replace_block_sets_content_keeps_order_and_body() -> None:
    text = inject_block(BODY, APPENDIX, "notes")

    replaced = replace_block(text, SLOW_UPDATE, "new guidance")

    assert extract_block(replaced, SLOW_UPDATE) == "new guidance"
    assert extract_block(replaced, APPENDIX) == "notes"
    assert replaced.index(SLOW_END) < replaced.index(APP_START)
    assert body_of(replaced) == body_of(BODY)


def test_block_content_loses_any_markers() -> None:
    replaced = replace_block(BODY, SLOW_UPDATE, f"guide {SLOW_END}\n{APP_START} more")

    assert extract_block(replaced, SLOW_UPDATE) == "guide \n more"
    assert extract_block(replaced, APPENDIX) is None


def test_unknown_block_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown protected block"):
        replace_block(BODY, "NOTES", "x")


# --- the Edit model -----------------------------------------------------------------------------


def test_edit_ignores_extra_keys_and_reads_null_target_as_empty() -> None:
    edit = Edit.model_validate({"op": "append", "target": None, "content": "x", "rationale": "why"})

    assert edit.target == ""
    assert edit.support_count == 1
    assert edit.source == "failure"
    assert edit.merge_level == 0


def test_edit_op_is_normalised_and_unknown_ops_still_validate() -> None:
    assert Edit(op=" Insert-After ").op == "insert_after"
    assert Edit(op="rewrite_everything").op == "rewrite_everything"


def test_edit_rejects_negative_support_and_unknown_source() -> None:
    with pytest.raises(ValidationError):
        Edit(op="append", support_count=-1)
    with pytest.raises(ValidationError):
        Edit.model_validate({"op": "append", "source": "guess"})


# --- applying edits: each op --------------------------------------------------------------------


def test_append_adds_content_after_a_blank_line_before_the_blocks() -> None:
    new, status = apply_one(SKILL, op="append", content="- Check units.\n")

    assert status == "applied"
    assert body_of(new) == BODY.rstrip() + "\n\n- Check units."
    assert extract_block(new, SLOW_UPDATE) == GUIDANCE
    assert extract_block(new, APPENDIX) == NOTES


def test_append_to_an_empty_body_is_just_the_content() -> None:
    new, status = apply_one("", op="append", content="first rule")

    assert (new, status) == ("first rule\n", "applied")


def test_insert_after_puts_content_on_the_line_after_the_anchor_line() -> None:
    new, status = apply_one(
        SKILL, op="insert_after", target="Read the question", content="- Underline the ask."
    )

    assert status == "applied"
    assert (
        body_of(new) == "# Skill\n\n- Read the question twice.\n- Underline the ask.\n- Answer in one word."
    )


def test_insert_after_the_last_line_of_the_body() -> None:
    new, status = apply_one(SKILL, op="insert_after", target="one word.", content="- Be brief.")

    assert status == "applied"
    assert body_of(new).endswith("- Answer in one word.\n- Be brief.")


def test_insert_after_a_target_ending_in_a_newline_inserts_right_after_that_line() -> None:
    new, _ = apply_one(BODY, op="insert_after", target="twice.\n", content="- New.")

    assert body_of(new) == "# Skill\n\n- Read the question twice.\n- New.\n- Answer in one word."


def test_insert_after_a_missing_anchor_is_skipped_and_the_body_is_unchanged() -> None:
    new, status = apply_one(SKILL, op="insert_after", target="no such line", content="- Orphan.")

    assert status == "skipped_target_not_found"
    assert new == SkillDocument.parse(SKILL).text
    assert "Orphan" not in new


def test_replace_swaps_the_target_text() -> None:
    new, status = apply_one(SKILL, op="replace", target="one word", content="at most three words")

    assert status == "applied"
    assert "- Answer in at most three words." in body_of(new)


def test_delete_removes_the_target_text() -> None:
    new, status = apply_one(SKILL, op="delete", target="- Read the question twice.\n")

    assert status == "applied"
    assert body_of(new) == "# Skill\n\n- Answer in one word."


def test_unknown_op_is_reported_not_raised() -> None:
    new, status = apply_one(SKILL, op="shuffle", target="Skill")

    assert status == "skipped_unknown_op"
    assert new == SkillDocument.parse(SKILL).text


@pytest.mark.parametrize("op", ["insert_after", "replace", "delete"])
def test_an_empty_target_is_an_error_for_every_anchored_op(op: str) -> None:
    new, report = apply_edits(SKILL, [Edit(op=op, target="  \n", content="x")])

    assert report.entries[0].status == "error"
    assert "target" in report.entries[0].detail
    assert new == SkillDocument.parse(SKILL).text


def test_append_with_blank_content_is_an_error() -> None:
    _, status = apply_one(SKILL, op="append", content="\n  ")

    assert status == "error"


# --- matching -----------------------------------------------------------------------------------


def test_exact_match_wins_over_fuzzy() -> None:
    _, status = apply_one(SKILL, op="replace", target="Answer in one word.", content="Answer briefly.")

    assert status == "applied"


def test_whitespace_differences_match_fuzzily() -> None:
    new, status = apply_one(SKILL, op="replace", target="Read   the\nquestion  twice.", content="Read it.")

    assert status == "applied_fuzzy"
    assert "- Read it.\n" in new


def test_fuzzy_match_never_ignores_missing_whitespace() -> None:
    _, status = apply_one(SKILL, op="delete", target="Readthe question")

    assert status == "skipped_target_not_found"


def test_a_target_that_occurs_twice_is_ambiguous() -> None:
    new, report = apply_edits("- a rule\n- a rule\n", [Edit(op="delete", target="a rule")])

    assert report.entries[0].status == "skipped_ambiguous_target"
    assert "2 times" in report.entries[0].detail
    assert new == "- a rule\n- a rule\n"


def test_overlapping_occurrences_count_as_ambiguous() -> None:
    _, status = apply_one("aaa\n", op="replace", target="aa", content="b")

    assert status == "skipped_ambiguous_target"


def test_fuzzy_occurrences_can_be_ambiguous_too() -> None:
    _, status = apply_one("use  tools\n\nuse\ttools\n", op="delete", target="use tools ")

    assert status == "skipped_ambiguous_target"


# --- protected blocks ---------------------------------------------------------------------------


def test_a_target_inside_a_protected_block_is_skipped() -> None:
    new, status = apply_one(SKILL, op="replace", target=GUIDANCE, content="hijacked")

    assert status == "skipped_protected"
    assert extract_block(new, SLOW_UPDATE) == GUIDANCE


def test_a_target_found_in_the_body_and_in_a_block_is_skipped() -> None:
    text = replace_block(BODY, APPENDIX, "Answer in one word always")

    _, status = apply_one(text, op="replace", target="Answer in one word", content="x")

    assert status == "skipped_protected"


def test_a_target_spanning_into_a_block_is_skipped() -> None:
    _, status = apply_one(SKILL, op="delete", target=f"one word.\n\n{SLOW_START}")

    assert status == "skipped_protected"


def test_a_target_that_names_a_marker_is_skipped_even_if_the_block_is_absent() -> None:
    _, status = apply_one(BODY, op="insert_after", target=APP_START, content="x")

    assert status == "skipped_protected"


def test_a_target_matching_the_body_end_with_trailing_newlines_is_not_protected() -> None:
    new, status = apply_one(SKILL, op="replace", target="one word.\n\n", content="one word!")

    assert status == "applied"
    assert body_of(new).endswith("- Answer in one word!")


def test_markers_are_stripped_from_edit_content() -> None:
    new, status = apply_one(SKILL, op="append", content=f"{SLOW_END}\n- New rule.\n{APP_START}")

    assert status == "applied"
    assert body_of(new).endswith("- New rule.")
    assert extract_block(new, SLOW_UPDATE) == GUIDANCE
    assert extract_block(new, APPENDIX) == NOTES


def test_an_edit_that_would_splice_a_marker_into_the_body_is_skipped() -> None:
    text = "<!-- APPENDIX_START X -->\n"

    new, status = apply_one(text, op="delete", target=" X")

    assert status == "skipped_protected"
    assert new == text


# --- sequencing and the report ------------------------------------------------------------------


def test_edits_apply_in_order_each_on_the_previous_result() -> None:
    edits = [
        Edit(op="append", content="- Rule A."),
        Edit(op="insert_after", target="Rule A.", content="- Rule B."),
        Edit(op="replace", target="Rule B", content="Rule C"),
    ]

    new, report = apply_edits(SKILL, edits)

    assert [entry.status for entry in report.entries] == ["applied", "applied", "applied"]
    assert body_of(new).endswith("- Rule A.\n- Rule C.")


def test_report_counts_every_status_and_serialises() -> None:
    edits = [
        Edit(op="append", content="x"),
        Edit(op="delete", target="Read   the question"),
        Edit(op="delete", target="nowhere"),
        Edit(op="teleport"),
    ]

    _, report = apply_edits(SKILL, edits)

    assert [entry.index for entry in report.entries] == [0, 1, 2, 3]
    assert report.n_applied == 2
    assert report.counts["applied_fuzzy"] == 1
    assert report.counts["skipped_unknown_op"] == 1
    assert set(report.counts) == set(APPLY_STATUSES)
    dumped = report.model_dump(mode="json")
    assert dumped["counts"]["skipped_target_not_found"] == 1
    assert ApplyReport.model_validate(dumped) == report


# --- full rewrites ------------------------------------------------------------------------------


def test_restore_puts_back_blocks_a_rewrite_dropped() -> None:
    restored, changed = restore_protected(SKILL, "# Better skill\n- One rule.\n")

    assert changed is True
    assert body_of(restored) == "# Better skill\n- One rule."
    assert extract_block(restored, SLOW_UPDATE) == GUIDANCE
    assert extract_block(restored, APPENDIX) == NOTES


def test_restore_reverts_altered_blocks_and_removes_moved_ones_from_the_body() -> None:
    rewritten = f"{SLOW_START}\nmy own guidance\n{SLOW_END}\n# New\n- rule\n{APP_END}\n"

    restored, changed = restore_protected(SKILL, rewritten)

    assert changed is True
    assert body_of(restored) == "# New\n- rule"
    assert extract_block(restored, SLOW_UPDATE) == GUIDANCE


def test_restore_reports_nothing_when_blocks_survived() -> None:
    rewritten = SKILL.replace("one word", "two words")

    restored, changed = restore_protected(SKILL, rewritten)

    assert changed is False
    assert restored == SkillDocument.parse(rewritten).text


def test_restore_removes_blocks_the_original_did_not_have() -> None:
    restored, changed = restore_protected(BODY, f"new body\n\n{APP_START}\ninvented\n{APP_END}\n")

    assert changed is True
    assert restored == "new body\n"


# --- diff ---------------------------------------------------------------------------------------


def test_unified_diff_shows_changed_lines_with_names() -> None:
    diff = unified_diff("a\nb\n", "a\nc\n")

    assert diff.startswith("--- current\n+++ candidate\n")
    assert "-b\n" in diff
    assert "+c\n" in diff


def test_unified_diff_of_equal_texts_is_empty() -> None:
    assert unified_diff(SKILL, SKILL, "old", "new") == ""


def test_strip_markers_removes_markers_formed_by_removal() -> None:
    assert strip_markers(f"<!-- APP{APP_END}ENDIX_END -->ok") == "ok"


# --- properties ---------------------------------------------------------------------------------

_FRAGMENTS = [SLOW_START, SLOW_END, APP_START, APP_END, "<!--", "-->", "SLOW_UPDATE_START", "_END", "\n", " "]
_pieces = st.one_of(st.text(alphabet="ab -\n\t.#", max_size=8), st.sampled_from(_FRAGMENTS))
_texts = st.lists(_pieces, max_size=8).map("".join)
_contents = st.one_of(st.none(), _texts)
_documents = st.builds(SkillDocument, body=_texts, slow_update=_contents, appendix=_contents)


@st.composite
def _edits_for(draw: st.DrawFn, text: str) -> Edit:
    """An edit whose target is usually a real substring of ``text`` (so it often matches)."""
    if text and draw(st.booleans()):
        start = draw(st.integers(0, len(text) - 1))
        target = text[start : draw(st.integers(start, len(text)))]
    else:
        target = draw(_texts)
    op = draw(st.sampled_from(["append", "insert_after", "replace", "delete", "bogus"]))
    return Edit(op=op, target=target, content=draw(_texts))


@settings(max_examples=150, deadline=None)
@given(document=_documents, data=st.data())
def test_property_edits_never_change_the_protected_blocks(
    document: SkillDocument, data: st.DataObject
) -> None:
    text = document.text
    edits = data.draw(st.lists(_edits_for(text), max_size=5))

    new, report = apply_edits(text, edits)

    after = SkillDocument.parse(new)
    assert (after.slow_update, after.appendix) == (document.slow_update, document.appendix)
    assert len(report.entries) == len(edits)
    assert set(report.counts) == set(APPLY_STATUSES)


@settings(max_examples=150, deadline=None)
@given(document=_documents)
def test_property_an_empty_edit_list_is_the_identity(document: SkillDocument) -> None:
    new, report = apply_edits(document.text, [])

    assert new == document.text
    assert report.entries == []


@settings(max_examples=200, deadline=None)
@given(document=_documents)
def test_property_parse_render_round_trip(document: SkillDocument) -> None:
    assert SkillDocument.parse(document.text) == document
    assert SkillDocument.parse(document.target_text).body == document.body


@settings(max_examples=200, deadline=None)
@given(text=_texts)
def test_property_parse_either_succeeds_canonically_or_raises_skill_format_error(text: str) -> None:
    try:
        document = SkillDocument.parse(text)
    except SkillFormatError:
        return
    assert SkillDocument.parse(document.text) == document


@settings(max_examples=100, deadline=None)
@given(document=_documents)
def test_property_hash_ignores_empty_blocks(document: SkillDocument) -> None:
    emptied = SkillDocument(body=document.body, slow_update="", appendix="")
    bare = SkillDocument(body=document.body)

    assert skill_hash(emptied.text) == skill_hash(bare.text) == skill_hash(bare.text + "  \n")


@settings(max_examples=100, deadline=None)
@given(original=_documents, rewritten=_texts)
def test_property_restore_always_keeps_the_original_blocks(original: SkillDocument, rewritten: str) -> None:
    restored, _ = restore_protected(original.text, rewritten)

    after = SkillDocument.parse(restored)
    assert (after.slow_update, after.appendix) == (original.slow_update, original.appendix)


def test_in_a_skill_of_one_file_every_edit_addresses_that_file():
    text, report = apply_edits("# Skill\n\nBe brief.\n", [
        Edit(op="append", content="- check the sport", file="nachos-1.png"),
        Edit(op="insert_after", target="Be brief.", content="- name the league", file="references/x.md"),
    ])
    assert text == "# Skill\n\nBe brief.\n- name the league\n\n- check the sport\n"
    assert [(e.status, e.file) for e in report.entries] == [("applied", "SKILL.md"), ("applied", "SKILL.md")]
