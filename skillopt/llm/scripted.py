"""The ``scripted`` backend: deterministic, offline replies from rules.

A rule is a small mapping. Its **match keys** all have to hold for the rule to apply:

- ``role``: the role this backend serves (``target``, ``optimizer``, ``judge``);
- ``stage``: the request's stage (``rollout``, ``judge``, ``analyst`` ...);
- ``item_id``: equals ``request.tags["item_id"]`` (compared as text);
- ``system``: a regular expression searched (``re.search``) in the system text;
- ``user``: a regular expression searched in the text of the last user message;
- ``question``: a regular expression searched in the text of the first user message (the item's
  question, which stays the same over a rollout's self-check turns while the last one changes).

Images never reach the matcher as bytes: each one appears in the text as ``[image] <basename>``.
A rule has exactly one **reply**:

- ``text``: the answer text;
- ``json``: an object (or array), sent as JSON text and validated against ``response_schema``
  when the request has one (a mismatch raises ``ParseError`` naming the rule);
- ``template``: text where ``{1}`` / ``{name}`` are replaced by the groups of the ``user`` match
  (or of the ``system`` match when the rule has no ``user``; named groups come from either,
  ``user`` winning), ``{0}`` by the whole match, ``{{`` / ``}}`` by literal braces; a group that
  did not take part in the match gives "";
- ``error``: the name of a ``skillopt.llm.errors`` class, or an SDK-style alias such as
  ``RateLimitError``; ``retry_after`` (seconds) is passed to it;
- ``handler``: ``"module:function"``, called as ``function(request, seed)``. It returns text, an
  object (a dict, list or pydantic model, validated like ``json``), or ``None`` to decline, in
  which case matching goes on with the next rule. It may raise a ``BackendError`` to inject one.
  It must be deterministic given the request and the seed, and thread-safe.

Optional per rule: ``name`` (shown in errors), ``usage`` (token counts that replace the
characters/4 estimates) and ``latency_s`` (the reported latency; a rule slower than the attempt's
``timeout_s`` raises ``CallTimeout`` without sleeping).

The first matching rule wins, then the ``default`` reply (a rule without match keys), else
``ScriptedNoMatch``. ``rules`` is an inline list, the path of a YAML file holding such a list, or
the name of a built-in set (``BUILTIN_SETS``): ``auto`` (used when no rules are configured) and
``estimate`` (the dry run's stubs), or of a set a plug-in registers in the ``skillopt.scripted_rules``
entry-point group: ``demo`` (the demo world's target and optimizer, in
``skillopt.benchmarks.demo.scripted``). See ``AutoRules`` and ``EstimateRules`` for what they answer.

Nothing here opens a socket or imports a library that does.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
import threading
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from skillopt.core.errors import ConfigError
from skillopt.llm import errors as backend_errors
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.chat import ChatRequest, ChatResponse, Stage, Usage
from skillopt.llm.errors import BackendError, CallTimeout, ParseError
from skillopt.llm.roles import ResolvedRole, RoleName

log = logging.getLogger("skillopt.llm")

MODEL_ID = "scripted"
EXCERPT_CHARS = 200

#: SDK exception names accepted for ``error`` beside the ``skillopt.llm.errors`` class names.
ERROR_ALIASES: Mapping[str, str] = MappingProxyType({
    "RateLimitError": "RateLimited",
    "AuthenticationError": "AuthError",
    "PermissionDeniedError": "PermissionDenied",
    "BadRequestError": "BadRequest",
    "NotFoundError": "ModelNotFound",
    "InternalServerError": "ServerError",
    "APITimeoutError": "CallTimeout",
    "APIConnectionError": "ConnectionFailed",
})

_TEMPLATE_FIELD = re.compile(r"\{\{|\}\}|\{(\w+)\}")
_PUNCTUATION = re.compile(r"[^\w\s]|_")


class ScriptedNoMatch(BackendError):
    """No scripted rule (nor the ``default`` reply) answers this request."""


# --- options and rules ------------------------------------------------------------------------


class ScriptedOptions(BaseModel):
    """``model.<role>.options`` of the scripted backend."""

    model_config = ConfigDict(extra="forbid")

    #: Inline rules, a YAML file path, or a built-in set name; None means ``auto``.
    rules: list[dict[str, Any]] | str | None = None
    #: The reply used when no rule matches (a rule body without match keys).
    default: dict[str, Any] | None = None
    #: Given to handlers; None falls back to the role's ``seed``, then 0.
    seed: int | None = None


class RuleUsage(Usage):
    """Token counts a rule reports instead of the characters/4 estimates; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


