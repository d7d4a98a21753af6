"""The demo world: word problems whose exact answers follow conventions a skill can teach.

Five task types, each with a true value the target can always compute and *conventions* that
decide how the value is written. The gold answer applies every convention of its type, so a
target that computes correctly but formats its own way is wrong until its skill says how:

==========  ===================================================  ==========================================
task type   question (template)                                  conventions (gold example)
==========  ===================================================  ==========================================
distance    A car travels at 45 km/h for 0.75 hours. How far     ``one_decimal``, ``unit_km`` (``33.8 km``)
            does it travel?
price       Maya buys 3 notebooks at $2.50 each. What is the      ``dollar_prefix``, ``two_decimals``,
            total cost?                                           ``thousands_comma`` when ≥ 1000
                                                                  (``$7.50``, ``$5,460.00``)
city        What is the capital of Japan?                         ``uppercase_city`` (``TOKYO``)
date        The concert takes place on March 14, 2021. On what    ``iso_date`` (``2021-03-14``)
            date does it take place?
count       A garden has three red roses and five white roses.    ``digits`` (``8``)
            How many roses are there in total?
==========  ===================================================  ==========================================

A skill *states* a rule when one of its lines contains the rule's key phrases (``read_style``);
the scripted target (``skillopt.benchmarks.demo.scripted``) applies exactly the rules its system
prompt states. Three *harmful* rules exist too (``lowercase``, ``whole_numbers``, ``spell_out``):
each conflicts with a convention, and of two conflicting rules the one stated later wins.

Scoring (``score_response``): hard = exact match with gold; soft = the fraction of the item's
conventions the prediction satisfies, or 0 when the value itself is wrong. The ``detail`` line
(``Conventions: one_decimal=ok, unit_km=missing``) is what the optimizer reads in the evaluation
event. Everything here is pure and deterministic.
"""

from __future__ import annotations

import calendar
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from types import MappingProxyType

from skillopt.benchmarks.base import Score

TASK_TYPES: tuple[str, ...] = ("distance", "price", "city", "date", "count")
SPLIT_ORDER: tuple[str, ...] = ("train", "val", "test")


