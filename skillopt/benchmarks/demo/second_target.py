"""A second simulated target for the demo world: a smaller model that follows fewer rules.

It answers like the demo's ``target`` (``skillopt.benchmarks.demo.scripted``) but applies at most
``ATTENTION_SPAN`` of the rules the skill states for the item's task type, the ones stated first; the
rest it overlooks. A skill that states many conventions therefore helps it less than it helps the demo
target, which is what a transfer matrix across the two (``model.targets.scripted_a`` / ``scripted_b`` of
the demo config) shows.
"""

from __future__ import annotations

from skillopt.benchmarks.demo.scripted import overlooked
from skillopt.benchmarks.demo.world import format_answer, parse_question, read_style
from skillopt.llm.chat import ChatRequest

#: How many of the stated rules (in the order the skill states them) this target applies.
ATTENTION_SPAN = 2


def target(request: ChatRequest, seed: int) -> str:
    """Answer the demo question with the first ``ATTENTION_SPAN`` active rules the system message states."""
    system = request.system_text()
    style = read_style(system)
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        problem = parse_question(message.text())
        if problem is not None:
            active = style.active(problem.task_type) - overlooked(system)
            kept = frozenset(sorted(active, key=lambda name: style.positions[name])[:ATTENTION_SPAN])
            return f"{problem.working}.\n<answer>{format_answer(problem, kept)}</answer>"
    return "I cannot find a question I know how to solve.\n<answer>unknown</answer>"