_REPLY_KEYS = ("text", "json", "template", "error", "handler")


class ScriptedReply(BaseModel):
    """What a rule answers: exactly one of ``text``, ``json``, ``template``, ``error``, ``handler``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    text: str | None = None
    json_value: dict[str, Any] | list[Any] | None = Field(default=None, alias="json")
    template: str | None = None
    error: str | None = None
    retry_after: float | None = Field(default=None, ge=0)
    handler: str | None = None
    usage: RuleUsage | None = None
    latency_s: float = Field(default=0.0, ge=0)

    _error_class: type[BackendError] | None = PrivateAttr(default=None)
    _handler_fn: Callable[[ChatRequest, int], Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_reply(self) -> ScriptedReply:
        given = [
            key for key in _REPLY_KEYS if getattr(self, "json_value" if key == "json" else key) is not None
        ]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise ValueError(f"a rule needs exactly one of {', '.join(_REPLY_KEYS)} (found: {found})")
        if self.retry_after is not None and self.error is None:
            raise ValueError("retry_after is only meaningful with error")
        if self.error is not None:
            self._error_class = _error_class(self.error)
        if self.handler is not None:
            self._handler_fn = _load_handler(self.handler)
        patterns = self._patterns()  # compiled now, so matching never mutates a shared rule
        if self.template is not None:
            _check_template(self.template, patterns)
        return self

    def _patterns(self) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
        return None, None


class ScriptedRule(ScriptedReply):
    """A reply plus the match keys that select it (module docstring)."""

    role: RoleName | None = None
    stage: Stage | None = None
    item_id: str | int | None = None
    system: str | None = None
    user: str | None = None
    question: str | None = None
    #: A catch-all rollout rule meant for the items that have no rule of their own (a fixture that scores
    #: them as failures on purpose): answering them is no sign of data the rules do not know.
    for_other_items: bool = False

    _system_re: re.Pattern[str] | None = PrivateAttr(default=None)
    _user_re: re.Pattern[str] | None = PrivateAttr(default=None)
    _question_re: re.Pattern[str] | None = PrivateAttr(default=None)

    def _patterns(self) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
        if self._system_re is None and self.system is not None:
            self._system_re = _compile(self.system, "system")
        if self._user_re is None and self.user is not None:
            self._user_re = _compile(self.user, "user")
        if self._question_re is None and self.question is not None:
            self._question_re = _compile(self.question, "question")
        return self._system_re, self._user_re

    def is_catch_all(self) -> bool:
        """Whether the rule answers any item of its stage (no item, system, user or question key)."""
        return self.item_id is None and self.system is None and self.user is None and self.question is None

    def match(self, request: ChatRequest, role: str) -> _Match | None:
        """The regex matches (for templates) when every given match key holds, else None."""
        if self.role is not None and self.role != role:
            return None
        if self.stage is not None and self.stage != request.stage:
            return None
        if self.item_id is not None and str(request.tags.get("item_id")) != str(self.item_id):
            return None
        system_re, user_re = self._patterns()
        system_match = user_match = None
        if system_re is not None:
            system_match = system_re.search(request.system_text())
            if system_match is None:
                return None
        if user_re is not None:
            user_match = user_re.search(request.last_user_text())
            if user_match is None:
                return None
        if self._question_re is not None:
            question = next((m.text() for m in request.messages if m.role == "user"), "")
            if self._question_re.search(question) is None:
                return None
        return _Match(system_match, user_match)


@dataclass(frozen=True)
class _Match:
    system: re.Match[str] | None = None
    user: re.Match[str] | None = None


def _compile(pattern: str, key: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{key}: invalid regular expression: {exc}") from None


def _error_class(name: str) -> type[BackendError]:
    target = ERROR_ALIASES.get(name, name)
    found = getattr(backend_errors, target, None)
    if isinstance(found, type) and issubclass(found, BackendError) and found is not BackendError:
        return found
    known = sorted(
        n for n, v in vars(backend_errors).items()
        if isinstance(v, type) and issubclass(v, BackendError) and v is not BackendError
    )
    raise ValueError(
        f"error: unknown error class {name!r}; expected one of {', '.join(known)} "
        f"or an alias ({', '.join(ERROR_ALIASES)})"
    )


def _load_handler(spec: str) -> Callable[[ChatRequest, int], Any]:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"handler: expected 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"handler: cannot import module {module_name!r}: {exc}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"handler: {module_name!r} has no callable {attribute!r}")
    return function


def _check_template(template: str, patterns: tuple[re.Pattern[str] | None, re.Pattern[str] | None]) -> None:
    system_re, user_re = patterns
    primary = user_re or system_re
    names = {**(system_re.groupindex if system_re else {}), **(user_re.groupindex if user_re else {})}
    for m in _TEMPLATE_FIELD.finditer(template):
        field = m.group(1)
        if field is None:
            continue
        if field.isdigit():
            if primary is None or int(field) > primary.groups:
                groups = primary.groups if primary else 0
                raise ValueError(f"template: {{{field}}} refers to a group the match does not have ({groups} "
                                 "groups)")
        elif field not in names:
            raise ValueError(f"template: {{{field}}} is not a named group of the system or user pattern")


def _render_template(template: str, match: _Match) -> str:
    primary = match.user or match.system
    named = {
        **(match.system.groupdict() if match.system else {}),
        **(match.user.groupdict() if match.user else {}),
    }

    def substitute(m: re.Match[str]) -> str:
        token, field = m.group(), m.group(1)
        if field is None:
            return token[0]  # "{{" -> "{", "}}" -> "}"
        value = primary.group(int(field)) if field.isdigit() and primary else named.get(field)
        return value or ""

    return _TEMPLATE_FIELD.sub(substitute, template)


def parse_rules(raw: Sequence[Any], *, where: str) -> list[ScriptedRule]:
    """Validate rule mappings; a bad one is a ``ConfigError`` naming ``where[index]`` and the key."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise ConfigError(f"{where}: expected a list of rules, got {type(raw).__name__}")
    rules = []
    for index, item in enumerate(raw):
        if isinstance(item, ScriptedRule):
            rules.append(item)
            continue
        rules.append(_validate(ScriptedRule, item, f"{where}[{index}]"))
    return rules


