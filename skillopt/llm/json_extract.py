"""Find one JSON value in a model's free-text reply.

``extract_json`` turns a reply into a validated object or raises ``ParseError``. Candidates come
from two places, tried in this order:

1. Fenced code blocks labelled ``json`` (any case) or unlabelled, in order, whose content starts
   with the expected bracket (``{`` for an object, ``[`` for an array). The candidate is the whole
   stripped content of the block.
2. Bare top-level values: a linear, string-aware scan of the prose for ``{`` / ``[`` values, in
   order of appearance. A value is "top-level" when it is not nested in another value; values
   of the other type are skipped whole (an array is not searched for objects).

The first candidate that parses and validates against ``schema`` wins; one that parses but fails
validation is skipped. Anything else is a ``ParseError`` whose reason says what was found.

What is *not* a candidate (the prose scan skips it entirely, braces included):

- inline code: a run of N backticks up to the next run of exactly N backticks in the same
  paragraph (no blank line or fence line in between), as in CommonMark; an unmatched run is
  literal text;
- a double-quoted span ``"..."`` (backslash escapes honoured) or ``“...”`` that closes on the same
  line; an unclosed quote is literal text;
- a value whose opening bracket directly follows a quote or backtick character (``'{...}'``);
- the content of a closed fenced block with any label other than ``json``. The content of a
  ``json`` / unlabelled block *is* scanned, so a block holding prose around an object still
  yields the object. Fence lines are a line holding only ``` (3+ backticks, optional indent) and
  an optional label; a fence is closed by a bare fence line at least as long.

Truncated output (a value that never closes) is never completed; scanning stops there and, if no
earlier candidate is valid, the reply fails as truncated.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ValidationError

from skillopt.llm.errors import ParseError

MAX_INPUT_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 64
# Parsing and validating costs ~20 µs per candidate; a reply of a million "{}" would take seconds.
MAX_CANDIDATES_TRIED = 1000
MAX_INT_DIGITS = 100
EXCERPT_CHARS = 300

ModelT = TypeVar("ModelT", bound=BaseModel)

_OPENER = {"object": "{", "array": "["}
_CLOSER = {"{": "}", "[": "]"}
_QUOTE_BEFORE_VALUE = frozenset("'\"`\u2018\u201c")

# Inside a value only quotes and brackets matter; inside a string only quotes and backslashes.
_VALUE_STOPS = re.compile(r'["{}\[\]]')
_STRING_STOPS = re.compile(r'["\\]')
_PROSE_STOPS = re.compile('[{\\[`"\u201c]')
_QUOTE_CLOSE = re.compile(r'["\\\n]')
_BACKTICK_RUN = re.compile(r"`+")
_BLANK_LINE = re.compile(r"\n[ \t]*\r?\n")
_FENCE_LINE = re.compile(r"^[ \t]*(`{3,})[ \t]*([^`\n]*?)[ \t]*\r?$", re.MULTILINE)
# A JSON string (raw control characters allowed, for repair) or a comma before a closing bracket.
_REPAIR_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|,(?=\s*[}\]])', re.DOTALL)
_CONTROL_CHAR = re.compile(r"[\x00-\x1f]")
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


@overload
def extract_json(
    text: str,
    schema: type[ModelT],
    *,
    expect: Literal["object", "array"] = "object",
    repair: bool = False,
    stage: str | None = None,
) -> ModelT: ...


@overload
def extract_json(
    text: str,
    schema: None = None,
    *,
    expect: Literal["object", "array"] = "object",
    repair: bool = False,
    stage: str | None = None,
) -> dict[str, Any] | list[Any]: ...


def extract_json(
    text: str,
    schema: type[BaseModel] | None = None,
    *,
    expect: Literal["object", "array"] = "object",
    repair: bool = False,
    stage: str | None = None,
) -> BaseModel | dict[str, Any] | list[Any]:
    """Return the first JSON value in ``text`` that parses and validates against ``schema``.

    With ``schema`` the result is ``schema.model_validate(value)``; without it, the first parseable
    ``dict`` (``expect="object"``) or ``list`` (``expect="array"``). ``repair=True`` lets one
    syntactically broken value be fixed (trailing commas dropped, raw control characters in
    strings escaped), but only when the reply holds exactly one candidate region and nothing
    truncated.

    Raises ``ParseError`` (carrying ``stage`` and an ``excerpt`` of at most 300 characters) when the
    reply is over 2 MB, holds no value of the expected type, is truncated, or when every candidate
    fails: invalid JSON, nesting deeper than 64, an integer over 100 digits, NaN/Infinity, or a
    validation error (summarised as ``loc: msg``, never echoing the input). At most the first 1,000
    candidates are tried (the error says so). Never raises anything else for any ``str`` input.
    """
    if expect not in _OPENER:
        raise ValueError(f"expect must be 'object' or 'array', not {expect!r}")
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) <= MAX_INPUT_BYTES else len(text)
    if size > MAX_INPUT_BYTES:
        raise ParseError(
            f"reply too large: {size} bytes (limit {MAX_INPUT_BYTES})",
            excerpt=text[:EXCERPT_CHARS],
            stage=stage,
        )

    opener = _OPENER[expect]
    fences = _find_fences(text)
    scan = _scan_prose(text, opener, fences)
    fenced = _fence_candidates(text, opener, fences)
    seen = {(c.start, c.end) for c in fenced}
    candidates = fenced + [c for c in scan.candidates if (c.start, c.end) not in seen]

    failures: list[_Failure] = []
    for candidate in candidates[:MAX_CANDIDATES_TRIED]:
        outcome = _try_candidate(text[candidate.start : candidate.end], candidate.depth, schema)
        if isinstance(outcome, _Failure):
            failures.append(outcome)
        else:
            return outcome

    repair_note = ""
    regions = _candidate_regions(fenced, scan.candidates) if repair else []
    if repair and scan.unclosed_at is not None:
        repair_note = "repair skipped: the reply is truncated"
    elif len(regions) > 1:
        repair_note = f"repair skipped: {len(regions)} candidate regions, repair needs exactly one"
    elif regions and not any(f.validation for f in failures):  # repair cannot fix a schema mismatch
        original = text[regions[0].start : regions[0].end]
        fixed = _repair(original)
        if fixed == original:
            repair_note = "repair found nothing to fix"
        else:
            outcome = _try_candidate(fixed, None, schema)
            if not isinstance(outcome, _Failure):
                return outcome
            repair_note = f"after repair: {outcome.reason}"

    raise _failure_error(text, expect, scan, candidates, failures, repair_note, stage)


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Return ``model``'s JSON schema in the strict form providers require for constrained output.

    Every object (the root, nested properties, array items, ``anyOf`` branches and ``$defs``) lists
    all its properties in ``required`` and has ``additionalProperties: false``; a property that was
    optional becomes nullable (``anyOf: [<schema>, {"type": "null"}]``, keeping its title,
    description and default outside). A model with an optional non-``None``-able field should
    therefore accept ``None`` for it. Free-form maps (``dict[str, X]`` fields) cannot be made strict
    and raise ``ValueError`` naming the schema path.
    """
    schema = model.model_json_schema()
    _make_strict(schema, "#")
    for name, definition in schema.get("$defs", {}).items():
        _make_strict(definition, f"#/$defs/{name}")
    return schema