# --------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """A formatting rule the target follows when (and only when) its prompt states it.

    A line states the rule when every pattern in ``patterns`` matches it (case-insensitively).
    ``phrasings`` are skill lines that state it, canonical first; the scripted optimizer proposes
    them. A harmful rule overrides the conventions in ``conflicts`` (and is overridden by them)
    depending on which is stated later.
    """

    name: str
    task_types: tuple[str, ...]
    description: str
    patterns: tuple[str, ...]
    phrasings: tuple[str, ...]
    harmful: bool = False
    conflicts: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(p, re.IGNORECASE) for p in self.patterns))

    def stated_by(self, line: str) -> bool:
        """Whether ``line`` states this rule."""
        return all(pattern.search(line) for pattern in self._compiled)


CONVENTIONS: tuple[Rule, ...] = (
    Rule(
        "one_decimal", ("distance",), "distances are rounded to one decimal place (half up)",
        (r"\b(?:one|1|single)[ -]decimal|nearest tenth|\btenths?\b",),
        ("- Round distances to one decimal place (write a trailing .0 if needed).",
         "- Give every distance with exactly one decimal place, rounding half up."),
    ),
    Rule(
        "unit_km", ("distance",), "distances end with a space and the unit km",
        (r"\bkm\b", r"\bunit|append|suffix|kilomet"),
        ("- Append the unit km to every distance answer, separated by a space.",
         "- End each distance answer with a space and the unit km."),
    ),
    Rule(
        "dollar_prefix", ("price",), "money amounts start with a dollar sign",
        (r"\$|dollar", r"sign|symbol|prefix|start|begin|before"),
        ("- Prefix money amounts with a dollar sign ($), with no space after it.",
         "- Start every price answer with the $ symbol."),
    ),
    Rule(
        "two_decimals", ("price",), "money amounts have exactly two decimal places",
        (r"\b(?:two|2)[ -]decimal|nearest cent\b",),
        ("- Show money amounts with exactly two decimal places.",
         "- Always write prices to two decimal places, even when the cents are zero."),
    ),
    Rule(
        "thousands_comma", ("price",), "money amounts of 1000 or more group thousands with commas",
        (r"thousand", r"comma|separator|group"),
        ("- Group the thousands in money amounts with commas.",
         "- Use a comma as the thousands separator in prices of 1000 or more."),
    ),
    Rule(
        "uppercase_city", ("city",), "city names are written in uppercase",
        (r"upper[ -]?case|all[ -]caps|capital letters|block capitals",),
        ("- Write city names in UPPERCASE.", "- Give capital cities in all capital letters."),
    ),
    Rule(
        "iso_date", ("date",), "dates are written in ISO format YYYY-MM-DD",
        (r"\biso\b|yyyy-mm-dd",),
        ("- Write dates in ISO format, YYYY-MM-DD.", "- Format every date as YYYY-MM-DD (ISO 8601)."),
    ),
    Rule(
        "digits", ("count",), "counts are written with digits, never as words",
        (r"\bdigits?\b|\bnumerals?\b", r"count|number|how[ -]many|quantit|total|answer"),
        ("- Write counts as digits, not number words.", "- Answer how-many questions with numerals."),
    ),
)

HARMFUL_RULES: tuple[Rule, ...] = (
    Rule(
        "lowercase", ("city",), "every answer in lowercase",
        (r"lower[ -]?case|small letters",),
        ("- Write every answer in lowercase letters.",), harmful=True, conflicts=("uppercase_city",),
    ),
    Rule(
        "whole_numbers", ("distance", "price"), "numbers rounded to whole numbers",
        (r"whole numbers?|nearest integer|no decimals|without decimals",),
        ("- Round every numeric answer to the nearest whole number.",), harmful=True,
        conflicts=("one_decimal", "two_decimals"),
    ),
    Rule(
        "spell_out", ("count",), "numbers spelled out as words",
        (r"\bspell(?:ed|ing)?\s+(?:them\s+|it\s+)?out\b|\b(?:as|in) words\b",),
        ("- Spell out small numbers as words.",), harmful=True, conflicts=("digits",),
    ),
)

#: Lines that change nothing in this world: the gate sees no gain and rejects them.
USELESS_RULES: tuple[str, ...] = (
    "- Double-check your work before answering.",
    "- Read each question twice before you start.",
)

RULES: Mapping[str, Rule] = MappingProxyType({rule.name: rule for rule in (*CONVENTIONS, *HARMFUL_RULES)})


def conventions_of(task_type: str) -> tuple[Rule, ...]:
    """The conventions of ``task_type`` in canonical order."""
    return tuple(rule for rule in CONVENTIONS if task_type in rule.task_types)


def conflicts_of(name: str, task_type: str) -> tuple[str, ...]:
    """The rules that conflict with rule ``name`` on items of ``task_type`` (both directions)."""
    found = [other for other in RULES[name].conflicts if task_type in RULES[other].task_types]
    found += [r.name for r in RULES.values() if name in r.conflicts and task_type in r.task_types]
    return tuple(found)


@dataclass(frozen=True)
class Style:
    """Which rules a text states, with the offset of the last line stating each."""

    positions: Mapping[str, int]

    def states(self, name: str) -> bool:
        return name in self.positions

    def active(self, task_type: str) -> frozenset[str]:
        """The rules that apply to ``task_type``: stated, and not overridden by a conflicting rule
        stated later (a line stating both keeps both; the harmful one then wins when formatting)."""
        names = set()
        for rule in RULES.values():
            if task_type not in rule.task_types or rule.name not in self.positions:
                continue
            position = self.positions[rule.name]
            if not any(
                self.positions.get(other, -1) > position for other in conflicts_of(rule.name, task_type)
            ):
                names.add(rule.name)
        return frozenset(names)

    def overriding(self, convention: str) -> tuple[str, ...]:
        """The harmful rules stated after ``convention`` that switch it off on its task type."""
        rule = RULES[convention]
        position = self.positions.get(convention, -1)
        return tuple(
            other for task_type in rule.task_types for other in conflicts_of(convention, task_type)
            if self.positions.get(other, -1) > position
        )


def read_style(text: str) -> Style:
    """Which rules ``text`` states (line by line, key phrases, case-insensitive)."""
    positions: dict[str, int] = {}
    offset = 0
    for line in text.splitlines(keepends=True):
        for rule in RULES.values():
            if rule.stated_by(line):
                positions[rule.name] = offset
        offset += len(line)
    return Style(MappingProxyType(positions))


def lines_stating(text: str, name: str) -> list[str]:
    """The lines of ``text`` (right-stripped) that state rule ``name``, in order."""
    return [line.rstrip() for line in text.splitlines() if RULES[name].stated_by(line)]


# ------------------------------------------------------------------------------------ problems


NUMBER_WORDS: tuple[str, ...] = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)
MONTHS: tuple[str, ...] = tuple(calendar.month_name)[1:]
CAPITALS: Mapping[str, str] = MappingProxyType({
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa",
    "Egypt": "Cairo", "Norway": "Oslo", "Chile": "Santiago", "India": "New Delhi", "Spain": "Madrid",
    "Argentina": "Buenos Aires", "Thailand": "Bangkok", "Portugal": "Lisbon", "Ghana": "Accra",
    "Vietnam": "Hanoi", "Austria": "Vienna", "Mexico": "Mexico City", "Ireland": "Dublin",
    "Morocco": "Rabat", "Finland": "Helsinki", "Colombia": "Bogota", "Greece": "Athens",
    "Poland": "Warsaw", "Australia": "Canberra", "Hungary": "Budapest", "Senegal": "Dakar",
    "Sweden": "Stockholm", "Cuba": "Havana", "Nepal": "Kathmandu", "Italy": "Rome",
})

_VEHICLES: tuple[tuple[str, int, int], ...] = (
    ("car", 40, 120), ("train", 60, 160), ("bus", 30, 90), ("cyclist", 12, 30), ("ferry", 20, 45),
)
_HOURS: tuple[str, ...] = ("0.5", "0.75", "1", "1.25", "1.5", "2", "2.25", "2.5", "3", "3.5", "4")
_BUYERS: tuple[str, ...] = ("Maya", "Tom", "Priya", "Leo", "Ana")
_SMALL_GOODS: tuple[str, ...] = ("notebooks", "pens", "apples", "tickets", "candles", "mugs")
_BULK_BUYERS: tuple[str, ...] = ("A school", "A hotel", "An office", "A library")
_BULK_GOODS: tuple[str, ...] = ("chairs", "desks", "lamps", "tablets", "bookcases")
_EVENTS: tuple[str, ...] = ("concert", "conference", "school trip", "final exam", "wedding", "marathon")
_COUNT_SCENES: tuple[tuple[str, str, tuple[str, str]], ...] = (
    ("garden", "roses", ("red", "white")), ("shelf", "books", ("blue", "green")),
    ("parking lot", "cars", ("black", "silver")), ("basket", "apples", ("red", "yellow")),
    ("pond", "ducks", ("brown", "white")), ("drawer", "socks", ("striped", "plain")),
)

_DISTANCE_RE = re.compile(r"travels at (\d+) km/h for (\d+(?:\.\d+)?) hours?\b")
_PRICE_RE = re.compile(r"buys (\d+) [A-Za-z ]+? at \$(\d+\.\d{2}) each")
_CITY_RE = re.compile(r"What is the capital of ([A-Z][A-Za-z .'-]*?)\?")
_DATE_RE = re.compile(r"takes place on ([A-Z][a-z]+) (\d{1,2}), (\d{4})\b")
_COUNT_RE = re.compile(r"has (\w+) \w+ (\w+) and (\w+) \w+ \2\. How many \2\b")


@dataclass(frozen=True)
class Problem:
    """A parsed question: its task type and true value (``words``: a count question spells numbers out)."""

    task_type: str
    value: Decimal | str | date | int
    words: bool = False
    working: str = ""


def _count_token(token: str) -> int | None:
    if token.isdigit():
        return int(token)
    lowered = token.lower()
    return NUMBER_WORDS.index(lowered) if lowered in NUMBER_WORDS else None


def parse_question(text: str) -> Problem | None:
    """The problem a question states, or None when ``text`` holds no demo question."""
    if m := _DISTANCE_RE.search(text):
        speed, hours = Decimal(m.group(1)), Decimal(m.group(2))
        return Problem("distance", speed * hours, working=f"distance = {speed} km/h x {hours} h")
    if m := _PRICE_RE.search(text):
        quantity, unit = int(m.group(1)), Decimal(m.group(2))
        return Problem("price", quantity * unit, working=f"total = {quantity} x {unit}")
    if (m := _CITY_RE.search(text)) and m.group(1) in CAPITALS:
        return Problem("city", CAPITALS[m.group(1)], working=f"the capital of {m.group(1)}")
    if (m := _DATE_RE.search(text)) and m.group(1) in MONTHS:
        try:
            day = date(int(m.group(3)), MONTHS.index(m.group(1)) + 1, int(m.group(2)))
        except ValueError:
            return None
        return Problem("date", day, working="the date named in the question")
    if m := _COUNT_RE.search(text):
        first, second = _count_token(m.group(1)), _count_token(m.group(3))
        if first is None or second is None:
            return None
        return Problem("count", first + second, words=not m.group(1).isdigit(),
                       working=f"{first} + {second} {m.group(2)}")
    return None


def _number(value: Decimal, *, places: int | None, commas: bool) -> str:
    grouping = "," if commas else ""
    if places is None:
        return format(value.normalize(), f"{grouping}f")
    rounded = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return format(rounded, f"{grouping}.{places}f")


def format_answer(problem: Problem, active: frozenset[str]) -> str:
    """``problem``'s value written with the rules in ``active`` (a harmful rule beats its convention).

    Unstated conventions fall back to the target's own habits: the shortest plain number, the
    city as usually spelled, the date as the question wrote it, and counts in the question's style.
    """
    value = problem.value
    if problem.task_type in ("distance", "price"):
        assert isinstance(value, Decimal)
        decimals = "one_decimal" if problem.task_type == "distance" else "two_decimals"
        places = 0 if "whole_numbers" in active else (
            (1 if decimals == "one_decimal" else 2) if decimals in active else None)
        number = _number(value, places=places, commas="thousands_comma" in active)
        if problem.task_type == "distance":
            return f"{number} km" if "unit_km" in active else number
        return f"${number}" if "dollar_prefix" in active else number
    if problem.task_type == "city":
        assert isinstance(value, str)
        if "lowercase" in active:
            return value.lower()
        return value.upper() if "uppercase_city" in active else value
    if problem.task_type == "date":
        assert isinstance(value, date)
        return (
            value.isoformat()
            if "iso_date" in active
            else f"{MONTHS[value.month - 1]} {value.day}, {value.year}"
        )
    assert isinstance(value, int)
    in_words = "spell_out" in active or ("digits" not in active and problem.words)
    return NUMBER_WORDS[value] if in_words and value < len(NUMBER_WORDS) else str(value)


def gold_answer(problem: Problem) -> str:
    """The gold answer: every convention of the problem's type applied."""
    return format_answer(problem, frozenset(rule.name for rule in conventions_of(problem.task_type)))


