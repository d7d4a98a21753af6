"""Answer extraction and string metrics shared by every benchmark.

- :func:`last_tag` and :func:`last_boxed` pull the final answer out of a target reply, and
  :func:`tag_or_last_line` adds the SearchQA fallbacks (the last non-empty line, else the reply);
- :func:`choice_label`, :func:`clean_label` and :func:`resolve_choice` read an option label of a
  multiple-choice answer (``(B).``, ``b``, the option's text, ``B because …``);
- :func:`normalise_squad`, :func:`exact_match`, :func:`token_f1`, :func:`best_f1` and
  :func:`sub_exact_match` are the SQuAD-style metrics (lowercase, punctuation stripped, articles
  dropped, whitespace collapsed);
- :func:`last_number` reads the last number of a text (digits or words), for numeric scorers;
- :func:`read_answer` is the one answer reader of the text benchmarks: the tagged answer, else a
  fallback (:func:`last_line`, :func:`leading_choice`, :func:`last_number_text`) whose answer is
  marked ``untagged``;
- :func:`quote_answer` is an answer as a fail_reason quotes it (one line, bounded).

Everything here is pure and never raises for odd input: an answer that cannot be read is ``None``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "AnswerReading",
    "Fallback",
    "best_f1",
    "choice_label",
    "clean_label",
    "exact_match",
    "label_contradicts",
    "last_line",
    "last_number_text",
    "leading_choice",
    "leading_label",
    "last_boxed",
    "last_number",
    "last_tag",
    "normalise_squad",
    "quote_answer",
    "read_answer",
    "resolve_choice",
    "sub_exact_match",
    "tag_or_last_line",
    "token_f1",
]

_BOXED = "\\boxed{"
_BOX_TOKENS = re.compile(r"<\|begin_of_box\|>(.*?)<\|end_of_box\|>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Thousands separators, currency signs and percent signs are noise around a number.
_LEADING_LABEL = re.compile(r"^\(?(?P<label>[A-Za-z]{1,2})(?P<sep>\)\s*|[.:]\s*|\s+|$)(?P<rest>.*)$",
                            re.DOTALL)
_NUMBER_NOISE = re.compile(r"(?<=\d),(?=\d)|[$€£¥%]")
#: Characters of an answer that a fail_reason quotes.
QUOTE_CHARS = 200
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_NUMBER_WORDS = {**{word: value for value, word in enumerate(_UNITS)},
                 **{word: 20 + 10 * index for index, word in enumerate(_TENS)}}
# A tens word may take a unit ("twenty-one", "twenty one"); whole words only.
_NUMBER_WORD = re.compile(rf"\b(?:(?:{'|'.join(_TENS)})(?:[- ](?:{'|'.join(_UNITS[1:10])}))?"
                          rf"|{'|'.join(_UNITS)})\b",
                          re.IGNORECASE)


@lru_cache(maxsize=32)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    name = re.escape(tag)
    # The body may not contain another opening tag, so "<a> x <a> y </a>" yields "y": the last pair.
    return re.compile(rf"<{name}>((?:(?!<{name}>).)*?)</{name}>", re.IGNORECASE | re.DOTALL)


def last_tag(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the LAST complete ``<tag>…</tag>`` pair, or None when there is none.

    Tags match case-insensitively and the content may span lines.
    """
    found = _tag_pattern(tag).findall(text or "")
    return found[-1].strip() if found else None


def _boxed_spans(text: str) -> Iterable[tuple[int, str]]:
    """(start, content) of every complete top-level ``\\boxed{…}``, by a balanced-brace scan."""
    position = 0
    while (start := text.find(_BOXED, position)) != -1:
        depth, index = 1, start + len(_BOXED)
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth:  # unbalanced: no complete box starts here; look for a later one inside it
            position = start + len(_BOXED)
            continue
        yield start, text[start + len(_BOXED) : index - 1]
        position = index


def last_boxed(text: str) -> str | None:
    """The stripped content of the last ``\\boxed{…}`` (nested braces kept) or
    ``<|begin_of_box|>…<|end_of_box|>``, whichever comes last; None when there is neither."""
    text = text or ""
    spans = list(_boxed_spans(text))
    spans += [(m.start(), m.group(1)) for m in _BOX_TOKENS.finditer(text)]
    if not spans:
        return None
    return max(spans, key=lambda span: span[0])[1].strip()


