"""Behaviour of ``extract_json`` and ``strict_json_schema``."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, RootModel

from skillopt.llm.errors import ParseError
from skillopt.llm.json_extract import MAX_INPUT_BYTES, extract_json, strict_json_schema


class SlowUpdate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    reasoning: str
    guidance: str


class Edit(BaseModel):
    model_config = ConfigDict(extra="ignore")
    op: Literal["add", "remove", "replace"]
    target: str
    content: str = ""


class Merge(BaseModel):
    model_config = ConfigDict(extra="ignore")
    reasoning: str
    edits: list[Edit]


def fenced(body: str, label: str = "json") -> str:
    return f"```{label}\n{body}\n```"


# --- where candidates come from --------------------------------------------------------------


def test_fenced_json_block_wins_over_earlier_prose_braces() -> None:
    reply = 'My first idea was {"reasoning": "draft", "guidance": "old"} but then I revised it.\n' + fenced(
        '{"reasoning": "final", "guidance": "new"}'
    )
    assert extract_json(reply, SlowUpdate) == SlowUpdate(reasoning="final", guidance="new")
    assert extract_json(reply) == {"reasoning": "final", "guidance": "new"}


def test_unlabelled_fence_is_a_candidate() -> None:
    reply = "Here you go:\n" + fenced('{"reasoning": "r", "guidance": "g"}', label="")
    assert extract_json(reply, SlowUpdate).guidance == "g"


def test_uppercase_json_label_is_tolerated() -> None:
    reply = fenced('{"reasoning": "r", "guidance": "g"}', label="JSON")
    assert extract_json(reply, SlowUpdate).reasoning == "r"


def test_fence_failing_validation_is_skipped_for_the_next_valid_fence() -> None:
    reply = (
        fenced('{"reasoning": "missing guidance"}')
        + "\nSorry, corrected:\n"
        + fenced('{"reasoning": "r", "guidance": "g"}')
    )
    assert extract_json(reply, SlowUpdate) == SlowUpdate(reasoning="r", guidance="g")


def test_fence_with_another_language_is_not_a_candidate() -> None:
    reply = fenced('config = {"reasoning": "r", "guidance": "g"}', label="python")
    with pytest.raises(ParseError, match="no JSON object found"):
        extract_json(reply)


def test_closing_fence_glued_to_the_object_still_yields_the_object() -> None:
    assert extract_json('```json\n{"a": 1}```') == {"a": 1}


def test_braces_and_escaped_quotes_inside_strings_do_not_end_the_value() -> None:
    body = {"reasoning": 'use "{" and "}" and a \\ backslash', "guidance": 'x]}"{['}
    reply = f"Result: {json.dumps(body)} -- end."
    assert extract_json(reply, SlowUpdate) == SlowUpdate(**body)


def test_bare_object_in_prose_is_found() -> None:
    reply = 'After weighing the failures, my answer is {"reasoning": "r", "guidance": "g"}. Thanks!'
    assert extract_json(reply, SlowUpdate).guidance == "g"


def test_bare_object_after_a_failing_one_is_tried_in_order() -> None:
    reply = 'Draft: {"reasoning": "r"}\nFinal: {"reasoning": "r", "guidance": "g"}'
    assert extract_json(reply, SlowUpdate).guidance == "g"


def test_expect_array_returns_the_array_and_skips_objects() -> None:
    reply = 'Meta {"note": 1} then the list: [{"a": 1}, {"a": 2}]'
    assert extract_json(reply, expect="array") == [{"a": 1}, {"a": 2}]


def test_expect_array_validates_against_a_root_model() -> None:
    edits = RootModel[list[Edit]]
    reply = fenced('[{"op": "add", "target": "t", "content": "c"}]')
    assert extract_json(reply, edits, expect="array").root[0].op == "add"


def test_expect_object_rejects_a_top_level_array() -> None:
    with pytest.raises(ParseError, match="holds a JSON array, expected an object"):
        extract_json('[{"reasoning": "r", "guidance": "g"}]', SlowUpdate)


def test_unknown_extra_key_still_validates() -> None:
    reply = '{"reasoning": "r", "guidance": "g", "confidence": "high"}'
    assert extract_json(reply, SlowUpdate) == SlowUpdate(reasoning="r", guidance="g")


# --- what is rejected ------------------------------------------------------------------------


def test_prose_only_raises_no_json_found_with_stage_and_excerpt() -> None:
    reply = "I could not decide which edits to make, sorry. " * 20
    with pytest.raises(ParseError, match="no JSON object found") as caught:
        extract_json(reply, SlowUpdate, stage="slow_update")
    assert caught.value.stage == "slow_update"
    assert 0 < len(caught.value.excerpt) <= 300


def test_truncated_reply_raises_truncated_and_is_never_closed() -> None:
    reply = 'Here it is:\n```json\n{"reasoning": "r", "edits": [{"op": "add", "target": "Rules", "con'
    with pytest.raises(ParseError, match="truncated") as caught:
        extract_json(reply, Merge, repair=True)
    assert "repair skipped" in str(caught.value)
    assert caught.value.excerpt.endswith('"con')


def test_inline_backtick_pseudo_json_is_not_a_candidate() -> None:
    with pytest.raises(ParseError, match="no JSON object found"):
        extract_json('The answer is `{"reasoning": "r", "guidance": "g"}` in spirit.')
    with pytest.raises(ParseError, match="no JSON object found"):
        extract_json('Write ``{"a": 1}`` like this.')


def test_quoted_pseudo_json_is_not_a_candidate() -> None:
    for reply in [
        'The tool printed "{\\"a\\": 1}" to stdout.',
        "Python would write '{\"a\": 1}' here.",
        'He wrote \u201c{"a": 1}\u201d on the board.',
    ]:
        with pytest.raises(ParseError, match="no JSON object found"):
            extract_json(reply)


def test_quoted_words_before_a_bare_object_do_not_hide_it() -> None:
    reply = 'Fill the "reasoning" and `guidance` keys:\n{"reasoning": "r", "guidance": "g"}'
    assert extract_json(reply, SlowUpdate).reasoning == "r"


def test_nesting_deeper_than_64_is_rejected_and_64_is_accepted() -> None:
    assert extract_json("[" * 64 + "]" * 64, expect="array") is not None
    with pytest.raises(ParseError, match="nested too deeply"):
        extract_json("[" * 65 + "]" * 65, expect="array")
    with pytest.raises(ParseError, match="nested too deeply"):
        extract_json('{"a": ' * 65 + "1" + "}" * 65)


def test_input_over_2_mb_is_rejected() -> None:
    reply = '{"a": "' + "x" * MAX_INPUT_BYTES + '"}'
    with pytest.raises(ParseError, match="too large") as caught:
        extract_json(reply)
    assert len(caught.value.excerpt) <= 300


def test_integer_of_101_digits_is_rejected_and_100_digits_accepted() -> None:
    hundred = "9" * 100
    assert extract_json(f'{{"n": -{hundred}}}') == {"n": -int(hundred)}
    with pytest.raises(ParseError, match="longer than 100 digits"):
        extract_json(f'{{"n": 1{hundred}}}')


def test_nan_and_infinity_are_rejected() -> None:
    for literal in ["NaN", "Infinity", "-Infinity", "1e999"]:
        with pytest.raises(ParseError, match="none valid"):
            extract_json(f'{{"x": {literal}}}')


def test_validation_failure_summary_has_location_but_not_the_input_value() -> None:
    reply = '{"reasoning": "SENTINEL-VALUE-123", "edits": [{"op": "explode", "target": "t"}]}'
    with pytest.raises(ParseError, match=r"found 1 candidate\(s\), none valid") as caught:
        extract_json(reply, Merge)
    reason = caught.value.reason
    assert "edits.0.op" in reason
    assert "explode" not in reason and "SENTINEL" not in reason


def test_validation_error_is_reported_even_after_an_unparseable_candidate() -> None:
    reply = "Placeholder {reasoning} then\n" + fenced('{"reasoning": "r"}')
    with pytest.raises(ParseError, match=r"found 2 candidate\(s\).*guidance: Field required"):
        extract_json(reply, SlowUpdate)


# --- repair ----------------------------------------------------------------------------------


def test_repair_drops_trailing_comma_and_escapes_raw_newline_in_one_candidate() -> None:
    reply = fenced('{"reasoning": "line one\nline two", "guidance": "g",}')
    with pytest.raises(ParseError, match="invalid JSON"):
        extract_json(reply, SlowUpdate)
    repaired = extract_json(reply, SlowUpdate, repair=True)
    assert repaired == SlowUpdate(reasoning="line one\nline two", guidance="g")


def test_repair_keeps_commas_and_newlines_that_are_legitimate() -> None:
    reply = '{"reasoning": "a, ]", "guidance": "tab\there",\n "x": [1, 2,\n]}'
    assert extract_json(reply, SlowUpdate, repair=True) == SlowUpdate(reasoning="a, ]", guidance="tab\there")


def test_repair_of_raw_newlines_survives_a_fence_line_inside_the_string() -> None:
    class Rewrite(BaseModel):
        model_config = ConfigDict(extra="ignore")
        reasoning: str
        new_skill: str

    skill = "# Skill\n```python\nprint('hi')\n```\nDone."
    body = '{"reasoning": "r", "new_skill": "' + skill + '"}'  # raw newlines: invalid JSON as sent
    reply = fenced(body)
    assert extract_json(reply, Rewrite, repair=True).new_skill == skill


def test_repair_refused_with_two_candidate_regions() -> None:
    reply = 'First {"reasoning": "a",} and second {"reasoning": "b", "guidance": "g",}'
    with pytest.raises(ParseError, match="repair skipped: 2 candidate regions"):
        extract_json(reply, SlowUpdate, repair=True)


# --- adversarial input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "{" * 200_000,
        "[" * 200_000,
        '"' * 200_000,
        "`" * 200_000,
        '"\\' * 100_000,
        "```a\n" * 50_000,
        "".join("`" * k + " " for k in range(1, 600)),
        '{"a":' * 100_000,
    ],
    ids=["braces", "brackets", "quotes", "backticks", "escapes", "fences", "tick-runs", "keys"],
)
def test_scan_of_adversarial_input_completes_with_a_parse_error(reply: str) -> None:
    with pytest.raises(ParseError):
        extract_json(reply)


def test_many_invalid_candidates_are_bounded_and_reported() -> None:
    with pytest.raises(ParseError, match=r"found 100000 candidate\(s\) \(tried the first 1000\), none valid"):
        extract_json("{} " * 100_000, SlowUpdate)


def test_200k_unbalanced_braces_are_reported_as_truncated() -> None:
    with pytest.raises(ParseError, match="truncated"):
        extract_json("{" * 200_000)


# --- strict schemas --------------------------------------------------------------------------


class Diagnosis(BaseModel):
    ids: list[str]
    kind: str
    description: str | None = None


class Patch(BaseModel):
    reasoning: str
    edits: list[Edit] = []


class AnalystReply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    diagnosis: list[Diagnosis]
    patch: Patch
    execution_notes: list[str] = []


def _objects(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for key, child in node.items():
            if key != "default":
                found += _objects(child)
    elif isinstance(node, list):
        for child in node:
            found += _objects(child)
    return found


def test_strict_json_schema_on_a_nested_model() -> None:
    schema = strict_json_schema(AnalystReply)
    objects = _objects(schema)
    assert {"AnalystReply", "Diagnosis", "Patch", "Edit"} <= {o.get("title") for o in objects}
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    notes = schema["properties"]["execution_notes"]
    assert {"type": "null"} in notes["anyOf"]
    assert notes["default"] == []
    description = schema["$defs"]["Diagnosis"]["properties"]["description"]
    assert description["anyOf"].count({"type": "null"}) == 1
    assert {"type": "null"} in schema["$defs"]["Edit"]["properties"]["content"]["anyOf"]
    assert "null" not in json.dumps(schema["$defs"]["Edit"]["properties"]["op"])


def test_strict_json_schema_refuses_free_form_maps() -> None:
    class Scores(BaseModel):
        by_item: dict[str, int]

    with pytest.raises(ValueError, match="by_item"):
        strict_json_schema(Scores)


# --- properties ------------------------------------------------------------------------------

_PROSE = st.text(alphabet=st.sampled_from("abcdefg XYZ 0123456789.,:;!?-\n"), max_size=80)
_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_JSON_OBJECTS = st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=5)


@settings(max_examples=80, deadline=None)
@given(before=_PROSE, obj=_JSON_OBJECTS, after=_PROSE, indent=st.sampled_from([None, 2]))
def test_any_object_embedded_in_brace_free_prose_is_recovered_exactly(
    before: str, obj: dict[str, Any], after: str, indent: int | None
) -> None:
    reply = f"{before} {json.dumps(obj, indent=indent, ensure_ascii=False)} {after}"
    assert extract_json(reply) == obj


@settings(max_examples=50, deadline=None)
@given(before=_PROSE, obj=_JSON_OBJECTS, decoy=_JSON_OBJECTS)
def test_a_fenced_object_is_preferred_to_a_bare_one_before_it(
    before: str, obj: dict[str, Any], decoy: dict[str, Any]
) -> None:
    reply = f"{before} {json.dumps(decoy)}\n{fenced(json.dumps(obj, indent=1))}"
    assert extract_json(reply) == obj


@settings(max_examples=200, deadline=None)
@given(reply=st.text(alphabet=st.sampled_from("{}[]\"\\`\u201c\u201d' \nab:,1"), max_size=60))
def test_arbitrary_text_yields_a_value_or_a_parse_error(reply: str) -> None:
    try:
        value = extract_json(reply)
    except ParseError as exc:
        assert len(exc.excerpt) <= 300
    else:
        assert isinstance(value, dict)