# ---------------------------------------------------------------------------------- generation


def _distance_question(rng: random.Random, index: int) -> str:
    vehicle, low, high = rng.choice(_VEHICLES)
    speed = rng.randint(low, high)
    hours = rng.choice(_HOURS)
    unit = "hour" if hours == "1" else "hours"
    return f"A {vehicle} travels at {speed} km/h for {hours} {unit}. How far does it travel?"


def _price_question(rng: random.Random, index: int) -> str:
    # In every three price items: one bulk order (a total of 1000 or more) and one whole-dime
    # price (a total like 7.50, which the untaught target writes 7.5), so any split with three
    # price items shows every price convention.
    if index % 3 == 2:
        buyer, goods = rng.choice(_BULK_BUYERS), rng.choice(_BULK_GOODS)
        quantity, cents = rng.randint(100, 400), rng.randint(1000, 9999)
    else:
        buyer, goods = rng.choice(_BUYERS), rng.choice(_SMALL_GOODS)
        quantity = rng.randint(2, 9)
        cents = rng.randint(3, 99) * 10 if index % 3 == 1 else rng.randint(25, 999)
    return (
        f"{buyer} buys {quantity} {goods} at ${cents // 100}.{cents % 100:02d} each. What is the total cost?"
    )


def _city_question(rng: random.Random, index: int) -> str:
    return f"What is the capital of {rng.choice(sorted(CAPITALS))}?"


