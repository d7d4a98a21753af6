"""What scoring attaches beyond the reply: judge calls and analyst-only references.

- :func:`verdict_request` is a judge call for the structured verdict ``{"verdict", "reason"}``: the
  benchmark's rubric as system text, the case as user text, and the tags the scripted judge grades by;
- :func:`hidden_reference_block` is the "Hidden reference" block a score's ``detail`` carries to the
  analyst only (theorem and sketch, a text-dominant question, reasoning paths, an expert plan),
  never to the target; at most 4000 characters.
"""

from __future__ import annotations

from collections.abc import Sequence

from skillopt.llm.chat import ChatRequest, system, user

#: The default judge rubric (``Benchmark.judge_request``).
GENERIC_RUBRIC = "Decide whether the answer is semantically equivalent to one of the gold answers."


#: An analyst-only hidden reference is cut to this many characters.
HIDDEN_REFERENCE_CHARS = 4000


def hidden_reference_block(lines: Sequence[str], *, use: str = "never teach its content") -> str:
    """The "Hidden reference" block a score's ``detail`` carries to the analyst (never to the target):
    a heading saying how it may be used, then ``lines``; at most 4000 characters, empty without lines."""
    if not lines:
        return ""
    block = f"Hidden reference (analyst only; {use}):\n" + "\n".join(lines)
    return block if len(block) <= HIDDEN_REFERENCE_CHARS else block[: HIDDEN_REFERENCE_CHARS - 3] + "..."


#: The reply format every judge rubric ends with (the structured verdict).
VERDICT_FORMAT = ('Reply with JSON {"verdict": "correct"|"incorrect", "reason": str}; '
                  "keep the reason to one sentence.")


def verdict_request(rubric: str, body: str, *, item_id: str, prediction: str,
                    golds: Sequence[str]) -> ChatRequest:
    """A judge call (stage ``judge``): the rubric as system text, the case as user text.

    The tags ``prediction`` and ``gold_answers`` let the scripted judge grade offline.
    """
    return ChatRequest(
        messages=[system(f"{rubric}\n\n{VERDICT_FORMAT}"), user(body)],
        stage="judge",
        tags={"item_id": item_id, "prediction": prediction, "gold_answers": [str(g) for g in golds]},
    )
