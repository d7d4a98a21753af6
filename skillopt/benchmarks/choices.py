"""Multiple-choice options as benchmarks hold and show them: ``[{label, text}]`` lists.

- :func:`parse_options` reads the option shapes datasets use (strings, dicts, a label → text map);
- :func:`labelled` turns option texts into ``[{label, text}]`` labelled A, B, C… in order;
- :func:`options_block` renders options as the ``A. <text>`` lines every choice prompt shows;
- :func:`options_of` is the label → text mapping that :func:`skillopt.benchmarks.answers.resolve_choice`
  and the answer reader take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skillopt.benchmarks.answers import choice_label, clean_label

#: One option: ``{"label": "B", "text": "Jupiter"}``.
Option = Mapping[str, str]


def labelled(texts: Sequence[str]) -> list[dict[str, str]]:
    """``texts`` as options labelled A, B, C… in order."""
    return [{"label": choice_label(index), "text": str(text)} for index, text in enumerate(texts)]


def options_block(options: Sequence[Option]) -> str:
    """One ``<label>. <text>`` line per option (the ``## Choices`` body of a prompt)."""
    return "\n".join(f"{option['label']}. {option['text']}" for option in options)


def options_of(options: Sequence[Option]) -> dict[str, str]:
    """Label → text of ``options``."""
    return {option["label"]: option["text"] for option in options}


def parse_options(raw: Any, field: str = "choices") -> list[dict[str, str]]:
    """``[{label, text}]`` from a list of strings (labelled A, B, C… in order), a list of
    ``{label?, text|content|option}`` or a label → text dict; labels are cleaned (``(b).`` → ``B``).

    Raises ``ValueError`` naming ``field`` for another shape, an option without text or a repeated label.
    """
    if raw in (None, "", [], {}):
        return []
    if isinstance(raw, Mapping):
        pairs = [(str(label), text) for label, text in raw.items()]
    elif isinstance(raw, list | tuple):
        pairs = []
        for index, entry in enumerate(raw):
            if isinstance(entry, Mapping):
                text = next((entry[k] for k in ("text", "content", "option") if entry.get(k) is not None),
                            None)
                pairs.append((str(entry.get("label") or choice_label(index)), text))
            else:
                pairs.append((choice_label(index), entry))
    else:
        raise ValueError(f"field {field!r} must be a list or an object, got {type(raw).__name__}")
    options = []
    for label, text in pairs:
        if text is None or isinstance(text, Mapping | list):
            raise ValueError(f"field {field!r}: option {label!r} has no text (a 'text' or 'content' string)")
        options.append({"label": clean_label(label), "text": str(text).strip()})
    labels = [option["label"] for option in options]
    if len(set(labels)) != len(labels):
        raise ValueError(f"field {field!r} repeats a label: {labels}")
    return options
