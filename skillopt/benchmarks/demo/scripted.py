"""The demo world's scripted models: a target and an optimizer, written as handlers.

- ``target`` reads the system message (which holds the skill), applies exactly the rules it
  states (``world.read_style``), and answers the question it finds in the user messages. Under a
  ``## Training readout`` section (the deep probe) it first writes one ``Readout:`` line naming
  the rules it applied; the answer does not change.
- The optimizer handlers read the stage messages' sections (``## Current skill``, the budget,
  ``## Step buffer``, ``## Trajectories``, ``## Patches to merge``, ``## Candidate edits`` /
  ``## Candidate suggestions``, ``## Selected suggestions``, ``## Proposed …``) and answer with the
  structured reply objects. The analyst turns the ``Conventions:`` lines of failed trajectories'
  evaluation events into general rules, removes a harmful line that overrides a stated
  convention, and — on a seeded ~30% of calls — adds a harmful or useless rule, so the gate has
  something to reject. By mode (``tags["mode"]``, else read from the message):

  - ``patch``: ``append`` / ``delete`` edits, at most the edit budget;
  - ``rewrite_from_suggestions``: ``add_rule`` / ``remove_rule`` suggestions quoting the line, at
    most the suggestion budget; suggestion merges dedupe, ranking prefers support then priority,
    and ``rewrite`` applies the selected suggestions and summarises the changes;
  - ``full_rewrite_minibatch``: the whole skill with the rules added and the harmful lines gone;
    skill merges take the union of the documents' lines.

  Rewrites drop the protected blocks now and then (``DROP_RATE``, and every full rewrite of a
  skill that states no convention yet, i.e. the first steps of a run), so restoring them is
  exercised. ``lr`` counts the proposals that add a convention the skill lacks (or remove a
  harmful line); ``deep_probe`` asks for the readout line.

Every handler is a pure function of ``(request, seed)``; a missing section means an empty, valid
reply, never an exception. ``demo_rule_set`` builds the ``demo`` built-in set; stages it does not
script (``judge``, ``preflight``) fall back to ``auto``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from skillopt.benchmarks.demo.world import (
    CONVENTIONS,
    HARMFUL_RULES,
    RULES,
    USELESS_RULES,
    format_answer,
    lines_stating,
    parse_question,
    read_style,
)
from skillopt.llm.base import BackendContext
from skillopt.llm.chat import ChatRequest
from skillopt.llm.scripted import Answer, AutoRules, NoAnswer, RuleTable, parse_rules
from skillopt.skill.document import SkillDocument, restore_protected

#: Share of analyst calls that add a harmful or useless edit (hashed from the seed and the item ids).
NOISE_RATE = 0.3
#: Share of rewrites (full-rewrite analysts, the rewrite call) that lose the protected blocks.
DROP_RATE = 0.2
#: The budget assumed when an analyst message has no budget section.
DEFAULT_EDIT_BUDGET = 4
#: What the deep probe asks the target to write, and the heading the runner puts it under.
PROBE_INSTRUCTION = (
    "Before your final answer, write one line `Readout: <which answer conventions you applied>`, "
    "then answer exactly as before."
)
READOUT_HEADING = "## Training readout"

Mode = Literal["patch", "rewrite_from_suggestions", "full_rewrite_minibatch"]

_HEADINGS = (
    "Current skill", "Skill files", "Edit budget", "Suggestion budget", "Step buffer", "Optimizer memory",
    "Meta skill", "Trajectories", "Patches to merge", "Candidate edits", "Candidate suggestions",
    "Selected suggestions", "Step scores", "Proposed edits", "Proposed suggestions",
)
_HEADING_RE = re.compile(r"^## (" + "|".join(map(re.escape, _HEADINGS)) + r")\b.*$", re.MULTILINE)
_TRAJECTORY_RE = re.compile(r"^### Trajectory \d+: id `([^`]+)`", re.MULTILINE)
_CONVENTIONS_RE = re.compile(r"Conventions:([^\n]*)")
_READOUT_RE = re.compile(r"Readout: ([^/\n<]*)")
_MARK_RE = re.compile(r"\b(\w+)=(ok|missing)\b")
_BUDGET_RE = re.compile(r"at most (\d+) (?:edits?|suggestions?)")
_PATCH_RE = re.compile(r"^### Patch \d+ \(source: (\w+), support: (\d+)\)", re.MULTILINE)
_FENCE_RE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)
_MARKDOWN_FENCE_RE = re.compile(r"^(`{3,})markdown\n(.*?)\n\1$", re.DOTALL | re.MULTILINE)
_POOL_BUDGET_RE = re.compile(r"^## Candidate (?:edits|suggestions) \(budget\s*=\s*(\d+)\)", re.MULTILINE)
_POOL_LINE_RE = re.compile(r"^\[(\d+)\]\s*(.*)$", re.MULTILINE)
_AVAILABLE_RE = re.compile(r"^## Proposed (?:edits|suggestions) \(available\s*=\s*(\d+)\)", re.MULTILINE)
_FAILED_RE = re.compile(r"(\d+) of (\d+) items failed")
_QUOTED_LINE_RE = re.compile(r'"(-[^"\n]*)"')
_COUNT_RE = r"^\s*{}\s*:\s*(\d+)"
_CONVENTION_NAMES = frozenset(rule.name for rule in CONVENTIONS)
_HARMFUL_NAMES = frozenset(rule.name for rule in HARMFUL_RULES)
_ORDER = {rule.name: index for index, rule in enumerate(CONVENTIONS)}


# ----------------------------------------------------------------------------------- the target


def target(request: ChatRequest, seed: int) -> str:
    """Answer the demo question, formatted with exactly the rules the system message states; with a
    training readout requested, name those rules on a ``Readout:`` line first."""
    style = read_style(request.system_text())
    readout = any(
        message.role == "user" and READOUT_HEADING in message.text() for message in request.messages
    )
    # The question is in the first user message; later turns (self-check feedback) only restate it.
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        problem = parse_question(message.text())
        if problem is not None:
            active = style.active(problem.task_type) - overlooked(request.system_text())
            answer = format_answer(problem, active)
            applied = ", ".join(name for name in RULES if name in active) or "none"
            line = f"Readout: conventions applied: {applied}\n" if readout else ""
            return f"{problem.working}.\n{line}<answer>{answer}</answer>"
    return "I cannot find a question I know how to solve.\n<answer>unknown</answer>"


#: A rule the target overlooks when the skill body states it, until a reminder sits in a protected
#: block (execution notes in the appendix, or slow-update guidance): "the rule exists but was not
#: followed", the failure the execution-notes appendix is for.
OVERLOOKED_UNLESS_REMINDED = ("thousands_comma",)
_PROTECTED_RE = re.compile(r"<!-- (SLOW_UPDATE|APPENDIX)_START -->(.*?)<!-- \1_END -->", re.DOTALL)


def overlooked(system_text: str) -> frozenset[str]:
    """The rules in ``OVERLOOKED_UNLESS_REMINDED`` that no protected block of the skill repeats."""
    reminders = "\n".join(match.group(2) for match in _PROTECTED_RE.finditer(system_text))
    return frozenset(name for name in OVERLOOKED_UNLESS_REMINDED if not lines_stating(reminders, name))


# ---------------------------------------------------------------------------- reading messages


def section(text: str, heading: str) -> str | None:
    """The body of ``## <heading>`` up to the next known heading; None when absent.

    Only the stage headings in ``_HEADINGS`` end a section, so a skill with its own ``##``
    headings stays whole inside ``## Current skill``.
    """
    matches = list(_HEADING_RE.finditer(text))
    for position, match in enumerate(matches):
        if match.group(1) == heading:
            end = matches[position + 1].start() if position + 1 < len(matches) else len(text)
            return text[match.end():end].strip("\n")
    return None


@dataclass(frozen=True)
class Trajectory:
    """One trajectory block: its item id, the conventions its evaluation event marked and the
    target's readout line, if the deep probe asked for one."""

    item_id: str
    marks: dict[str, bool]
    readout: str | None = None

    @property
    def missing(self) -> list[str]:
        return [name for name, ok in self.marks.items() if not ok]


