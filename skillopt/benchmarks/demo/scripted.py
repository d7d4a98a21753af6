"""The demo world's scripted models: a target and an optimizer, written as handlers (BACKENDS.md §3.7).

- ``target`` reads the system message (which holds the skill), applies exactly the rules it
  states (``world.read_style``), and answers the question it finds in the user messages.
- The optimizer handlers read the stage messages' sections (``## Current skill``, ``## Edit
  budget``, ``## Step buffer``, ``## Trajectories``, ``## Patches to merge``, ``## Candidate
  edits``) and answer with the DESIGN.md §4.11 objects. The analyst turns the ``Conventions:``
  lines of failed trajectories' evaluation events into general rule edits, deletes a harmful
  line that overrides a stated convention, and — on a seeded ~30% of calls — adds a harmful or
  useless edit, so the gate has something to reject.

Every handler is a pure function of ``(request, seed)``; a missing section means an empty, valid
reply, never an exception. ``demo_rule_set`` builds the ``demo`` built-in set; stages it does not
script (``lr``, ``rewrite``, ``deep_probe``, ``judge``, ``preflight``) fall back to ``auto``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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

#: Share of analyst calls that add a harmful or useless edit (hashed from the seed and the item ids).
NOISE_RATE = 0.3
#: The budget assumed when an analyst message has no ``## Edit budget`` section.
DEFAULT_EDIT_BUDGET = 4

_HEADINGS = (
    "Current skill", "Edit budget", "Step buffer", "Optimizer memory", "Meta skill", "Trajectories",
    "Patches to merge", "Candidate edits",
)
_HEADING_RE = re.compile(r"^## (" + "|".join(map(re.escape, _HEADINGS)) + r")\b.*$", re.MULTILINE)
_TRAJECTORY_RE = re.compile(r"^### Trajectory \d+: id `([^`]+)`", re.MULTILINE)
_CONVENTIONS_RE = re.compile(r"Conventions:([^\n]*)")
_MARK_RE = re.compile(r"\b(\w+)=(ok|missing)\b")
_BUDGET_RE = re.compile(r"at most (\d+) edits?")
_PATCH_RE = re.compile(r"^### Patch \d+ \(source: (\w+), support: (\d+)\)", re.MULTILINE)
_FENCE_RE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)
_POOL_BUDGET_RE = re.compile(r"^## Candidate edits \(budget\s*=\s*(\d+)\)", re.MULTILINE)
_POOL_LINE_RE = re.compile(r"^\[(\d+)\]\s*(.*)$", re.MULTILINE)
_COUNT_RE = r"^\s*{}\s*:\s*(\d+)"
_CONVENTION_NAMES = frozenset(rule.name for rule in CONVENTIONS)


# ----------------------------------------------------------------------------------- the target


def target(request: ChatRequest, seed: int) -> str:
    """Answer the demo question, formatted with exactly the rules the system message states."""
    style = read_style(request.system_text())
    # The question is in the first user message; later turns (self-check feedback) only restate it.
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        problem = parse_question(message.text())
        if problem is not None:
            answer = format_answer(problem, style.active(problem.task_type))
            return f"{problem.working}.\n<answer>{answer}</answer>"
    return "I cannot find a question I know how to solve.\n<answer>unknown</answer>"


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
    """One trajectory block: its item id and the conventions its evaluation event marked."""

    item_id: str
    marks: dict[str, bool]

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
        found.append(Trajectory(match.group(1), {k: v for k, v in marks.items() if k in _CONVENTION_NAMES}))
    return found


def _budget(text: str) -> int:
    found = _BUDGET_RE.search(section(text, "Edit budget") or "")
    return int(found.group(1)) if found else DEFAULT_EDIT_BUDGET


def _fraction(seed: int, *parts: Any) -> float:
    """A deterministic number in [0, 1) from the seed and ``parts``."""
    digest = hashlib.sha256(json.dumps([seed, *parts], default=str).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _mentioned(content: str, text: str) -> bool:
    """Whether ``content`` appears in ``text`` as written or JSON-escaped."""
    content = content.strip()
    return bool(content) and (content in text or json.dumps(content)[1:-1] in text)


# -------------------------------------------------------------------------------------- analyst


def _append(content: str) -> dict[str, str]:
    return {"op": "append", "target": "", "content": content}


def _new_phrasing(name: str, skill: str, buffer: str) -> str | None:
    """A phrasing of rule ``name`` not already in the skill and not rejected this epoch."""
    for phrasing in RULES[name].phrasings:
        if not _mentioned(phrasing, skill) and not _mentioned(phrasing, buffer):
            return phrasing
    return None


def _noise_edit(seed: int, ids: Sequence[str], *, kind: str, skill: str, buffer: str,
                proposed: Iterable[str]) -> dict[str, str] | None:
    """On a seeded ~``NOISE_RATE`` of calls, one harmful or useless edit (never one contradicting
    a rule proposed in the same patch, and never one rejected this epoch)."""
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
    return _append(pool[int(_fraction(seed, kind, "pick", sorted(ids)) * len(pool))])


def analyst(request: ChatRequest, seed: int) -> dict[str, Any]:
    """The analyst (patch mode): rule edits for the conventions failed trajectories missed."""
    text = request.last_user_text()
    skill = section(text, "Current skill") or ""
    buffer = section(text, "Step buffer") or ""
    budget = max(0, _budget(text))
    blocks = trajectories(section(text, "Trajectories") or text)
    ids = [block.item_id for block in blocks]
    if request.tags.get("kind") == "success":
        return _success_reply(seed, blocks, skill=skill, buffer=buffer, budget=budget)

    style = read_style(skill)
    missed: dict[str, list[str]] = {}
    for block in blocks:
        for name in block.missing:
            missed.setdefault(name, []).append(block.item_id)

    candidates: list[tuple[int, int, dict[str, str]]] = []  # (support, canonical order, edit)
    diagnosis: list[dict[str, Any]] = []
    notes: list[str] = []
    order = {rule.name: index for index, rule in enumerate(CONVENTIONS)}
    for name in sorted(missed, key=lambda n: (-len(missed[n]), order.get(n, len(order)))):
        rule, support = RULES[name], missed[name]
        if not style.states(name):
            phrasing = _new_phrasing(name, skill, buffer)
            diagnosis.append({"ids": support, "kind": "rule_missing",
                              "description": f"The skill never says that {rule.description}."})
            if phrasing is not None:
                candidates.append((len(support), order[name], _append(phrasing)))
        elif overriding := style.overriding(name):
            harmful_lines = [line for other in overriding for line in lines_stating(skill, other)]
            diagnosis.append({"ids": support, "kind": "rule_conflict",
                              "description": f"The skill says {rule.description}, but a later rule "
                                             f"({', '.join(overriding)}) overrides it."})
            for line in dict.fromkeys(harmful_lines):
                candidates.append((len(support), order[name], {"op": "delete", "target": line, "content": ""}))
        else:
            diagnosis.append({"ids": support, "kind": "rule_not_followed",
                              "description": f"The skill says {rule.description}, yet answers break it."})
            notes.append(f"Apply the stated rule: {rule.description}.")

    candidates.sort(key=lambda c: (-c[0], c[1]))
    edits = [edit for _, _, edit in candidates][:budget]
    proposed_rules = {r.name for r in RULES.values() for e in edits if r.stated_by(e["content"])}
    if len(edits) < budget:
        noise = _noise_edit(seed, ids, kind="failure", skill=skill, buffer=buffer, proposed=proposed_rules)
        if noise is not None:
            edits.append(noise)
    reasoning = (
        f"{len(blocks)} failed trajectories; conventions missed: "
        + (", ".join(f"{name} ({len(missed[name])})" for name in missed) or "none")
        + f". Proposing {len(edits)} of at most {budget} edits."
    )
    return {"diagnosis": diagnosis, "patch": {"reasoning": reasoning, "edits": edits}, "execution_notes": notes}


def _success_reply(seed: int, blocks: Sequence[Trajectory], *, skill: str, buffer: str,
                   budget: int) -> dict[str, Any]:
    followed = sorted({name for block in blocks for name, ok in block.marks.items() if ok})
    diagnosis = [{"ids": [block.item_id for block in blocks], "kind": "success_pattern",
                  "description": "Answers that follow the stated conventions: " + (", ".join(followed) or "none")}]
    edits = []
    if budget > 0:
        noise = _noise_edit(seed, [b.item_id for b in blocks], kind="success", skill=skill, buffer=buffer,
                            proposed=())
        edits = [noise] if noise is not None else []
    return {"diagnosis": diagnosis if blocks else [],
            "patch": {"reasoning": f"{len(blocks)} solved trajectories; nothing needs to change.", "edits": edits},
            "execution_notes": []}


# ---------------------------------------------------------------------------------------- merge


def _edit_key(edit: dict[str, Any]) -> tuple[str, str, str]:
    return (str(edit.get("op", "")).strip().lower(), str(edit.get("target") or "").strip(),
            str(edit.get("content") or "").strip())


def _asserted(content: str) -> set[str]:
    return {rule.name for rule in RULES.values() if rule.stated_by(content)}


def merge(request: ChatRequest, seed: int) -> dict[str, Any]:
    """Merge patches: dedupe (summing support), drop the weaker of two contradicting edits,
    failure-driven edits before success-driven ones."""
    text = request.last_user_text()
    incoming: list[tuple[str, dict[str, Any]]] = []
    headers = list(_PATCH_RE.finditer(text))
    for position, header in enumerate(headers):
        end = headers[position + 1].start() if position + 1 < len(headers) else len(text)
        fence = _FENCE_RE.search(text, header.end(), end)
        try:
            patch = json.loads(fence.group(1)) if fence else {}
        except json.JSONDecodeError:
            continue
        edits = patch.get("edits") if isinstance(patch, dict) else None
        for edit in edits if isinstance(edits, list) else []:
            if isinstance(edit, dict) and "op" in edit:
                source = edit.get("source") if edit.get("source") in ("failure", "success") else header.group(1)
                incoming.append((source if source in ("failure", "success") else "failure", edit))
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    # Failure-driven edits first (stable), so an edit both trees propose sits where failures put it.
    for source, edit in sorted(incoming, key=lambda pair: pair[0] != "failure"):
        key = _edit_key(edit)
        support = edit.get("support_count")
        support = support if isinstance(support, int) and support >= 0 else 1
        if key in merged:
            merged[key]["support_count"] += support
        else:
            merged[key] = {"op": key[0], "target": key[1], "content": key[2], "support_count": support,
                           "source": source}
    edits = list(merged.values())
    dropped = _contradicted(edits)
    kept = [edit for index, edit in enumerate(edits) if index not in dropped]
    reasoning = (f"Merged {len(headers)} patches into {len(kept)} edits"
                 + (f"; dropped {len(dropped)} contradicted by better-supported edits." if dropped else "."))
    return {"reasoning": reasoning, "edits": kept}


def _contradicted(edits: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of appended rules that contradict a better-supported one (ties keep the earlier)."""
    asserted = [_asserted(edit["content"]) if edit["op"] != "delete" else set() for edit in edits]
    dropped: set[int] = set()
    for i, j in itertools.combinations(range(len(edits)), 2):
        if i in dropped or j in dropped:
            continue
        clash = any(other in RULES[name].conflicts or name in RULES[other].conflicts
                    for name in asserted[i] for other in asserted[j])
        if clash:
            dropped.add(j if edits[i]["support_count"] >= edits[j]["support_count"] else i)
    return dropped