# --- candidates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    start: int
    end: int  # exclusive
    depth: int | None = None  # known for bare values, measured later for fenced ones


@dataclass(frozen=True)
class _Failure:
    raw: str  # the candidate's text
    problem: str | ValidationError  # summarised only if reported: a reply may hold many candidates
    excerpt_at: int = 0

    @property
    def validation(self) -> bool:
        return isinstance(self.problem, ValidationError)

    @property
    def reason(self) -> str:
        if isinstance(self.problem, ValidationError):
            return f"validation failed: {_summarise(self.problem)}"
        return self.problem

    @property
    def excerpt(self) -> str:
        return self.raw[self.excerpt_at : self.excerpt_at + EXCERPT_CHARS]


@dataclass(frozen=True)
class _Fence:
    open_start: int
    open_end: int  # end of the opening fence line (before its newline)
    close_start: int
    close_end: int
    label: str

    @property
    def is_json(self) -> bool:
        return self.label.split(maxsplit=1)[0].lower() == "json" if self.label else True


@dataclass
class _ScanResult:
    candidates: list[_Candidate]
    other_type: int  # balanced top-level values of the other type (an array when expecting an object)
    unclosed_at: int | None  # offset of a value that never closes


def _find_fences(text: str) -> tuple[list[_Fence], list[tuple[int, int]]]:
    """Pair fence lines into closed blocks; return the blocks and the lines of unclosed openers."""
    lines = [(m.start(), m.end(), len(m.group(1)), m.group(2)) for m in _FENCE_LINE.finditer(text)]
    # longest_bare[i]: the longest label-less fence line at index >= i, so a doomed opener costs O(1).
    longest_bare = [0] * (len(lines) + 1)
    for i in range(len(lines) - 1, -1, -1):
        longest_bare[i] = max(longest_bare[i + 1], 0 if lines[i][3] else lines[i][2])
    fences: list[_Fence] = []
    unclosed: list[tuple[int, int]] = []
    i = 0
    while i < len(lines):
        start, end, ticks, label = lines[i]
        if longest_bare[i + 1] < ticks:
            unclosed.append((start, end))
            i += 1
            continue
        j = i + 1
        while lines[j][3] or lines[j][2] < ticks:
            j += 1
        fences.append(_Fence(start, end, lines[j][0], lines[j][1], label))
        i = j + 1
    return fences, unclosed