def trajectories(text: str) -> list[Trajectory]:
    """The trajectory blocks of an optimizer message, each with its last ``Conventions:`` line."""
    found = []
    starts = list(_TRAJECTORY_RE.finditer(text))
    for position, match in enumerate(starts):
        end = starts[position + 1].start() if position + 1 < len(starts) else len(text)
        lines = _CONVENTIONS_RE.findall(text[match.end():end])
        marks = {name: mark == "ok" for name, mark in _MARK_RE.findall(lines[-1])} if lines else {}
        readouts = _READOUT_RE.findall(text[match.end():end])
        found.append(Trajectory(match.group(1), {k: v for k, v in marks.items() if k in _CONVENTION_NAMES},
                                (readouts[-1].strip() or None) if readouts else None))
    return found


def _budget(text: str) -> int:
    budget = section(text, "Edit budget") or section(text, "Suggestion budget") or ""
    found = _BUDGET_RE.search(budget)
    return int(found.group(1)) if found else DEFAULT_EDIT_BUDGET


def _fraction(seed: int, *parts: Any) -> float:
    """A deterministic number in [0, 1) from the seed and ``parts``."""
    digest = hashlib.sha256(json.dumps([seed, *parts], default=str).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _mentioned(content: str, text: str) -> bool:
    """Whether ``content`` appears in ``text`` as written or JSON-escaped."""
    content = content.strip()
    return bool(content) and (content in text or json.dumps(content)[1:-1] in text)


def _current_skill(text: str) -> str:
    skill = section(text, "Current skill") or ""
    return "" if skill.strip() == "(empty)" else skill


def _document(skill: str) -> SkillDocument:
    """``skill`` as a document; a malformed one keeps its body and loses its blocks."""
    try:
        return SkillDocument.parse(skill)
    except ValueError:
        return SkillDocument.parse(restore_protected("", skill)[0])


def _with_lines(
    document: SkillDocument, *, add: Iterable[str] = (), remove: Iterable[str] = ()
) -> SkillDocument:
    """``document`` with the body lines equal to one of ``remove`` gone and ``add`` appended (each
    line only if the body does not hold it yet)."""
    removed = {line.strip() for line in remove}
    lines = [line for line in document.body.splitlines() if line.strip() not in removed]
    present = {line.strip() for line in lines}
    new = [line for line in dict.fromkeys(add) if line.strip() not in present]
    return SkillDocument(body="\n".join([*lines, *new]), slow_update=document.slow_update,
                         appendix=document.appendix)


def _without_blocks(document: SkillDocument) -> SkillDocument:
    return SkillDocument(body=document.body)


def _mode(request: ChatRequest, text: str) -> Mode:
    """The skill-update mode of an analyst or merge call: its ``mode`` tag, else read from the
    message (tags do not survive a trip over HTTP)."""
    mode = request.tags.get("mode")
    if mode in ("rewrite_from_suggestions", "full_rewrite_minibatch"):
        return mode
    if request.stage == "analyst":
        if section(text, "Suggestion budget") is not None:
            return "rewrite_from_suggestions"
        if section(text, "Edit budget") is None and '"skill":' in request.system_text():
            return "full_rewrite_minibatch"
        return "patch"
    if _MARKDOWN_FENCE_RE.search(text):
        return "full_rewrite_minibatch"
    return "rewrite_from_suggestions" if '"suggestions":' in text else "patch"


# -------------------------------------------------------------------------------------- analyst


@dataclass(frozen=True)
class Change:
    """One change a failure analyst finds: add a rule line, or remove a harmful one."""

    action: Literal["add", "remove"]
    line: str
    convention: str
    support: int


@dataclass
class Findings:
    """What a failure analyst reads from its trajectories, before it writes any reply."""

    skill: str
    buffer: str
    blocks: list[Trajectory]
    missed: dict[str, list[str]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    diagnosis: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [block.item_id for block in self.blocks]

    def reasoning(self, proposed: str) -> str:
        missed = ", ".join(f"{name} ({len(ids)})" for name, ids in self.missed.items()) or "none"
        return f"{len(self.blocks)} failed trajectories; conventions missed: {missed}. {proposed}"


def _new_phrasing(name: str, skill: str, buffer: str) -> str | None:
    """A phrasing of rule ``name`` not already in the skill and not rejected this epoch."""
    for phrasing in RULES[name].phrasings:
        if not _mentioned(phrasing, skill) and not _mentioned(phrasing, buffer):
            return phrasing
    return None


def _readout_note(blocks: Sequence[Trajectory], ids: Sequence[str]) -> str:
    readouts = sorted({block.readout for block in blocks if block.item_id in ids and block.readout})
    return f" The probe readout says: {'; '.join(readouts)}." if readouts else ""


def read_failures(text: str) -> Findings:
    """The conventions the failed trajectories missed, why (missing, overridden, not followed),
    and the changes that fix them, best-supported first (ties in canonical order)."""
    skill, buffer = _current_skill(text), section(text, "Step buffer") or ""
    findings = Findings(skill, buffer, trajectories(section(text, "Trajectories") or text))
    style = read_style(skill)
    for block in findings.blocks:
        for name in block.missing:
            findings.missed.setdefault(name, []).append(block.item_id)
    changes: list[tuple[int, int, Change]] = []
    for name in sorted(findings.missed, key=lambda n: (-len(findings.missed[n]), _ORDER.get(n, len(_ORDER)))):
        rule, support = RULES[name], findings.missed[name]
        readout = _readout_note(findings.blocks, support)
        if not style.states(name):
            phrasing = _new_phrasing(name, skill, buffer)
            findings.diagnosis.append(
                {
                    "ids": support,
                    "kind": "rule_missing",
                    "description": f"The skill never says that {rule.description}.{readout}",
                }
            )
            if phrasing is not None:
                changes.append((len(support), _ORDER[name], Change("add", phrasing, name, len(support))))
        elif overriding := style.overriding(name):
            harmful_lines = [line for other in overriding for line in lines_stating(skill, other)]
            findings.diagnosis.append({"ids": support, "kind": "rule_conflict",
                                       "description": f"The skill says {rule.description}, but a later rule "
                                                      f"({', '.join(overriding)}) overrides it.{readout}"})
            for line in dict.fromkeys(harmful_lines):
                changes.append((len(support), _ORDER[name], Change("remove", line, name, len(support))))
        else:
            findings.diagnosis.append({"ids": support, "kind": "rule_not_followed",
                                       "description": f"The skill says {rule.description}, yet answers break "
                                                      f"it.{readout}"})
            findings.notes.append(f"Apply the stated rule: {rule.description}.")
    changes.sort(key=lambda c: (-c[0], c[1]))
    findings.changes = [change for _, _, change in changes]
    return findings


def _noise_line(seed: int, ids: Sequence[str], *, kind: str, skill: str, buffer: str,
                proposed: Iterable[str]) -> str | None:
    """On a seeded ~``NOISE_RATE`` of calls, one harmful or useless rule line (never one
    contradicting a rule proposed in the same reply, and never one rejected this epoch)."""
    if _fraction(seed, kind, "noise", sorted(ids)) >= NOISE_RATE:
        return None
    proposed = set(proposed)
    pool = [] if kind == "success" else [
        rule.phrasings[0] for rule in HARMFUL_RULES if not proposed & set(rule.conflicts)
    ]
    pool += list(USELESS_RULES)
    pool = [content for content in pool if not _mentioned(content, skill) and not _mentioned(content, buffer)]
    if not pool:
        return None
    return pool[int(_fraction(seed, kind, "pick", sorted(ids)) * len(pool))]


def _asserted(content: str) -> set[str]:
    return {rule.name for rule in RULES.values() if rule.stated_by(content)}


def analyst(request: ChatRequest, seed: int) -> dict[str, Any]:
    """The analyst of every mode: rules for the conventions failed trajectories missed."""
    text = request.last_user_text()
    kind = "success" if request.tags.get("kind") == "success" else "failure"
    mode = _mode(request, text)
    if kind == "success":
        findings = Findings(_current_skill(text), section(text, "Step buffer") or "",
                            trajectories(section(text, "Trajectories") or text))
    else:
        findings = read_failures(text)
    if mode == "full_rewrite_minibatch":
        return _full_rewrite_reply(seed, findings, kind=kind)
    budget = max(0, _budget(text))
    chosen = findings.changes[:budget] if kind == "failure" else []
    noise = None
    if len(chosen) < budget:
        proposed = {name for change in chosen if change.action == "add" for name in _asserted(change.line)}
        noise = _noise_line(seed, findings.ids, kind=kind, skill=findings.skill, buffer=findings.buffer,
                            proposed=proposed)
    if mode == "rewrite_from_suggestions":
        patch: dict[str, Any] = {"suggestions": [*map(_suggestion, chosen),
                                                 *([_noise_suggestion(noise)] if noise else [])]}
        proposed_text = f"Proposing {len(patch['suggestions'])} of at most {budget} suggestions."
    else:
        edits = [*map(_edit, chosen), *([_append(noise)] if noise else [])]
        patch = {"edits": [_in_file(edit, findings.skill) for edit in edits]}
        proposed_text = f"Proposing {len(patch['edits'])} of at most {budget} edits."
    if kind == "success":
        return _success_reply(findings, patch)
    return {
        "diagnosis": findings.diagnosis,
        "patch": {"reasoning": findings.reasoning(proposed_text), **patch},
        "execution_notes": findings.notes,
    }


#: The reference file a skill folder keeps its answer rules in; rules go there when the skill has it.
RULES_FILE = "references/rules.md"
_FILE_LINE_RE = re.compile(r"^<!-- FILE: ([^\n]*?) -->[ \t]*$", re.MULTILINE)


def _file_holding(skill: str, line: str) -> str | None:
    """The file of a multi-file skill's text (``<!-- FILE: … -->`` sections) whose lines include ``line``;
    None for SKILL.md or a line found nowhere."""
    current = None
    for text_line in skill.splitlines():
        marker = _FILE_LINE_RE.match(text_line)
        if marker:
            current = marker.group(1)
        elif text_line.strip() == line.strip():
            return current
    return None


def _in_file(edit: dict[str, str], skill: str) -> dict[str, str]:
    """``edit`` addressed to the skill's file: a rule added to ``references/rules.md`` when the skill has
    that file, a line deleted from the file holding it. A skill of one file gets the edit unchanged."""
    if not _FILE_LINE_RE.search(skill):
        return edit
    if edit["op"] == "append":
        has_rules_file = any(m.group(1) == RULES_FILE for m in _FILE_LINE_RE.finditer(skill))
        return {"file": RULES_FILE, **edit} if has_rules_file else edit
    holder = _file_holding(skill, edit["target"])
    return {"file": holder, **edit} if holder else edit


def _append(content: str) -> dict[str, str]:
    return {"op": "append", "target": "", "content": content}


def _edit(change: Change) -> dict[str, str]:
    return (
        _append(change.line)
        if change.action == "add"
        else {"op": "delete", "target": change.line, "content": ""}
    )


def _suggestion(change: Change) -> dict[str, Any]:
    rule = RULES[change.convention]
    if change.action == "add":
        return {"type": "add_rule", "title": f"State the {change.convention} convention",
                "motivation": f"{change.support} failed answers break it: {rule.description}.",
                "instruction": f'Add the rule line "{change.line}"', "priority": 1}
    return {"type": "remove_rule", "title": f"Remove the rule that overrides {change.convention}",
            "motivation": f"{change.support} failed answers: a later rule switches off that "
                          f"{rule.description}.",
            "instruction": f'Remove the line "{change.line}"', "priority": 1}


def _noise_suggestion(line: str) -> dict[str, Any]:
    return {"type": "add_rule", "title": "Add a general reminder", "motivation": "It may help some answers.",
            "instruction": f'Add the rule line "{line}"', "priority": 2}


def _success_reply(findings: Findings, patch: dict[str, Any], *, reasoning: str = "") -> dict[str, Any]:
    blocks = findings.blocks
    followed = sorted({name for block in blocks for name, ok in block.marks.items() if ok})
    diagnosis = [
        {
            "ids": [block.item_id for block in blocks],
            "kind": "success_pattern",
            "description": "Answers that follow the stated conventions: " + (", ".join(followed) or "none"),
        }
    ]
    reasoning = f"{len(blocks)} solved trajectories; {reasoning or 'nothing needs to change.'}"
    return {"diagnosis": diagnosis if blocks else [], "patch": {"reasoning": reasoning, **patch},
            "execution_notes": []}


def _drops_blocks(seed: int, *parts: Any) -> bool:
    return _fraction(seed, "drop-blocks", *parts) < DROP_RATE


def _full_rewrite_reply(seed: int, findings: Findings, *, kind: str) -> dict[str, Any]:
    """The whole skill: the current one with every missing convention's rule line added and the
    overriding lines removed (plus, now and then, a harmful or useless line)."""
    adds = [change.line for change in findings.changes if change.action == "add"]
    removes = [change.line for change in findings.changes if change.action == "remove"]
    noise = _noise_line(seed, findings.ids, kind=kind, skill=findings.skill, buffer=findings.buffer,
                        proposed={name for line in adds for name in _asserted(line)})
    document = _with_lines(
        _document(findings.skill), add=[*adds, *([noise] if noise else [])], remove=removes
    )
    # The first steps of a run (no convention stated yet) always lose the blocks; later ones now and then.
    dropped = not read_style(findings.skill).positions or _drops_blocks(seed, kind, sorted(findings.ids))
    if dropped:
        document = _without_blocks(document)
    added = len(adds) + bool(noise)
    reasoning = (f"rewrote the skill: {added} rule line{'s' * (added != 1)} added, {len(removes)} removed"
                 + (" (the protected blocks were left out)." if dropped else "."))
    if kind == "success":
        return _success_reply(findings, {"skill": document.text}, reasoning=reasoning)
    return {"diagnosis": findings.diagnosis,
            "patch": {"reasoning": findings.reasoning(reasoning.capitalize()), "skill": document.text},
            "execution_notes": findings.notes}


# ---------------------------------------------------------------------------------------- merge


def _patch_bodies(text: str) -> list[tuple[str, str]]:
    """``(source, text)`` of each ``### Patch`` block of a merge message."""
    headers = list(_PATCH_RE.finditer(text))
    bodies = []
    for position, header in enumerate(headers):
        end = headers[position + 1].start() if position + 1 < len(headers) else len(text)
        source = header.group(1) if header.group(1) in ("failure", "success") else "failure"
        bodies.append((source, text[header.end():end]))
    return bodies


def _patch_json(body: str) -> dict[str, Any]:
    fence = _FENCE_RE.search(body)
    try:
        patch = json.loads(fence.group(1)) if fence else {}
    except json.JSONDecodeError:
        return {}
    return patch if isinstance(patch, dict) else {}


def _support(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 1


def merge(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Merge patches, by mode: edits and suggestions are deduped (summing support, dropping the
    weaker of two contradicting rules, failure-driven first); skills are combined line by line."""
    text = request.last_user_text()
    mode = _mode(request, text)
    if mode == "full_rewrite_minibatch":
        return _merge_skills(text)
    key = "suggestions" if mode == "rewrite_from_suggestions" else "edits"
    incoming: list[tuple[str, dict[str, Any]]] = []
    for header_source, body in _patch_bodies(text):
        items = _patch_json(body).get(key)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and ("type" if key == "suggestions" else "op") in item:
                source = (
                    str(item["source"]) if item.get("source") in ("failure", "success") else header_source
                )
                incoming.append((source, item))
    merged: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    # Failure-driven items first (stable), so an item both trees propose sits where failures put it.
    for source, item in sorted(incoming, key=lambda pair: pair[0] != "failure"):
        identity = _suggestion_key(item) if key == "suggestions" else _edit_key(item)
        if identity in merged:
            merged[identity]["support_count"] += _support(item.get("support_count"))
            if key == "suggestions":
                merged[identity]["priority"] = min(merged[identity]["priority"], _priority(item))
        elif key == "suggestions":
            merged[identity] = {
                "type": identity[0],
                "title": str(item.get("title") or ""),
                "motivation": str(item.get("motivation") or ""),
                "instruction": identity[1],
                "priority": _priority(item),
                "support_count": _support(item.get("support_count")),
                "source": source,
            }
        else:
            named = {"file": str(item["file"])} if item.get("file") else {}
            merged[identity] = {**named, "op": identity[1], "target": identity[2], "content": identity[3],
                                "support_count": _support(item.get("support_count")), "source": source}
    items = list(merged.values())
    dropped = _contradicted(items, [_rule_text(item) for item in items])
    kept = [item for index, item in enumerate(items) if index not in dropped]
    reasoning = (f"Merged {len(_patch_bodies(text))} patches into {len(kept)} {key}"
                 + (f"; dropped {len(dropped)} contradicted by better-supported {key}." if dropped else "."))
    return {"reasoning": reasoning, key: kept}


def _edit_key(edit: dict[str, Any]) -> tuple[str, str, str, str]:
    return (str(edit.get("file") or ""), str(edit.get("op", "")).strip().lower(),
            str(edit.get("target") or "").strip(), str(edit.get("content") or "").strip())


def _suggestion_key(suggestion: dict[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(suggestion.get("type", "")).strip().lower(),
        str(suggestion.get("instruction") or "").strip(),
        "",
        "",
    )


def _priority(suggestion: dict[str, Any]) -> int:
    value = suggestion.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _rule_text(item: dict[str, Any]) -> str:
    """The rule line an edit or suggestion adds ("" for a deletion or removal)."""
    if "op" in item:
        return "" if item["op"] == "delete" else str(item.get("content") or "")
    if item.get("type") == "remove_rule":
        return ""
    instruction = str(item.get("instruction") or "")
    return _quoted_line(instruction) or instruction


def _removed_text(item: dict[str, Any]) -> str:
    """The line an edit deletes or a suggestion removes ("" for anything else)."""
    if item.get("op") == "delete":
        return str(item.get("target") or "")
    if item.get("type") == "remove_rule":
        return _quoted_line(str(item.get("instruction") or "")) or ""
    return ""


def _quoted_line(instruction: str) -> str | None:
    """The rule line a suggestion's instruction quotes (``Add the rule line "- …"``), if any."""
    found = _QUOTED_LINE_RE.search(instruction)
    return found.group(1) if found else None


def _contradicted(items: Sequence[dict[str, Any]], texts: Sequence[str]) -> set[int]:
    """Indices of added rules that contradict a better-supported one (ties keep the earlier)."""
    asserted = [_asserted(text) for text in texts]
    dropped: set[int] = set()
    for i, j in itertools.combinations(range(len(items)), 2):
        if i in dropped or j in dropped:
            continue
        clash = any(other in RULES[name].conflicts or name in RULES[other].conflicts
                    for name in asserted[i] for other in asserted[j])
        if clash:
            dropped.add(j if items[i]["support_count"] >= items[j]["support_count"] else i)
    return dropped


def _merge_skills(text: str) -> dict[str, Any]:
    """The union of the candidate documents' body lines (failure-driven candidates first, harmful
    lines that contradict a line more candidates share dropped), with the first one's blocks."""
    documents = []
    for _source, body in sorted(_patch_bodies(text), key=lambda pair: pair[0] != "failure"):
        fence = _MARKDOWN_FENCE_RE.search(body)
        if fence:
            documents.append(_document(fence.group(2)))
    if not documents:
        return {"reasoning": "No candidate skills to merge.", "skill": ""}
    # The first document's lines (blank lines included), then each other document's new lines;
    # a line's support is the number of documents that hold it.
    lines = documents[0].body.splitlines()
    support = {line.strip(): 1 for line in lines if line.strip()}
    for document in documents[1:]:
        for key in dict.fromkeys(line.strip() for line in document.body.splitlines() if line.strip()):
            if key in support:
                support[key] += 1
            else:
                lines.append(key)
                support[key] = 1
    rules = [{"support_count": support.get(line.strip(), 1)} for line in lines]
    dropped = _contradicted(rules, lines)
    body = "\n".join(line for index, line in enumerate(lines) if index not in dropped)
    merged = SkillDocument(body=body, slow_update=documents[0].slow_update, appendix=documents[0].appendix)
    return {"reasoning": f"Took the union of {len(documents)} candidate skills' rule lines"
                         + (f"; dropped {len(dropped)} contradicted lines." if dropped else "."),
            "skill": merged.text}


# -------------------------------------------------------------------------------------- ranking


def ranking(request: ChatRequest, seed: int) -> dict[str, Any]:
    """The ``budget`` candidates with the most support (suggestions: then the lowest priority
    number; ties: lower index first)."""
    text = request.last_user_text()
    suggestions = section(text, "Candidate suggestions")
    pool = suggestions if suggestions is not None else section(text, "Candidate edits") or text
    budget_match = _POOL_BUDGET_RE.search(text)
    candidates = []
    for match in _POOL_LINE_RE.finditer(pool):
        try:
            item = json.loads(match.group(2))
        except json.JSONDecodeError:
            item = {}
        item = item if isinstance(item, dict) else {}
        support = _support(item.get("support_count"))
        candidates.append((-support, _priority(item) if suggestions is not None else 0, int(match.group(1))))
    budget = int(budget_match.group(1)) if budget_match else len(candidates)
    selected = [index for _, _, index in sorted(candidates)[:budget]]
    what = "suggestions" if suggestions is not None else "edits"
    return {"reasoning": f"Kept the {len(selected)} best-supported of {len(candidates)} {what}.",
            "selected_indices": selected}


# -------------------------------------------------------------------------------------- rewrite


def rewrite(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Apply the selected suggestions: ``add_rule`` appends the quoted rule line, ``remove_rule``
    removes it; other types change nothing here. Now and then the protected blocks get lost."""
    text = request.last_user_text()
    skill = _current_skill(text)
    adds: list[str] = []
    removes: list[str] = []
    summary: list[str] = []
    for line in (section(text, "Selected suggestions") or "").splitlines():
        try:
            suggestion = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(suggestion, dict):
            continue
        kind, quoted = suggestion.get("type"), _quoted_line(str(suggestion.get("instruction") or ""))
        if kind == "add_rule" and quoted:
            adds.append(quoted)
            summary.append(f"Added the rule: {quoted.lstrip('- ')}")
        elif kind == "remove_rule" and quoted:
            removes.append(quoted)
            summary.append(f"Removed the rule: {quoted.lstrip('- ')}")
        else:
            summary.append(f"No change for {kind} suggestion {suggestion.get('title', '')!r}: nothing to "
                           "apply.")
    document = _with_lines(_document(skill), add=adds, remove=removes)
    dropped = _drops_blocks(seed, "rewrite", skill, adds, removes)
    if dropped:
        document = _without_blocks(document)
    return {"reasoning": f"Applied {len(adds) + len(removes)} of the selected suggestions"
                         + (" (the protected blocks were left out)." if dropped else "."),
            "change_summary": summary, "new_skill": document.text}


# -------------------------------------------------------------------------- autonomous budget


def learning_rate(request: ChatRequest, seed: int) -> dict[str, Any]:
    """The number of proposals that add a convention the skill does not state yet, or remove a
    harmful rule: one per convention, at most ``available``."""
    text = request.last_user_text()
    style = read_style(_current_skill(text))
    available_match = _AVAILABLE_RE.search(text)
    addressed: dict[str, int] = {}
    risky: list[int] = []
    pool = section(text, "Proposed edits") or section(text, "Proposed suggestions") or ""
    lines = list(_POOL_LINE_RE.finditer(pool))
    for match in lines:
        try:
            item = json.loads(match.group(2))
        except json.JSONDecodeError:
            continue
        if not isinstance(item, dict) or not ("op" in item or "type" in item):
            continue
        removed = _removed_text(item)
        rules = _asserted(removed or _rule_text(item))
        if removed:
            useful = rules & _HARMFUL_NAMES
        else:
            useful = {name for name in rules & _CONVENTION_NAMES if not style.states(name)}
        for name in sorted(useful):
            addressed.setdefault(name, int(match.group(1)))
        if not useful and not (rules & _CONVENTION_NAMES):
            risky.append(int(match.group(1)))
    available = int(available_match.group(1)) if available_match else len(lines)
    chosen = min(len(addressed), available)
    failed = _FAILED_RE.search(section(text, "Step scores") or "")
    mostly_failing = failed is not None and 2 * int(failed.group(1)) >= int(failed.group(2)) > 0
    confidence = "low" if not chosen else ("high" if mostly_failing else "medium")
    return {
        "learning_rate": chosen,
        "reasoning": f"{len(addressed)} of {len(lines)} proposals address distinct conventions the skill "
                     f"does not get right yet ({', '.join(sorted(addressed)) or 'none'}); applying {chosen}.",
        "confidence": confidence,
        "risk_notes": [f"Proposal [{index}] changes no convention or works against one." for index in risky],
    }


# ------------------------------------------------------------------------------------ deep probe


def deep_probe(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Ask the target to name the conventions it applied before answering."""
    blocks = trajectories(section(request.last_user_text(), "Trajectories") or "")
    return {"reasoning": f"{len(blocks)} trajectories show which conventions were missed, not whether the "
                         "target meant to apply them; a readout of the conventions it applied tells them "
                         "apart.",
            "probe_instruction": PROBE_INSTRUCTION}


# ------------------------------------------------------------------------- epoch-boundary stages


def _count(text: str, label: str) -> int:
    found = re.search(_COUNT_RE.format(re.escape(label)), text, re.MULTILINE | re.IGNORECASE)
    return int(found.group(1)) if found else 0


def _missed_conventions(text: str) -> list[str]:
    """Conventions marked missing in any evaluation event of ``text``, in canonical order."""
    missing = {name for block in trajectories(text) for name in block.missing}
    missing |= {name for line in _CONVENTIONS_RE.findall(text) for name, mark in _MARK_RE.findall(line)
                if mark == "missing"}
    return [rule.name for rule in CONVENTIONS if rule.name in missing]


def slow_update(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Epoch guidance: guard against regressions, then remind the conventions still being missed."""
    text = request.last_user_text()
    improved, regressed = _count(text, "Improved"), _count(text, "Regressed")
    persistent, stable = _count(text, "Persistent failures"), _count(text, "Stable successes")
    missed = _missed_conventions(text)
    lines = [
        "You are graded on exact answers, format included: keep every answer convention the skill states, "
        "for every task type, and change nothing that already works."
    ]
    if missed:
        lines.append("Answers last epoch still broke these conventions; apply them every time:")
        lines += [RULES[name].phrasings[0] for name in missed]
    reasoning = (f"Improved {improved}, regressed {regressed}, persistent failures {persistent}, "
                 f"stable successes {stable}; conventions still missed: {', '.join(missed) or 'none'}.")
    return {"reasoning": reasoning, "guidance": "\n".join(lines)}


def meta_skill(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Memory for the optimizer: what the comparison shows, and which kinds of edits help here."""
    text = request.last_user_text()
    improved, regressed = _count(text, "Improved"), _count(text, "Regressed")
    missed = _missed_conventions(text)
    memory = [
        f"Between the last two epochs' skills {improved} items improved and {regressed} regressed.",
        "State each answer convention (a unit, a number of decimals, letter case, a date format, digits) as "
        "one general rule line; generic reminders change no answer, and a blanket rule for every answer "
        "overrides the conventions stated before it.",
    ]
    if missed:
        memory.append("Still missed at the end of the epoch: " + ", ".join(missed) + ".")
    return {"reasoning": f"Compared the two epochs' skills; {len(missed)} conventions still missed.",
            "memory": " ".join(memory)}


# -------------------------------------------------------------------------------- the rule set


DEMO_RULES: tuple[dict[str, str], ...] = (
    {"name": "demo target", "stage": "rollout", "handler": f"{__name__}:target"},
    {"name": "demo analyst", "stage": "analyst", "handler": f"{__name__}:analyst"},
    {"name": "demo merge", "stage": "merge", "handler": f"{__name__}:merge"},
    {"name": "demo ranking", "stage": "ranking", "handler": f"{__name__}:ranking"},
    {"name": "demo learning rate", "stage": "lr", "handler": f"{__name__}:learning_rate"},
    {"name": "demo rewrite", "stage": "rewrite", "handler": f"{__name__}:rewrite"},
    {"name": "demo deep probe", "stage": "deep_probe", "handler": f"{__name__}:deep_probe"},
    {"name": "demo slow update", "stage": "slow_update", "handler": f"{__name__}:slow_update"},
    {"name": "demo meta skill", "stage": "meta_skill", "handler": f"{__name__}:meta_skill"},
)


class DemoRules:
    """The ``demo`` built-in set: the handlers above, then ``auto`` for every other stage."""

    name = "demo"

    def __init__(self) -> None:
        self._table = RuleTable(parse_rules(DEMO_RULES, where="the demo rule set"), where="the demo rule set")
        target_rules = RuleTable(
            parse_rules(DEMO_RULES[:1], where="the demo rule set"), where="the demo rule set"
        )
        self._fallback = AutoRules(target_rules)

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer:
        outcome = self._table.reply(request, role=role, seed=seed)
        if isinstance(outcome, NoAnswer):
            return self._fallback.reply(request, role=role, seed=seed)
        return outcome


def demo_rule_set(context: BackendContext) -> DemoRules:
    """Build the ``demo`` set (registered in the ``skillopt.scripted_rules`` entry-point group)."""
    return DemoRules()