# -------------------------------------------------------------------------------------- ranking


def ranking(request: ChatRequest, seed: int) -> dict[str, Any]:
    """The ``budget`` candidate edits with the most support (ties: lower index first)."""
    text = request.last_user_text()
    pool = section(text, "Candidate edits") or text
    budget_match = _POOL_BUDGET_RE.search(text)
    candidates = []
    for match in _POOL_LINE_RE.finditer(pool):
        try:
            edit = json.loads(match.group(2))
        except json.JSONDecodeError:
            edit = {}
        support = edit.get("support_count", 1) if isinstance(edit, dict) else 1
        candidates.append((-(support if isinstance(support, int) else 1), int(match.group(1))))
    budget = int(budget_match.group(1)) if budget_match else len(candidates)
    selected = [index for _, index in sorted(candidates)[:budget]]
    return {"reasoning": f"Kept the {len(selected)} best-supported of {len(candidates)} edits.",
            "selected_indices": selected}


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
        "State each answer convention (a unit, a number of decimals, letter case, a date format, digits) as one "
        "general rule line; generic reminders change no answer, and a blanket rule for every answer overrides "
        "the conventions stated before it.",
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
    {"name": "demo slow update", "stage": "slow_update", "handler": f"{__name__}:slow_update"},
    {"name": "demo meta skill", "stage": "meta_skill", "handler": f"{__name__}:meta_skill"},
)


class DemoRules:
    """The ``demo`` built-in set: the handlers above, then ``auto`` for every other stage."""

    name = "demo"

    def __init__(self) -> None:
        self._table = RuleTable(parse_rules(DEMO_RULES, where="the demo rule set"), where="the demo rule set")
        target_rules = RuleTable(parse_rules(DEMO_RULES[:1], where="the demo rule set"), where="the demo rule set")
        self._fallback = AutoRules(target_rules)

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer:
        outcome = self._table.reply(request, role=role, seed=seed)
        if isinstance(outcome, NoAnswer):
            return self._fallback.reply(request, role=role, seed=seed)
        return outcome


def demo_rule_set(context: BackendContext) -> DemoRules:
    """Build the ``demo`` set (registered in ``skillopt.llm.scripted.BUILTIN_SETS``)."""
    return DemoRules()