def _validate(model: type[ScriptedReply], data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in error["loc"])
            message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            message = message.removeprefix("Value error, ")
            problems.append(f"{where}{'.' + loc if loc else ''}: {message}")
        raise ConfigError("; ".join(problems)) from None


def load_rules_file(path: Path, *, where: str) -> list[ScriptedRule]:
    """Rules from a YAML file holding a list of rule mappings."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read rules file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: rules file {path} is not valid YAML: {exc}") from None
    return parse_rules(data if data is not None else [], where=f"{where} ({path})")


# --- replies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A rule set's reply: the text, the validated object (with a schema), and what to report."""

    text: str
    parsed: Any = None
    usage: RuleUsage | None = None
    latency_s: float = 0.0


@dataclass(frozen=True)
class NoAnswer:
    """Why a rule set has no answer for a request."""

    reason: str


class RuleSet(Protocol):
    """Something that answers requests: a table of rules or a built-in set."""

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer: ...


def _describe(rule: ScriptedReply, where: str) -> str:
    return f"{where} ({rule.name!r})" if rule.name else where


def _object_reply(value: Any, request: ChatRequest, origin: str) -> tuple[str, Any]:
    """JSON text and, with a response schema, the validated object; ParseError names ``origin``."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(value, ensure_ascii=False)
    if request.response_schema is None:
        return text, None
    try:
        return text, request.response_schema.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False, include_context=False)
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in errors[:3]
        )
        raise ParseError(
            f"{origin} replied with an object that does not validate against "
            f"{request.response_schema.__name__}: {summary}",
            excerpt=text, stage=request.stage, backend="scripted", model=MODEL_ID,
        ) from None


def _produce(rule: ScriptedReply, match: _Match, request: ChatRequest, seed: int, role: str,
             origin: str) -> Answer | None:
    """The rule's reply to ``request``; None when its handler declines."""
    parsed = None
    if rule.error is not None:
        assert rule._error_class is not None
        raise rule._error_class(
            f"error injected by {origin}", role=role, backend="scripted", model=MODEL_ID, stage=request.stage,
            retry_after=rule.retry_after,
        )
    if rule.text is not None:
        text = rule.text
    elif rule.template is not None:
        text = _render_template(rule.template, match)
    elif rule.json_value is not None:
        text, parsed = _object_reply(rule.json_value, request, origin)
    else:
        assert rule._handler_fn is not None
        value = rule._handler_fn(request, seed)
        if value is None:
            return None
        if isinstance(value, str):
            text = value
        elif isinstance(value, dict | list | BaseModel):
            text, parsed = _object_reply(value, request, origin)
        else:
            raise ConfigError(
                f"{origin}: handler {rule.handler} returned {type(value).__name__}; "
                "expected str, dict, list, a pydantic model or None"
            )
    return Answer(text, parsed, rule.usage, rule.latency_s)