def normalise_squad(text: str) -> str:
    """SQuAD normalisation: lowercase, strip punctuation, drop a/an/the, collapse whitespace."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> bool:
    """The normalised prediction equals some normalised gold."""
    predicted = normalise_squad(prediction)
    return any(predicted == normalise_squad(gold) for gold in golds)


def token_f1(prediction: str, gold: str, *, normalise: Callable[[str], str] | None = None) -> float:
    """Token-overlap F1 of the normalised strings (SQuAD normalisation unless ``normalise`` is given):
    1 when both are empty, 0 when only one is."""
    normalise = normalise or normalise_squad
    predicted, expected = normalise(prediction).split(), normalise(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str, golds: Iterable[str]) -> float:
    """The best :func:`token_f1` over the golds (0 when there are none)."""
    return max((token_f1(prediction, gold) for gold in golds), default=0.0)


def sub_exact_match(prediction: str, golds: Iterable[str]) -> bool:
    """Containment either way after normalisation; an empty prediction or gold never matches."""
    predicted = normalise_squad(prediction)
    if not predicted:
        return False
    for gold in golds:
        expected = normalise_squad(gold)
        if expected and (expected in predicted or predicted in expected):
            return True
    return False


def last_number(text: str) -> float | None:
    """The last number in ``text``, in digits or in words (``three``, ``twenty-one``; thousands
    commas, currency signs and ``%`` ignored), or None."""
    text = _NUMBER_WORD.sub(lambda found: str(_word_value(found.group(0))), text or "")
    found = _NUMBER.findall(_NUMBER_NOISE.sub("", text))
    return float(found[-1]) if found else None


def _word_value(words: str) -> int:
    tens, _, unit = words.lower().replace(" ", "-").partition("-")
    return _NUMBER_WORDS[tens] + (_NUMBER_WORDS[unit] if unit else 0)


def quote_answer(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters with ``...``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def tag_or_last_line(text: str, tag: str = "answer") -> str:
    """The last ``<tag>`` pair's content, else the last non-empty line, else the whole reply (stripped)."""
    tagged = last_tag(text, tag)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else (text or "").strip()


def choice_label(index: int) -> str:
    """The label of option ``index`` (0-based): A, B, …, Z, AA, AB, …"""
    label = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        label = chr(ord("A") + rest) + label
    return label


def clean_label(text: str) -> str:
    """``text`` as a candidate option label: uppercased, whitespace, a leading ``(`` and trailing
    ``.``, ``)`` or ``:`` stripped (``" (b). "`` → ``"B"``). Whether it names an option is the
    caller's check."""
    return str(text).upper().strip().removeprefix("(").rstrip(".):").strip()


def resolve_choice(text: str, options: Mapping[str, str]) -> str | None:
    """The option label (a key of ``options``, label → text) that an answer names, or None.

    In order: the answer itself as a label (:func:`clean_label`: ``B``, ``(B)``, ``B.``); the
    option whose text equals the answer case-insensitively (whitespace collapsed); a leading label
    followed by text (``B. implausible``, ``B) implausible``, ``(B) implausible``, ``B because …``),
    unless that text is another option's text: a label whose text contradicts it names nothing.
    """
    label = clean_label(text)
    if label in options:
        return label
    wanted = _option_key(text)
    for key, option in options.items():
        if wanted and _option_key(option) == wanted:
            return key
    leading = leading_label(text, options)
    if leading is None:
        return None
    label, rest = leading
    rest_key = _option_key(rest)
    if rest_key and rest_key != _option_key(options[label]) and any(
            _option_key(option) == rest_key for key, option in options.items() if key != label):
        return None
    return label


def leading_label(text: str, options: Mapping[str, str]) -> tuple[str, str] | None:
    """``(label, rest)`` when ``text`` starts with one of the option labels followed by ``.``, ``)``,
    ``:`` or a space (``B. implausible`` → ``("B", "implausible")``), else None; case is ignored
    (labels are read uppercased)."""
    found = _LEADING_LABEL.match(str(text).strip())
    if found is None:
        return None
    label = found.group("label").upper()
    return (label, found.group("rest").strip()) if label in options else None


def label_contradicts(text: str, options: Mapping[str, str]) -> bool:
    """The answer starts with an option label whose text names a different option (``A. implausible``
    when A is *plausible* and B is *implausible*)."""
    return leading_label(text, options) is not None and resolve_choice(text, options) is None