def _date_question(rng: random.Random, index: int) -> str:
    event = rng.choice(_EVENTS)
    when = date(rng.randint(1990, 2030), rng.randint(1, 12), rng.randint(1, 28))
    return (f"The {event} takes place on {MONTHS[when.month - 1]} {when.day}, {when.year}. "
            "On what date does it take place?")


def _count_question(rng: random.Random, index: int) -> str:
    place, noun, (first_kind, second_kind) = rng.choice(_COUNT_SCENES)
    first, second = rng.randint(2, 9), rng.randint(2, 9)
    # Every other count question spells its numbers out; the untaught target answers in kind,
    # so the first count item of a split is solved without any convention (a non-zero baseline).
    spell = index % 2 == 1
    a, b = (NUMBER_WORDS[first], NUMBER_WORDS[second]) if spell else (str(first), str(second))
    article = "An" if place[0] in "aeiou" else "A"
    return (f"{article} {place} has {a} {first_kind} {noun} and {b} {second_kind} {noun}. "
            f"How many {noun} are there in total?")


_QUESTION_MAKERS = MappingProxyType({
    "distance": _distance_question, "price": _price_question, "city": _city_question,
    "date": _date_question, "count": _count_question,
})

# Attempts at a question not used before in any split; after that a repeat is allowed, so very
# large configured sizes still generate (the city table is finite).
_UNIQUE_ATTEMPTS = 50


