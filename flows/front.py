"""``train.selection: pareto`` in the training flow: keeping the front, starting steps from it, the final
choice (the rules are ``skillopt.optimizer.pareto``'s; this module feeds them the run's evaluations).

Every evaluation used here is the selection split's, already made by the gate (or the baseline), so it is
answered from the run's finished evaluations without a new call.
"""

from __future__ import annotations

import logging

from skillopt.core.error_rows import answered_rows
from skillopt.core.paired import per_item_cost
from skillopt.flows.stages import TrainState, gate_value
from skillopt.optimizer.pareto import FRONT_FILE, Member, member_of
from skillopt.run.assembly import Run
from skillopt.run.skill_source import skill_tokens
from skillopt.tasks.rollout import evaluate

progress = logging.getLogger("skillopt.progress")


def uses_front(run: Run) -> bool:
    return run.config.train.selection == "pareto"


def _member(run: Run, skill: str, step: int) -> Member:
    evaluation = evaluate(run, skill, "val")
    cost = per_item_cost(evaluation.rows)
    return member_of(skill, step=step, score=gate_value(run, evaluation.scores),
                     rows=answered_rows(evaluation.rows), settings=run.config.evaluation,
                     skill_tokens=skill_tokens(skill), target_tokens=cost.tokens if cost.measured else None,
                     cost=cost.usd)


def admit(run: Run, state: TrainState, skill: str) -> None:
    """Put an accepted ``skill`` on the front (the starting skill first, when the front is empty)."""
    front = state.front
    front.objectives = list(run.config.evaluation.objectives)
    if not front.members:
        front.add(_member(run, state.initial_skill, 0))
    kept = front.add(_member(run, skill, state.step))
    plural = "s" if len(front.members) != 1 else ""
    progress.info("pareto front: %d skill%s (%s)%s", len(front.members), plural,
                  ", ".join(f"step {m.step}: {m.score:.3f}, {len(front.best_items(m))} items best"
                            for m in front.members), "" if kept else "; the accepted skill is dominated")
    write_front(run, state)


def start_from_front(run: Run, state: TrainState) -> None:
    """Make the step's starting skill a member of the front, drawn by ``Front.parent``."""
    if len(state.front.members) < 2:
        return
    parent = state.front.parent(seed=run.config.train.seed * 1_000_003 + state.step)
    if parent.skill != state.current_skill:
        state.current_skill, state.current_score = parent.skill, parent.score
        progress.info("step %d starts from the front's skill of step %d (%.3f)", state.step, parent.step,
                      parent.score)


def choose_final(run: Run, state: TrainState) -> None:
    """The run's best skill is the front's choice (``Front.choose``); it is also the last skill, so the final
    selection check confirms it."""
    if not state.front.members:
        return
    # The last skill (an epoch boundary may have changed it outside the gate) competes too, as the best
    # skill's final check would have let it.
    admit(run, state, state.current_skill)
    chosen = state.front.choose(run.config.evaluation, seed=run.config.train.seed)
    state.current_skill, state.current_score = chosen.skill, chosen.score
    state.best_skill, state.best_score, state.best_step = chosen.skill, chosen.score, chosen.step
    run.dir.write_best_skill(chosen.skill)
    write_front(run, state, chosen=chosen.sha)
    progress.info("pareto choice: the skill of step %d (%.3f, %d tokens) of %d on the front", chosen.step,
                  chosen.score, int(chosen.objectives.get("skill_tokens") or 0), len(state.front.members))


def write_front(run: Run, state: TrainState, *, chosen: str | None = None) -> None:
    """``front.json``: each member's step, sha, score, objectives and the items it is best on."""
    front = state.front
    run.dir.write_json(FRONT_FILE, {
        "objectives": front.objectives, "chosen": chosen,
        "members": [{"step": m.step, "sha": m.sha, "score": m.score, "objectives": m.objectives,
                     "best_items": front.best_items(m), "best_objectives": front.best_objectives(m),
                     "items": m.items}
                    for m in front.members],
    })