def _option_key(text: str) -> str:
    """Option text as compared: casefolded, whitespace collapsed, trailing ``.`` and spaces dropped."""
    return " ".join(str(text).split()).casefold().rstrip(". ")


# ------------------------------------------------------------------------------- the answer reader


#: What a fallback returns for a reply that names more than one option (or restates the option list): no
#: answer, and the row says why.
AMBIGUOUS = "\x00ambiguous"


@dataclass(frozen=True)
class AnswerReading:
    """What :func:`read_answer` found: the answer text (None: nothing readable) and whether it came
    from the ``<answer>`` tag or from a fallback (``format`` is then ``untagged``); ``ambiguous`` when an
    untagged reply named more than one option (its text is then None: nothing is credited)."""

    text: str | None
    tagged: bool
    ambiguous: bool = False

    @property
    def format(self) -> str:
        """``tagged``, ``untagged`` (read by a fallback: the target lapsed on the format), ``ambiguous``
        (untagged and naming several options) or ``none``."""
        if self.ambiguous:
            return "ambiguous"
        if self.text is None:
            return "none"
        return "tagged" if self.tagged else "untagged"


#: A fallback reads an answer from a reply without an ``<answer>`` tag (None when it finds none).
Fallback = Callable[[str], "str | None"]


def read_answer(reply: str, fallback: Fallback | None = None, *, tag: str = "answer") -> AnswerReading:
    """The answer of a reply: the last ``<tag>`` pair's content; without one, what ``fallback``
    reads (marked untagged); None when neither finds anything."""
    tagged = last_tag(reply, tag)
    if tagged is not None:
        return AnswerReading(tagged, tagged=True)
    found = fallback(reply or "") if fallback else None
    if found == AMBIGUOUS:
        return AnswerReading(None, tagged=False, ambiguous=True)
    return AnswerReading(found, tagged=False)


def last_line(reply: str) -> str | None:
    """Fallback: the last non-empty line (stripped), or None for an empty reply."""
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else None


def leading_choice(options: Mapping[str, str]) -> Fallback:
    """Fallback for choice items: the first non-empty line read as an option — its leading label
    (``B``, ``(B)``, ``B.``/``B)`` + text) or an option's text; the label when one resolves, the
    line itself when its label contradicts its text (so the scorer can say so); ``AMBIGUOUS`` when lines
    of the reply name more than one option (an echoed option list credits nothing)."""
    def read(reply: str) -> str | None:
        lines = [line.strip() for line in reply.splitlines() if line.strip()]
        named = {label for line in lines if (label := resolve_choice(line, options)) is not None}
        if len(named) > 1:  # several options named, or the option list restated: no answer
            return AMBIGUOUS
        first = lines[0] if lines else ""
        label = resolve_choice(first, options) if first else None
        if label is not None:
            return label
        # A leading label whose text contradicts it is still the answer given: the scorer rejects it.
        return first if first and leading_label(first, options) is not None else None
    return read


def restates_options(lines: Sequence[str], options: Mapping[str, str]) -> bool:
    """Whether two or more ``lines`` are each an option as the prompt listed it: its label and its own text
    (``B. implausible``, ``(B) implausible``), its text alone, or its bare label. Reasoning lines that
    merely start with a label-like word (``A careful count …``) are not option lines."""
    restated = set()
    for line in lines:
        if (bare := clean_label(line)) in options:  # ``(A)`` alone on its line
            restated.add(bare)
        for label, text in options.items():
            key = _option_key(text)
            leading = leading_label(line, options)
            if (leading is not None and leading[0] == label and key and _option_key(leading[1]) == key) or (
                    key and _option_key(line) == key):
                restated.add(label)
    return len(restated) > 1


def last_choice_line(options: Mapping[str, str]) -> Fallback:
    """Fallback for choice items answered at the end of a reasoning: the last non-empty line, or
    ``AMBIGUOUS`` when the reply restates the option list (an echoed list would otherwise credit its last
    option)."""
    def read(reply: str) -> str | None:
        lines = [line.strip() for line in reply.splitlines() if line.strip()]
        if restates_options(lines, options):
            return AMBIGUOUS
        return lines[-1] if lines else None
    return read


def last_number_text(reply: str) -> str | None:
    """Fallback for numeric items: the last number of the reply, digits or words (``three``)."""
    value = last_number(reply)
    return None if value is None else f"{value:g}"
