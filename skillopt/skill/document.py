"""The skill document: protected blocks, edits, hashing and diffs.

A skill is one markdown document. It may end with up to two *protected blocks*, in this order::

    <body>

    <!-- SLOW_UPDATE_START -->
    epoch guidance (§4.8)
    <!-- SLOW_UPDATE_END -->

    <!-- APPENDIX_START -->
    execution notes (§4.9)
    <!-- APPENDIX_END -->

The body may hold several files of an Agent Skills folder, each after a ``<!-- FILE: <path> -->``
line (``skill_files``); an edit names the file it changes and works inside it.

Edits (patch mode) only ever change the body; the blocks are written by their own stages
(``inject_block`` / ``replace_block``) and survive full rewrites (``restore_protected``).

Canonical form. ``SkillDocument`` normalises what it holds, and every function here that
returns a skill returns its canonical rendering:

- the body keeps its text but loses trailing whitespace;
- a block's content is stripped of surrounding whitespace ("" = present but empty, None = absent);
- protected-block markers never appear in the body or inside a block's content (they are removed);
- rendering is the body, then each present block as ``\\n\\n<!-- X_START -->\\n{content}\\n<!-- X_END -->``,
  then one final newline (an entirely empty skill renders as "").

What the target model sees (``target_text``) and what is hashed (``skill_hash``) is the canonical
form with *blank* blocks left out, so injecting an empty block or changing trailing whitespace
never changes the hash and never causes a re-evaluation.

Markers are recognised with optional spaces or tabs inside the comment (``<!--APPENDIX_END-->``),
because models rewriting a skill sometimes drop them; the renderer always writes the exact form.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

from skillopt.core.errors import SkillFormatError
from skillopt.skill.files import (
    SKILL_MD,
    has_file_markers,
    join_files,
    normalise_path,
    split_files,
    strip_file_markers,
)

__all__ = [
    "APPENDIX",
    "APPLY_STATUSES",
    "EDIT_OPS",
    "PROTECTED_BLOCKS",
    "SLOW_UPDATE",
    "ApplyReport",
    "ApplyStatus",
    "Edit",
    "EditOp",
    "EditOutcome",
    "SkillDocument",
    "apply_edits",
    "block_markers",
    "extract_block",
    "inject_block",
    "replace_block",
    "restore_protected",
    "skill_hash",
    "strip_markers",
    "target_text",
    "unified_diff",
]

SLOW_UPDATE = "SLOW_UPDATE"
APPENDIX = "APPENDIX"
# The required order of the protected blocks at the end of a skill.
PROTECTED_BLOCKS: tuple[str, ...] = (SLOW_UPDATE, APPENDIX)

_FIELD_OF_BLOCK = {SLOW_UPDATE: "slow_update", APPENDIX: "appendix"}

# Spaces and tabs only, never a newline: the renderer puts line breaks around every marker, so a
# marker can never be formed by accident across the boundary of a body, a content and a marker.
_MARKER_RE = re.compile(
    r"<!--[ \t]*(" + "|".join(map(re.escape, PROTECTED_BLOCKS)) + r")_(START|END)[ \t]*-->"
)


def block_markers(name: str) -> tuple[str, str]:
    """The exact ``(start, end)`` markers of protected block ``name`` (``SLOW_UPDATE`` or ``APPENDIX``)."""
    _check_block_name(name)
    return f"<!-- {name}_START -->", f"<!-- {name}_END -->"


def strip_markers(text: str) -> str:
    """``text`` with every protected-block marker removed (repeatedly, until none is left)."""
    # Repeat: removing one marker can join its neighbours into a new one ("<!-- APP<marker>ENDIX_END -->").
    while True:
        text, removed = _MARKER_RE.subn("", text)
        if not removed:
            return text


def _check_block_name(name: str) -> None:
    if name not in PROTECTED_BLOCKS:
        raise ValueError(f"unknown protected block {name!r}; expected one of {', '.join(PROTECTED_BLOCKS)}")


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# --------------------------------------------------------------------------------------------------
# The document


@dataclass(frozen=True, slots=True)
class SkillDocument:
    """A skill split into its body and its protected blocks, held in canonical form.

    ``slow_update`` / ``appendix`` are None when the block is absent and "" when it is present but
    empty. Construction normalises the fields (see the module docstring), so two documents that
    render the same compare equal and ``SkillDocument.parse(doc.text) == doc`` for every document.
    """

    body: str = ""
    slow_update: str | None = None
    appendix: str | None = None

    def __post_init__(self) -> None:
        # Normalising here (not only in parse) keeps the invariants for documents built in code.
        object.__setattr__(self, "body", strip_markers(self.body).rstrip())
        for field in _FIELD_OF_BLOCK.values():
            content = getattr(self, field)
            if content is not None:
                object.__setattr__(self, field, strip_markers(content).strip())

    @classmethod
    def parse(cls, text: str) -> SkillDocument:
        """Split ``text`` into body and protected blocks.

        Raises ``SkillFormatError`` (naming the marker and line) when a marker appears more than
        once, a block's START has no END or its END comes first, the blocks are out of order or
        nested, or anything other than whitespace follows or separates the blocks.
        """
        seen: dict[tuple[str, str], re.Match[str]] = {}
        for match in _MARKER_RE.finditer(text):
            key = (match.group(1), match.group(2))
            if key in seen:
                raise SkillFormatError(
                    f"protected-block marker {match.group(0)!r} appears more than once "
                    f"(lines {_line_of(text, seen[key].start())} and {_line_of(text, match.start())}); "
                    "each protected block may appear at most once"
                )
            seen[key] = match

        blocks: list[tuple[str, re.Match[str], re.Match[str]]] = []
        for name in PROTECTED_BLOCKS:
            start, end = seen.get((name, "START")), seen.get((name, "END"))
            start_marker, end_marker = block_markers(name)
            if start is None and end is None:
                continue
            if start is None:
                assert end is not None
                raise SkillFormatError(
                    f"{end_marker} at line {_line_of(text, end.start())} has no matching {start_marker}"
                )
            if end is None:
                raise SkillFormatError(
                    f"{start_marker} at line {_line_of(text, start.start())} is never closed by {end_marker}"
                )
            if end.start() < start.start():
                raise SkillFormatError(
                    f"{end_marker} at line {_line_of(text, end.start())} comes before "
                    f"{start_marker} at line {_line_of(text, start.start())}"
                )
            blocks.append((name, start, end))

        for (first, _, first_end), (second, second_start, _) in zip(blocks, blocks[1:], strict=False):
            if second_start.start() < first_end.end():
                raise SkillFormatError(
                    f"protected blocks are out of order or nested: the {first} block must be closed "
                    f"before the {second} block opens (line {_line_of(text, second_start.start())}); "
                    f"required order: {', then '.join(PROTECTED_BLOCKS)}"
                )

        for position, (name, _, end) in enumerate(blocks):
            stop = blocks[position + 1][1].start() if position + 1 < len(blocks) else len(text)
            gap = text[end.end() : stop]
            if gap.strip():
                offset = end.end() + len(gap) - len(gap.lstrip())
                raise SkillFormatError(
                    f"text after the {name} block at line {_line_of(text, offset)}; protected blocks "
                    "must be the last thing in a skill"
                )

        body = text[: blocks[0][1].start()] if blocks else text
        contents = {_FIELD_OF_BLOCK[name]: text[start.end() : end.start()] for name, start, end in blocks}
        return cls(body=body, **contents)

    def block(self, name: str) -> str | None:
        """The content of protected block ``name``: None if absent, "" if present but empty."""
        _check_block_name(name)
        content: str | None = getattr(self, _FIELD_OF_BLOCK[name])
        return content

    def with_block(self, name: str, content: str | None) -> SkillDocument:
        """A copy with block ``name`` set to ``content`` (markers removed); None removes the block."""
        _check_block_name(name)
        if name == SLOW_UPDATE:
            return replace(self, slow_update=content)
        return replace(self, appendix=content)

    @property
    def text(self) -> str:
        """The full canonical document, empty blocks included."""
        return self._render(omit_blank=False)

    @property
    def target_text(self) -> str:
        """What the target model sees: the canonical document without its blank blocks."""
        return self._render(omit_blank=True)

    def _render(self, *, omit_blank: bool) -> str:
        parts = [self.body] if self.body else []
        for name in PROTECTED_BLOCKS:
            content = self.block(name)
            if content is None or (omit_blank and not content):
                continue
            start, end = block_markers(name)
            parts.append(f"{start}\n{content}\n{end}")
        return "\n\n".join(parts) + "\n" if parts else ""


def target_text(text: str) -> str:
    """The skill as shown to the target model: canonical form with empty protected blocks omitted.

    Raises ``SkillFormatError`` for malformed markers.
    """
    return SkillDocument.parse(text).target_text


def skill_hash(text: str) -> str:
    """sha256 hex digest of ``target_text(text)``: the identity used for caching and comparison.

    Adding or removing an empty protected block, or changing trailing whitespace, keeps the hash;
    any change the target would see changes it. Raises ``SkillFormatError`` for malformed markers.
    """
    # surrogatepass: a lone surrogate from decoded JSON must hash, not crash a training step.
    return hashlib.sha256(target_text(text).encode("utf-8", "surrogatepass")).hexdigest()


def inject_block(text: str, name: str, content: str = "") -> str:
    """Ensure protected block ``name`` exists, creating it with ``content`` if absent.

    An existing block keeps its content (so re-injecting at epoch start never wipes guidance; use
    ``replace_block`` to change it). Returns the canonical text; the body is never touched.
    """
    document = SkillDocument.parse(text)
    if document.block(name) is not None:
        return document.text
    return document.with_block(name, content).text


def extract_block(text: str, name: str) -> str | None:
    """The content of protected block ``name`` in ``text``: None if absent, "" if empty."""
    return SkillDocument.parse(text).block(name)


def replace_block(text: str, name: str, content: str) -> str:
    """Set the content of protected block ``name``, creating it in its required place if absent.

    Markers inside ``content`` are removed. Returns the canonical text; the body is never touched.
    """
    return SkillDocument.parse(text).with_block(name, content).text


# --------------------------------------------------------------------------------------------------
# Edits

EditOp = Literal["append", "insert_after", "replace", "delete"]
EDIT_OPS: tuple[str, ...] = get_args(EditOp)
#: An edit's op as a reply carries it: any text (checked when the edit is applied), but the schema sent to
#: constrained decoders lists the ops, so a server that enforces it writes one of them.
OpText = Annotated[str, Field(json_schema_extra={"enum": list(EDIT_OPS)})]

ApplyStatus = Literal[
    "applied",
    "applied_fuzzy",
    "skipped_target_not_found",
    "skipped_ambiguous_target",
    "skipped_protected",
    "skipped_unknown_op",
    "error",
]
APPLY_STATUSES: tuple[str, ...] = get_args(ApplyStatus)


class Edit(BaseModel):
    """One proposed change to one file of a skill's body.

    ``op`` is kept as free text so that an unknown op from an optimizer reply is reported at apply
    time (``skipped_unknown_op``) instead of failing the whole patch; it is normalised to lower
    case with ``-`` and spaces turned into ``_`` ("Insert-After" -> "insert_after"). ``target`` is
    the exact text anchor (unused by ``append``); a JSON null target or content reads as "".
    ``file`` names the skill file the edit addresses (``SKILL.md`` when absent or null): the anchor is
    searched only there and ``append`` adds to the end of that file.
    """

    model_config = ConfigDict(extra="ignore")

    op: OpText
    target: str = ""
    content: str = ""
    support_count: int = Field(default=1, ge=0)
    source: Literal["failure", "success"] = "failure"
    merge_level: int = Field(default=0, ge=0)
    file: str = SKILL_MD

    @field_validator("file", mode="before")
    @classmethod
    def _normalise_file(cls, value: Any) -> Any:
        return normalise_path(value) if value is None or isinstance(value, str) else value

    @field_validator("op", mode="before")
    @classmethod
    def _normalise_op(cls, value: Any) -> Any:
        if isinstance(value, str):
            return re.sub(r"[\s-]+", "_", value.strip().lower())
        return value

    @field_validator("target", "content", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        # Optimizers often write "target": null for append; that means "no target", not a bad edit.
        return "" if value is None else value


class EditOutcome(BaseModel):
    """What happened to one edit: its position in the input list, its op, status and a reason."""

    index: int
    op: str
    status: ApplyStatus
    detail: str = ""
    file: str = SKILL_MD


class ApplyReport(BaseModel):
    """The outcome of every edit given to ``apply_edits``, in input order, with counts per status."""

    entries: list[EditOutcome] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """How many edits ended with each status (every status listed, zeros included)."""
        return {status: sum(entry.status == status for entry in self.entries) for status in APPLY_STATUSES}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def n_applied(self) -> int:
        """Edits that changed the skill (``applied`` plus ``applied_fuzzy``)."""
        return sum(entry.status in ("applied", "applied_fuzzy") for entry in self.entries)


def apply_edits(text: str, edits: Iterable[Edit]) -> tuple[str, ApplyReport]:
    """Apply ``edits`` in order, each to the result of the previous one.

    Returns the canonical new skill and a report with one entry per edit. A bad edit never raises:
    it gets a ``skipped_*`` or ``error`` status and leaves the skill unchanged. Only the body is
    ever changed; protected blocks come out exactly as they went in. Each edit works inside the file
    it names (``skill_files``): its anchor is searched there only, and a file the skill does not
    hold is ``skipped_target_not_found`` (in a skill of one file, every edit addresses that file);
    file markers never change. Ops:

    - ``append``: ``content`` goes at the end of the body, after a blank line.
    - ``insert_after``: ``content`` goes on new line(s) right after the line holding the end of
      ``target``; a missing anchor is ``skipped_target_not_found`` (never turned into an append).
    - ``replace`` / ``delete``: ``target`` is replaced by ``content`` / removed.

    Matching: exact substring first (``applied``); if absent, a whitespace-insensitive match where
    each whitespace run of ``target`` matches any whitespace run (``applied_fuzzy``). More than one
    occurrence (overlapping ones counted) is ``skipped_ambiguous_target``; an occurrence that
    touches a protected block, or a target containing a marker, is ``skipped_protected``. Markers
    in ``content`` are removed. A blank target (non-append op) or blank content (append,
    insert_after) is ``error``. Raises ``SkillFormatError`` only if ``text`` itself is malformed.
    """
    document = SkillDocument.parse(text)
    entries: list[EditOutcome] = []
    only = list(split_files(document.body))
    for index, edit in enumerate(edits):
        if len(only) == 1 and edit.file not in only:
            # A skill of one file has one place an edit can go, whatever file a reply named (small models
            # invent file names: "nachos-1.png").
            edit = edit.model_copy(update={"file": only[0]})
        new_body, status, detail = _apply_in_file(document, edit)
        if new_body is not None:
            document = replace(document, body=new_body)
        entries.append(EditOutcome(index=index, op=edit.op, status=status, detail=detail, file=edit.file))
    return document.text, ApplyReport(entries=entries)


def _apply_in_file(document: SkillDocument, edit: Edit) -> tuple[str | None, ApplyStatus, str]:
    """The new body (None = unchanged), the status and a detail for one edit, applied inside its file.

    The file's text is edited as a document of its own (``SKILL.md`` keeps the protected blocks, which
    follow it in the rendering), then the body is joined again.
    """
    files = split_files(document.body)
    if edit.file not in files:
        return None, "skipped_target_not_found", (
            f"the skill has no file {edit.file!r}; its files: {', '.join(files)}")
    if has_file_markers(edit.target):
        return None, "skipped_protected", "target contains a file marker line"
    if edit.file == SKILL_MD:
        part = replace(document, body=files[SKILL_MD])
    else:
        part = SkillDocument(body=files[edit.file])
    scoped = edit.model_copy(update={"content": strip_file_markers(edit.content)})
    new_text, status, detail = _apply_one(part, scoped)
    if new_text is None:
        return None, status, detail
    if has_file_markers(new_text):
        return None, "skipped_protected", "the edit would create a file marker line"
    if len(files) == 1:
        return new_text, status, detail  # a single-file skill: its body is the file
    files[edit.file] = new_text
    return join_files(files), status, detail


def _apply_one(document: SkillDocument, edit: Edit) -> tuple[str | None, ApplyStatus, str]:
    """The new body (None = unchanged), the status and a detail for one edit."""
    if edit.op not in EDIT_OPS:
        return None, "skipped_unknown_op", f"unknown op {edit.op!r}; expected one of {', '.join(EDIT_OPS)}"

    content = strip_markers(edit.content)
    body = document.body
    if edit.op in ("append", "insert_after") and not content.strip():
        return None, "error", f"{edit.op} needs non-empty content"
    if edit.op == "append":
        addition = content.strip("\n")
        return (f"{body}\n\n{addition}" if body else addition), "applied", ""

    if not edit.target.strip():
        return None, "error", f"{edit.op} needs a non-empty target"
    if _MARKER_RE.search(edit.target):
        return None, "skipped_protected", "target contains a protected-block marker"

    status, detail, span = _locate(document, edit.target)
    if span is None:
        return None, status, detail
    start, end = span
    if edit.op == "replace":
        new_body = body[:start] + content + body[end:]
    elif edit.op == "delete":
        new_body = body[:start] + body[end:]
    else:  # insert_after: after the newline that ends the line holding the target's last character
        line_end = body.find("\n", end - 1)
        insertion = content.strip("\n")
        if line_end == -1:
            new_body = f"{body}\n{insertion}"
        else:
            new_body = body[: line_end + 1] + insertion + "\n" + body[line_end + 1 :]

    # Splicing can join the text on either side into a marker; that would corrupt the blocks.
    if _MARKER_RE.search(new_body):
        return None, "skipped_protected", "the edit would create a protected-block marker in the body"
    return new_body, status, detail


def _locate(document: SkillDocument, target: str) -> tuple[ApplyStatus, str, tuple[int, int] | None]:
    """Find the one place ``target`` names in the body, or say why there is none.

    Targets are searched in the full canonical text so that an occurrence inside (or spanning into)
    a protected block is seen and refused, not silently ignored in favour of a body occurrence.
    """
    full = document.text
    marker = _MARKER_RE.search(full)
    protected_from = marker.start() if marker else len(full)

    spans = _exact_spans(full, target)
    status: ApplyStatus = "applied"
    if not spans:
        spans = _fuzzy_spans(full, target)
        status = "applied_fuzzy"
    if not spans:
        return (
            "skipped_target_not_found",
            "target not found in the skill (exact or whitespace-insensitive)",
            None,
        )
    if any(end > protected_from for _, end in spans):
        return "skipped_protected", "target overlaps a protected block", None
    if len(spans) > 1:
        how = "exactly" if status == "applied" else "whitespace-insensitively"
        return (
            "skipped_ambiguous_target",
            f"target occurs {len(spans)} times ({how}); it must name one place",
            None,
        )
    start, end = spans[0]
    # Between the body and the first block (or the final newline) there is only whitespace; a match
    # may run into it, and that part is not body text.
    body_end = len(document.body)
    detail = "" if status == "applied" else "matched ignoring whitespace differences"
    return status, detail, (min(start, body_end), min(end, body_end))


def _exact_spans(text: str, target: str) -> list[tuple[int, int]]:
    spans = []
    position = text.find(target)
    while position != -1:
        spans.append((position, position + len(target)))
        position = text.find(target, position + 1)  # +1, not +len: overlapping occurrences count
    return spans


def _fuzzy_spans(text: str, target: str) -> list[tuple[int, int]]:
    pattern = r"\s+".join(map(re.escape, target.split()))
    # A lookahead finds a match at every start position, so overlapping occurrences count too.
    return [(match.start(1), match.end(1)) for match in re.finditer(f"(?=({pattern}))", text)]


# --------------------------------------------------------------------------------------------------
# Full rewrites and diffs


def restore_protected(original_text: str, rewritten_text: str) -> tuple[str, bool]:
    """Keep a model's rewritten body and the original's protected blocks exactly.

    Every protected block in ``rewritten_text`` (a START..END pair of one block, wherever it is) is
    dropped, along with stray markers and leading blank lines; text outside those pairs stays in
    the body. Returns the
    canonical result and whether anything had to be restored: True when the rewrite's blocks differ
    from the original's (lost, altered, added, moved or malformed). Raises ``SkillFormatError``
    only if ``original_text`` is malformed.
    """
    original = SkillDocument.parse(original_text)
    try:
        rewritten = SkillDocument.parse(rewritten_text)
        intact = (rewritten.slow_update, rewritten.appendix) == (original.slow_update, original.appendix)
    except SkillFormatError:
        intact = False
    body = rewritten_text
    for name in PROTECTED_BLOCKS:
        body = _block_pair_re(name).sub("", body)
    # A block removed from the top leaves blank lines there; the constructor removes unpaired markers.
    body = re.sub(r"\A\s*\n", "", body)
    restored = SkillDocument(body=body, slow_update=original.slow_update, appendix=original.appendix)
    return restored.text, not intact


def _block_pair_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!--[ \t]*{name}_START[ \t]*-->.*?<!--[ \t]*{name}_END[ \t]*-->", re.DOTALL)


def unified_diff(old: str, new: str, old_name: str = "current", new_name: str = "candidate") -> str:
    """A unified diff from ``old`` to ``new`` (3 lines of context); "" when they are equal."""
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, lineterm=""
    )
    diff = "\n".join(lines)
    return diff + "\n" if diff else ""