class RuleTable:
    """An ordered list of rules: the first one that matches (and does not decline) answers."""

    def __init__(self, rules: Sequence[ScriptedRule], *, where: str) -> None:
        self._rules = tuple(rules)
        self._where = where
        # A table with rollout rules keyed on items (a plug-in's fixture replies) knows some data; a rollout
        # that only its catch-all rule answers is an item it has no reply for, said once per table.
        self._keyed_rollouts = any(r.stage == "rollout" and not r.is_catch_all() for r in self._rules)
        self._unknown_warned = threading.Event()

    def __len__(self) -> int:
        return len(self._rules)

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer:
        for index, rule in enumerate(self._rules):
            match = rule.match(request, role)
            if match is None:
                continue
            outcome = _produce(rule, match, request, seed, role, _describe(rule, f"{self._where}[{index}]"))
            if outcome is not None:
                if (request.stage == "rollout" and self._keyed_rollouts and rule.is_catch_all()
                        and not rule.for_other_items):
                    self._warn_unknown_item(rule)
                return outcome
        if not self._rules:
            return NoAnswer(f"{self._where} holds no rules")
        return NoAnswer(f"none of the {len(self._rules)} rules of {self._where} matched")

    def _warn_unknown_item(self, rule: ScriptedRule) -> None:
        if self._unknown_warned.is_set():
            return
        self._unknown_warned.set()
        log.warning("the scripted backend has no reply of its own for some of these items: %s answers "
                    "them with its catch-all rule%s, and they score as failures; use a real model backend "
                    "(--backend) for data the rules were not written for, or mark that rule "
                    "for_other_items: true if it answers them on purpose", self._where,
                    f" ({rule.name!r})" if rule.name else "")


# --- schema-valid example objects -------------------------------------------------------------

_FORMAT_EXAMPLES = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "duration": "P0D",
    "uri": "https://example.invalid/",
    "email": "scripted@example.invalid",
    "uuid": "00000000-0000-0000-0000-000000000000",
}
_FILLER = (
    "This stub stands in for a model reply of representative length so the dry run can count tokens "
    "without calling a model. "
)