def generate_splits(split_seed: int, sizes: Mapping[str, int]) -> dict[str, list[dict[str, str]]]:
    """Build the train/val/test items from ``split_seed`` (same seed and sizes → same items).

    Each split has ``sizes[split]`` items with ids ``demo-<split>-NNN`` (0-based), task types in
    equal shares (shuffled), and questions not repeated across splits while the tables allow it.
    Each split has its own random stream, so resizing one split leaves the others' task-type order alone.
    """
    seen: set[str] = set()
    splits: dict[str, list[dict[str, str]]] = {}
    for split in SPLIT_ORDER:
        rng = random.Random(f"skillopt-demo:{split_seed}:{split}")
        n = sizes.get(split, 0)
        kinds = [TASK_TYPES[i % len(TASK_TYPES)] for i in range(n)]
        rng.shuffle(kinds)
        per_type = dict.fromkeys(TASK_TYPES, 0)
        items = []
        for position, kind in enumerate(kinds):
            make = _QUESTION_MAKERS[kind]
            for _ in range(_UNIQUE_ATTEMPTS):
                question = make(rng, per_type[kind])
                if question not in seen:
                    break
            seen.add(question)
            per_type[kind] += 1
            problem = parse_question(question)
            assert problem is not None and problem.task_type == kind, question
            items.append({
                "id": f"demo-{split}-{position:03d}", "task_type": kind, "question": question,
                "answer": gold_answer(problem),
            })
        splits[split] = items
    return splits


# ------------------------------------------------------------------------------------- scoring


_ANSWER_TAG = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.IGNORECASE | re.DOTALL)
_NUMERIC = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_WRITTEN_DATE = re.compile(r"([A-Za-z]+)\.? (\d{1,2}),? (\d{4})")


