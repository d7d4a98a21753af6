"""A demo world built for ``train.selection: pareto``: a target that keeps only the last rules it reads.

The target answers like the demo's (``skillopt.benchmarks.demo.scripted.target``) but applies only the
``SPAN`` rules stated last in the skill (by position), so a skill that adds new conventions at its end
forgets older ones: a later accepted skill wins the items of its new rules and loses the items of the rules
it pushed out, and two accepted skills win on different selection items.
"""

from __future__ import annotations

from skillopt.benchmarks.demo.world import format_answer, parse_question, read_style
from skillopt.llm.chat import ChatRequest

#: How many of the last-stated rules the target applies.
SPAN = 2


def target(request: ChatRequest, seed: int) -> str:
    system = request.system_text()
    style = read_style(system)
    recent = frozenset(sorted(style.positions, key=lambda name: style.positions[name])[-SPAN:])
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        problem = parse_question(message.text())
        if problem is not None:
            active = style.active(problem.task_type) & recent
            return f"{problem.working}.\n<answer>{format_answer(problem, active)}</answer>"
    return "I cannot find a question I know how to solve.\n<answer>unknown</answer>"