def _fence_candidates(
    text: str, opener: str, fences: tuple[list[_Fence], list[tuple[int, int]]]
) -> list[_Candidate]:
    found = []
    for fence in fences[0]:
        if not fence.is_json:
            continue
        start, end = fence.open_end, fence.close_start
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start < end and text[start] == opener:
            found.append(_Candidate(start, end))
    return found


def _candidate_regions(fenced: list[_Candidate], bare: list[_Candidate]) -> list[_Candidate]:
    """The distinct places a value is offered: bare values, plus fenced blocks overlapping none.

    A fence whose content is (or was cut short inside) a bare value is the same region, e.g. a
    ``json`` block whose string holds a raw fence line that closed the block early.
    """
    regions = list(bare)
    j = 0
    for fence in fenced:  # both lists are sorted and internally disjoint
        while j < len(bare) and bare[j].end <= fence.start:
            j += 1
        if j == len(bare) or bare[j].start >= fence.end:
            regions.append(fence)
    return regions


def _walk_value(text: str, start: int) -> tuple[int, int, bool]:
    """Follow the value opening at ``start``; return (end, max depth, closed).

    ``end`` is exclusive. A closer of the wrong kind ends the value there (it will fail to parse);
    a value that never closes returns ``closed=False``. Each character is visited once.
    """
    stack = [text[start]]
    depth = 1
    pos = start + 1
    while stack:
        m = _VALUE_STOPS.search(text, pos)
        if m is None:
            return len(text), depth, False
        ch, pos = m.group(), m.end()
        if ch == '"':
            while True:
                s = _STRING_STOPS.search(text, pos)
                if s is None:
                    return len(text), depth, False
                if s.group() == "\\":
                    pos = s.end() + 1
                    continue
                pos = s.end()
                break
        elif ch in "{[":
            stack.append(ch)
            depth = max(depth, len(stack))
        elif _CLOSER[stack[-1]] == ch:
            stack.pop()
        else:
            break
    return pos, depth, True