def last_answer(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>…</answer>`` pair, or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def _decimal(text: str) -> Decimal | None:
    if not _NUMERIC.fullmatch(text):
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def _date(text: str) -> date | None:
    try:
        if m := _ISO.fullmatch(text):
            return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if (m := _WRITTEN_DATE.fullmatch(text)) and m.group(1).capitalize() in MONTHS:
            return date(int(m.group(3)), MONTHS.index(m.group(1).capitalize()) + 1, int(m.group(2)))
    except ValueError:
        return None
    return None


def _amount(text: str, *, prefix: str = "", suffix: str = "") -> tuple[str, Decimal | None]:
    """The numeric part of a money or distance answer and its value (None if not a number)."""
    body = text.strip()
    body = body[len(prefix):].strip() if prefix and body.startswith(prefix) else body
    if suffix and body.lower().endswith(suffix):
        body = body[: -len(suffix)].strip()
    return body, _decimal(body)


@dataclass(frozen=True)
class Check:
    """How a prediction fares against gold: is its value right, and which conventions it follows."""

    value_ok: bool
    conventions: Mapping[str, bool]

    @property
    def soft(self) -> float:
        if not self.value_ok or not self.conventions:
            return float(self.value_ok)
        return sum(self.conventions.values()) / len(self.conventions)


def applicable_conventions(task_type: str, gold: str) -> tuple[str, ...]:
    """The conventions an item's answer depends on (``thousands_comma`` only for amounts ≥ 1000)."""
    names = [rule.name for rule in conventions_of(task_type)]
    if task_type == "price":
        _, value = _amount(gold, prefix="$")
        if value is None or abs(value) < 1000:
            names.remove("thousands_comma")
    return tuple(names)


def check_answer(task_type: str, predicted: str, gold: str) -> Check:
    """Compare ``predicted`` with ``gold`` value-wise and convention by convention."""
    names = applicable_conventions(task_type, gold)
    checks: dict[str, bool] = {}
    text = predicted.strip()
    if task_type == "distance":
        number, value = _amount(text, suffix="km")
        _, gold_value = _amount(gold, suffix="km")
        # One decimal of rounding apart is still the right distance, just not written to convention.
        value_ok = value is not None and gold_value is not None and abs(value - gold_value) <= Decimal("0.05")
        checks = {"one_decimal": re.fullmatch(r"-?\d+\.\d", number) is not None,
                  "unit_km": text.endswith(" km")}
    elif task_type == "price":
        number, value = _amount(text, prefix="$")
        _, gold_value = _amount(gold, prefix="$")
        value_ok = value is not None and gold_value is not None and abs(value - gold_value) < Decimal("0.005")
        checks = {"dollar_prefix": text.startswith("$"),
                  "two_decimals": re.fullmatch(r"-?[\d,]+\.\d\d", number) is not None,
                  "thousands_comma": re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", number) is not None}
    elif task_type == "city":
        value_ok = text.casefold() == gold.casefold()
        checks = {"uppercase_city": any(c.isalpha() for c in text) and text == text.upper()}
    elif task_type == "date":
        value_ok = _date(text) is not None and _date(text) == _date(gold)
        checks = {"iso_date": _ISO.fullmatch(text) is not None}
    else:
        value_ok = _count_token(text) is not None and _count_token(text) == _count_token(gold)
        checks = {"digits": text.isdigit()}
    return Check(value_ok, MappingProxyType({name: checks[name] for name in names}))


def conventions_line(check: Check | None, names: Iterable[str], *, answered: bool = True) -> str:
    """The ``detail`` line of the evaluation event: ``Conventions: a=ok, b=missing[; value=wrong]``."""
    marks = ", ".join(f"{name}={'ok' if check is not None and check.conventions[name] else 'missing'}"
                      for name in names)
    line = f"Conventions: {marks or 'none'}"
    if not answered:
        return f"{line}; value=missing"
    return line if check is not None and check.value_ok else f"{line}; value=wrong"


def score_response(task_type: str, gold: str, response_text: str) -> Score:
    """Score one reply (never raises for a bad answer): see the module docstring."""
    names = applicable_conventions(task_type, gold)
    predicted = last_answer(response_text)
    if not predicted:
        reason = "no <answer> tag" if predicted is None else "empty <answer> tag"
        return Score(
            hard=0.0,
            soft=0.0,
            predicted_answer="",
            fail_reason=f"no-answer: {reason}",
            expected=gold,
            detail=conventions_line(None, names, answered=False),
            extras={"conventions": {}},
        )
    check = check_answer(task_type, predicted, gold)
    hard = 1.0 if predicted == gold else 0.0
    return Score(
        hard=hard,
        soft=1.0 if hard else check.soft,
        predicted_answer=predicted,
        fail_reason="" if hard else f"wrong: predicted {predicted!r}, expected {gold!r}",
        expected=gold,
        detail=conventions_line(check, names),
        extras={"conventions": dict(check.conventions)},
    )