def _filler(chars: int, variant: int = 0) -> str:
    head = f"[{variant}] " if variant else ""
    body = (_FILLER * (chars // len(_FILLER) + 1))[: max(0, chars - len(head))]
    return (head + body).rstrip() if chars else ""


def example_object(schema: type[BaseModel], *, padded: bool = False) -> Any:
    """A JSON value built from ``schema``'s JSON schema that should validate against it.

    Minimal (``padded=False``): only required fields, each with its smallest value ("" / 0 /
    false / [] / the first enum value / a nested minimal object / null where allowed), honouring
    ``minLength``, ``minItems`` and numeric bounds. Padded: every field, strings filled with filler
    text, arrays of three items, for representative reply sizes. Patterns and custom validators are
    not understood; callers validate the result.
    """
    root = schema.model_json_schema()
    return _Example(root.get("$defs", {}), padded).build(root, depth=0, variant=0, stack=())


@dataclass(frozen=True)
class _Example:
    defs: Mapping[str, Any]
    padded: bool
    field_chars: int = 240
    array_items: int = 3
    max_depth: int = 6

    def build(self, node: Mapping[str, Any], *, depth: int, variant: int, stack: tuple[str, ...]) -> Any:
        padded = self.padded and depth < self.max_depth
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name in stack:  # a recursive model: padded falls back to minimal, minimal stops here
                if not self.padded:
                    return None
                return _Example(self.defs, False).build(self.defs[name], depth=depth, variant=variant,
                                                        stack=stack)
            return self.build(self.defs[name], depth=depth, variant=variant, stack=(*stack, name))
        if "const" in node:
            return node["const"]
        if "enum" in node:
            return node["enum"][0]
        for key in ("anyOf", "oneOf"):
            if key in node:
                branches = node[key]
                concrete = [b for b in branches if b.get("type") != "null"]
                if (not padded or not concrete) and len(concrete) < len(branches):
                    return None
                return self.build(concrete[0], depth=depth, variant=variant, stack=stack)
        if "allOf" in node:
            return self.build(node["allOf"][0], depth=depth, variant=variant, stack=stack)
        kind = node.get("type")
        if isinstance(kind, list):
            concrete_kinds = [k for k in kind if k != "null"]
            if not concrete_kinds or (not padded and "null" in kind):
                return None
            kind = concrete_kinds[0]
        if kind == "object" or "properties" in node:
            properties: Mapping[str, Any] = node.get("properties", {})
            names = list(properties) if padded else list(node.get("required", []))
            return {
                name: self.build(properties[name], depth=depth + 1, variant=variant, stack=stack)
                for name in names
            }
        if kind == "array":
            if "prefixItems" in node:
                return [self.build(item, depth=depth + 1, variant=i, stack=stack)
                        for i, item in enumerate(node["prefixItems"])]
            count = int(node.get("minItems", 0))
            if padded:
                count = max(count, min(self.array_items, int(node.get("maxItems", self.array_items))))
            items = node.get("items", {})
            return [self.build(items, depth=depth + 1, variant=i, stack=stack) for i in range(count)]
        if kind == "string":
            if node.get("format") in _FORMAT_EXAMPLES:
                return _FORMAT_EXAMPLES[node["format"]]
            low, high = int(node.get("minLength", 0)), node.get("maxLength")
            if padded:
                size = max(low, self.field_chars if high is None else min(int(high), self.field_chars))
                text = _filler(size, variant)
                return text + "x" * (low - len(text))
            # Array items differ by their variant, so a uniqueItems list stays valid.
            return str(variant).rjust(low, "x") if variant else "x" * low
        if kind in ("integer", "number"):
            return _number(node, integer=kind == "integer", offset=variant)
        if kind == "boolean":
            return False
        return None  # "null" or an unconstrained (Any) value


def _number(node: Mapping[str, Any], *, integer: bool, offset: int) -> int | float:
    low = node.get("minimum")
    if "exclusiveMinimum" in node:
        low = node["exclusiveMinimum"] + (1 if integer else 0.5)
    high = node.get("maximum")
    if "exclusiveMaximum" in node:
        high = node["exclusiveMaximum"] - (1 if integer else 0.5)
    value: float = (low if low is not None else 0) + offset
    if high is not None and value > high:
        value = high if low is None else max(low, high)
    if low is not None and value < low:
        value = low
    return math.ceil(value) if integer else float(value)


def _schema_reply(
    schema: type[BaseModel], request: ChatRequest, *, padded: bool, origin: str
) -> Answer | NoAnswer:
    value = example_object(schema, padded=padded)
    try:
        parsed = schema.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        return NoAnswer(
            f"{origin} cannot build a valid {schema.__name__} ({where}: {first['msg']}); "
            f"add a rule for stage {request.stage}"
        )
    return Answer(json.dumps(value, ensure_ascii=False), parsed)


# --- built-in sets ----------------------------------------------------------------------------


def normalise_answer(text: str) -> str:
    """Lowercase, punctuation stripped, whitespace collapsed: how the scripted judge compares answers."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_PUNCTUATION.sub("", text).split())


def _judge_verdict(request: ChatRequest, origin: str) -> Answer | NoAnswer:
    prediction = request.tags.get("prediction")
    golds = request.tags.get("gold_answers")
    if isinstance(golds, str):
        golds = [golds]
    if prediction is None or not isinstance(golds, list | tuple):
        return NoAnswer(
            f"{origin} grades from request.tags['prediction'] and request.tags['gold_answers'] (a list); "
            "this request does not carry both"
        )
    predicted = normalise_answer(str(prediction))
    correct = any(predicted == normalise_answer(str(gold)) for gold in golds)
    verdict = {
        "verdict": "correct" if correct else "incorrect",
        "reason": "the normalised prediction equals a gold answer" if correct
        else "the normalised prediction equals no gold answer",
    }
    text, parsed = _object_reply(verdict, request, origin)
    return Answer(text, parsed)


#: What the ``auto`` set answers for the deep probe: a short readout that changes no task.
AUTO_PROBE_INSTRUCTION = ("Before your final answer, state in one line the decisive cue your answer rests on "
                          "and the runner-up answer you rejected.")


class AutoRules:
    """The ``auto`` set: answers every stage, so ``--backend scripted`` runs any benchmark.

    - optimizer stages: a minimal object valid for ``request.response_schema`` (``{}`` without one);
    - ``judge``: ``{"verdict": "correct"|"incorrect", "reason": ...}``, ``correct`` iff
      ``normalise_answer(tags["prediction"])`` equals ``normalise_answer(g)`` for some ``g`` in
      ``tags["gold_answers"]`` (never a substring test). The judge prompt belongs to the benchmark,
      so the benchmark's judge call must put the prediction and the gold answers in these two tags;
      a judge request without them gets no answer from this set;
    - ``rollout``: the run's target rules (``BackendContext.scripted_target_rules``: the data root's
      ``scripted_rules.yaml``);
    - ``deep_probe``: a fixed, generic probe instruction (``AUTO_PROBE_INSTRUCTION``), so a scripted
      run with ``gradient.deep_probe`` re-runs its probe items (a minimal object would be blank);
    - ``preflight``: ``ok``.

    A rule of those that names another stage (``stage: analyst``, ``merge``, ``slow_update`` ...) answers
    that stage first, so a data folder can script an optimizer that proposes the edit its target needs
    (an offline demonstration of training); a stage its rules do not answer gets the reply above.
    """

    name = "auto"

    def __init__(self, target_rules: RuleTable) -> None:
        self._target = target_rules

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer:
        if request.stage == "preflight":
            return Answer("ok")
        if request.stage == "rollout":
            if not len(self._target):
                return NoAnswer("the benchmark supplied no scripted target rules for the auto set")
            return self._target.reply(request, role=role, seed=seed)
        scripted = self._target.reply(request, role=role, seed=seed) if len(self._target) else None
        if isinstance(scripted, Answer):
            return scripted
        if request.stage == "deep_probe" and request.response_schema is not None:
            probe = {"reasoning": "the auto set's generic probe", "probe_instruction": AUTO_PROBE_INSTRUCTION}
            try:  # the probe reply's shape; any other schema gets the minimal object below
                return Answer(json.dumps(probe), request.response_schema.model_validate(probe))
            except ValidationError:
                pass
        if request.stage == "judge":
            return _judge_verdict(request, "the auto judge")
        if request.response_schema is None:
            return Answer("{}")
        return _schema_reply(request.response_schema, request, padded=False, origin="the auto set")


class EstimateRules:
    """The ``estimate`` set: stubs of representative length for the dry run.

    Rollouts answer ~400 tokens of filler text; optimizer stages a padded object valid for the
    response schema (every string ~60 tokens, every list three items); the judge a verdict with a
    short reason; preflight ``ok``. Replies depend on nothing but the request's stage and schema.
    """

    name = "estimate"
    rollout_tokens = 400

    def reply(self, request: ChatRequest, *, role: str, seed: int) -> Answer | NoAnswer:
        if request.stage == "preflight":
            return Answer("ok")
        if request.stage == "judge":
            verdict = {"verdict": "correct", "reason": _filler(160)}
            if request.response_schema is None:
                return Answer(json.dumps(verdict))
            try:
                return Answer(json.dumps(verdict), request.response_schema.model_validate(verdict))
            except ValidationError:
                pass
        elif request.stage == "rollout" and request.response_schema is None:
            return Answer(_filler(self.rollout_tokens * 4))
        if request.response_schema is None:
            return Answer(json.dumps({"reasoning": _filler(1200)}))
        return _schema_reply(request.response_schema, request, padded=True, origin="the estimate set")


def _auto_set(context: BackendContext) -> RuleSet:
    return AutoRules(RuleTable(parse_rules(context.scripted_target_rules, where="benchmark scripted_rules"),
                               where="benchmark scripted_rules"))


def _estimate_set(context: BackendContext) -> RuleSet:
    return EstimateRules()


#: Built-in rule sets by name; each entry builds its set from the backend context.
BUILTIN_SETS: Mapping[str, Callable[[BackendContext], RuleSet]] = MappingProxyType({
    "auto": _auto_set,
    "estimate": _estimate_set,
})

#: Entry-point group through which a benchmark plug-in gives the scripted backend a rule set of its own
#: (the demo world's ``demo`` set): the model layer never imports a benchmark.
RULE_SET_GROUP = "skillopt.scripted_rules"


def plugin_rule_sets() -> dict[str, Callable[[BackendContext], RuleSet]]:
    """The rule sets installed plug-ins register, by name."""
    return {entry.name: entry.load() for entry in entry_points(group=RULE_SET_GROUP)}


def resolve_rule_set(
    rules: list[dict[str, Any]] | str | None, context: BackendContext, *, where: str
) -> RuleSet:
    """The rule set named by ``options.rules`` (None → ``auto``)."""
    if rules is None:
        return BUILTIN_SETS["auto"](context)
    if isinstance(rules, list):
        return RuleTable(parse_rules(rules, where=where), where=where)
    if rules in BUILTIN_SETS:
        return BUILTIN_SETS[rules](context)
    plugins = plugin_rule_sets() if isinstance(rules, str) else {}
    if rules in plugins:
        return plugins[rules](context)
    path = Path(rules).expanduser()
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{where}: rules file {path} does not exist")
        return RuleTable(load_rules_file(path, where=where), where=f"{where} ({path})")
    raise ConfigError(
        f"{where}: unknown rule set {rules!r}; known sets: {', '.join([*BUILTIN_SETS, *plugins])} "
        "(or give a list of rules or the path of a YAML rules file)"
    )


# --- the backend ------------------------------------------------------------------------------


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 3] + "..."


class ScriptedBackend:
    """Answers ``ChatRequest``s from a rule set; stateless after construction, so thread-safe."""

    def __init__(self, rule_set: RuleSet, *, role: str = "target", default: ScriptedReply | None = None,
                 seed: int = 0) -> None:
        self.rule_set = rule_set
        self.role = role
        self.default = default
        self.seed = seed

    @classmethod
    def from_role(cls, role: ResolvedRole, context: BackendContext) -> ScriptedBackend:
        """Build the backend of ``role``; every rule is validated now (``ConfigError`` names the rule)."""
        options = ScriptedOptions.model_validate(role.options)
        where = f"model.{role.role}.options"
        rule_set = resolve_rule_set(options.rules, context, where=f"{where}.rules")
        default = (
            None if options.default is None else _validate(ScriptedReply, options.default, f"{where}.default")
        )
        seed = options.seed if options.seed is not None else (role.seed if role.seed is not None else 0)
        return cls(rule_set, role=role.role, default=default, seed=seed)

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        """One scripted reply; raises the rule's injected error, ``ParseError`` or ``ScriptedNoMatch``."""
        outcome = self.rule_set.reply(request, role=self.role, seed=self.seed)
        if isinstance(outcome, NoAnswer) and self.default is not None:
            produced = _produce(self.default, _Match(), request, self.seed, self.role, "the default reply")
            outcome = produced if produced is not None else outcome
        if isinstance(outcome, NoAnswer):
            raise ScriptedNoMatch(
                f"no scripted rule for stage {request.stage}: {outcome.reason}; "
                f"prompt: {_excerpt(request.last_user_text() or request.system_text())!r}",
                role=self.role, backend="scripted", model=MODEL_ID, stage=request.stage,
                hint="add a rule (or a default) for this stage",
            )
        if outcome.latency_s > timeout_s:
            raise CallTimeout(
                f"the scripted reply takes {outcome.latency_s:g} s, over the {timeout_s:g} s deadline",
                role=self.role, backend="scripted", model=MODEL_ID, stage=request.stage,
            )
        usage = Usage(
            prompt_tokens=_tokens(request.prompt_chars()), completion_tokens=_tokens(len(outcome.text))
        )
        if outcome.usage is not None:
            usage = usage.model_copy(update=outcome.usage.model_dump(exclude_none=True))
        return ChatResponse(
            text=outcome.text,
            parsed=outcome.parsed,
            usage=usage,
            latency_s=outcome.latency_s,
            model=MODEL_ID,
            backend="scripted",
            finish_reason="stop",
        )


def _build(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> ScriptedBackend:
    return ScriptedBackend.from_role(role, context)


INFO = BackendInfo(
    name="scripted",
    factory=_build,
    options_model=ScriptedOptions,
    default_model=MODEL_ID,
    key_env=None,
    key_required=False,
    default_timeout_s=120.0,
    requires=(),
    summary="deterministic offline replies from rules (tests, demos, dry runs); never opens a socket",
)