def _scan_prose(text: str, opener: str, fences: tuple[list[_Fence], list[tuple[int, int]]]) -> _ScanResult:
    """Collect balanced top-level values starting with ``opener`` (module docstring has the rules)."""
    skips: list[tuple[int, int]] = list(fences[1])
    for fence in fences[0]:
        if fence.is_json:
            skips += [(fence.open_start, fence.open_end), (fence.close_start, fence.close_end)]
        else:
            skips.append((fence.open_start, fence.close_end))
    skips.sort()
    skip_starts = [s for s, _ in skips]

    runs: dict[int, list[int]] = {}
    for backticks in _BACKTICK_RUN.finditer(text):
        k = bisect.bisect_right(skip_starts, backticks.start()) - 1
        if k < 0 or backticks.start() >= skips[k][1]:  # runs on fence lines are not inline code
            runs.setdefault(backticks.end() - backticks.start(), []).append(backticks.start())
    blank_lines = [m.start() for m in _BLANK_LINE.finditer(text)]

    result = _ScanResult([], 0, None)
    n = len(text)
    pos = 0
    skip_index = 0
    # An unclosed quote at p means every later quote of that kind on p's line is unclosed too.
    quote_fails_before = {'"': -1, "\u201c": -1}
    while pos < n:
        next_skip = skips[skip_index][0] if skip_index < len(skips) else n
        if pos >= next_skip:
            pos = max(pos, skips[skip_index][1])
            skip_index += 1
            continue
        m = _PROSE_STOPS.search(text, pos, next_skip)
        if m is None:
            pos = next_skip
            continue
        ch, at = m.group(), m.start()
        if ch in "{[":
            end, depth, closed = _walk_value(text, at)
            if not closed:
                result.unclosed_at = at
                break
            if ch != opener:
                result.other_type += 1
            elif at == 0 or text[at - 1] not in _QUOTE_BEFORE_VALUE:
                result.candidates.append(_Candidate(at, end, depth))
            pos = end
        elif ch == "`":
            run_end = at + 1
            while run_end < n and text[run_end] == "`":
                run_end += 1
            bound = min(next_skip, _next_after(blank_lines, at, n))
            same = runs.get(run_end - at, [])
            k = bisect.bisect_right(same, at)
            pos = same[k] + (run_end - at) if k < len(same) and same[k] < bound else run_end
        else:  # '"' or '\u201c'
            pos = at + 1
            if at > quote_fails_before[ch]:
                close = _quote_close(text, at + 1, '"' if ch == '"' else "\u201d")
                if close is None:
                    line_end = text.find("\n", at)
                    quote_fails_before[ch] = n if line_end < 0 else line_end
                else:
                    pos = close
    return result


def _quote_close(text: str, pos: int, closing: str) -> int | None:
    """Offset just past the quote closing a prose quotation on this line, or None."""
    if closing != '"':
        line_end = text.find("\n", pos)
        close = text.find(closing, pos, len(text) if line_end < 0 else line_end)
        return None if close < 0 else close + 1
    while True:
        m = _QUOTE_CLOSE.search(text, pos)
        if m is None or m.group() == "\n":
            return None
        if m.group() == '"':
            return m.end()
        if text.startswith("\n", m.end()):
            return None
        pos = m.end() + 1


def _next_after(positions: list[int], at: int, default: int) -> int:
    k = bisect.bisect_right(positions, at)
    return positions[k] if k < len(positions) else default


# --- parsing and validation -------------------------------------------------------------------


class _Rejected(ValueError):
    """A candidate is valid JSON syntax but outside what we accept (huge integers, NaN)."""


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"integer longer than {MAX_INT_DIGITS} digits")
    return int(digits)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise _Rejected("number out of range (overflows to infinity)")
    return value


def _reject_constant(name: str) -> Any:
    raise _Rejected(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_reject_constant)


def _try_candidate(raw: str, depth: int | None, schema: type[BaseModel] | None) -> Any:
    """Parse and validate one candidate's text; return the value or a ``_Failure``."""
    if depth is None:
        depth = _walk_value(raw, 0)[1]
    if depth > MAX_DEPTH:
        return _Failure(raw, f"nested too deeply (more than {MAX_DEPTH} levels)")
    try:
        value = _DECODER.decode(raw)
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        return _Failure(raw, reason, max(0, min(exc.pos - EXCERPT_CHARS // 2, len(raw) - EXCERPT_CHARS)))
    except (ValueError, RecursionError) as exc:  # _Rejected from the hooks is a ValueError
        return _Failure(raw, str(exc) or type(exc).__name__)
    if schema is None:
        return value
    try:
        return schema.model_validate(value)
    except ValidationError as exc:
        return _Failure(raw, exc)


def _summarise(exc: ValidationError, limit: int = 3) -> str:
    """``loc: msg`` for the first few errors; pydantic's input values are deliberately left out."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in errors[:limit]]
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts)[:500] + more


def _repair(raw: str) -> str:
    """Drop trailing commas and escape raw control characters inside strings; nothing else."""

    def fix(m: re.Match[str]) -> str:
        token = m.group()
        if token == ",":
            return ""
        return _CONTROL_CHAR.sub(lambda c: _CONTROL_ESCAPES.get(c.group(), f"\\u{ord(c.group()):04x}"), token)

    return _REPAIR_TOKEN.sub(fix, raw)


def _failure_error(
    text: str,
    expect: str,
    scan: _ScanResult,
    candidates: list[_Candidate],
    failures: list[_Failure],
    repair_note: str,
    stage: str | None,
) -> ParseError:
    summary = ""
    excerpt = text[:EXCERPT_CHARS]
    if failures:
        shown = next((f for f in failures if f.validation), failures[0])
        tried = f" (tried the first {len(failures)})" if len(failures) < len(candidates) else ""
        summary = f"found {len(candidates)} candidate(s){tried}, none valid: {shown.reason}"
        excerpt = shown.excerpt
    if scan.unclosed_at is not None:
        reason = f"truncated (unbalanced braces): the value at offset {scan.unclosed_at} never closes"
        if summary:
            reason += f"; before it, {summary}"
        excerpt = text[-EXCERPT_CHARS:]
    elif summary:
        reason = summary
    else:
        other = "array" if expect == "object" else "object"
        reason = f"no JSON {expect} found"
        if scan.other_type:
            reason += f" (the reply holds a JSON {other}, expected an {expect})"
    if repair_note:
        reason += f" ({repair_note})"
    return ParseError(reason, excerpt=excerpt, stage=stage)


# --- strict schemas ---------------------------------------------------------------------------

_ANNOTATIONS = ("title", "description", "default", "examples")
_NOT_SCHEMAS = (*_ANNOTATIONS, "enum", "const", "required", "additionalProperties", "$defs")


def _make_strict(node: Any, path: str) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _make_strict(item, f"{path}/{i}")
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "object" or "properties" in node:
        properties: dict[str, Any] = node.get("properties", {})
        extra = node.get("additionalProperties")
        if not properties and (extra is True or isinstance(extra, dict)):
            raise ValueError(f"{path}: a free-form map (dict field) cannot be expressed in a strict schema")
        required = set(node.get("required", []))
        for name, prop in list(properties.items()):
            if name not in required:
                properties[name] = _nullable(prop)
        node["required"] = list(properties)
        node["additionalProperties"] = False
    for key, child in node.items():
        if key in _NOT_SCHEMAS:
            continue
        if key == "properties":
            for name, prop in child.items():
                _make_strict(prop, f"{path}/properties/{name}")
        elif isinstance(child, dict | list):
            _make_strict(child, f"{path}/{key}")


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    if _allows_null(prop):
        return prop
    outer = {k: v for k, v in prop.items() if k in _ANNOTATIONS}
    inner = {k: v for k, v in prop.items() if k not in _ANNOTATIONS}
    return {"anyOf": [inner, {"type": "null"}], **outer}


def _allows_null(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    branches: list[Any] = prop.get("anyOf", []) + prop.get("oneOf", [])
    return any(isinstance(b, dict) and _allows_null(b) for b in branches)


@functools.lru_cache(maxsize=256)
def schema_instruction(model: type[BaseModel]) -> str:
    """The sentence that carries a response schema in the prompt, for servers without structured output.

    Built once per schema class: a structured call sizes its prompt by it several times."""
    try:
        shape = strict_json_schema(model)
    except ValueError:  # a free-form map: the plain schema says the same to a reader
        shape = model.model_json_schema()
    schema = json.dumps(shape, ensure_ascii=False, separators=(",", ":"))
    return (
        "Reply with one JSON object and nothing else. It must match this JSON schema "
        f"(every listed key present; null where a value does not apply):\n{schema}"
    )
