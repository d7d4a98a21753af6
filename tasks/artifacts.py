"""Publishing what a person sees in the Prefect UI (DESIGN.md §5.4).

The content is built by ``skillopt.artifacts`` (pure); this module only hands it to Prefect under
stable keys ``<bench>-<run>-<kind>``, so each key shows its latest version and its history.
Artifacts are a view: failing to publish one is logged, never fatal to training.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from skillopt.artifacts import artifact_key, edits_table, gate_table, progress_markdown, skill_diff_markdown
from skillopt.records import StepRecord
from skillopt.registry import RegistryEvent, promotion_markdown
from tasks.context import RunContext

log = logging.getLogger("skillopt.artifacts")


def _key(ctx: RunContext, kind: str) -> str:
    return artifact_key(ctx.benchmark.id, ctx.run_name, kind)


def _publish(kind: str, create: Any, **kwargs: Any) -> None:
    try:
        create(**kwargs)
    except Exception as error:  # noqa: BLE001 - a view must not stop training; the run dir has everything
        log.warning("could not publish the %s artifact: %s", kind, error)


def publish_progress(ctx: RunContext, step: int, total_steps: int, epoch: int, epochs: int, current: float,
                     best: float) -> None:
    markdown = progress_markdown(epoch, epochs, step, total_steps, current, best)
    _publish("progress", create_markdown_artifact, key=_key(ctx, "progress"), markdown=markdown,
             description=f"training progress of {ctx.run_name}")


def publish_step(ctx: RunContext, record: StepRecord, history: list[StepRecord], *, previous_skill: str,
                 current_skill: str) -> None:
    """The gate table, the step's edits and, for an accepted candidate, the skill diff."""
    _publish("gates", create_table_artifact, key=_key(ctx, "gates"), table=gate_table(history),
             description="gate decisions per step")
    if record.edits:
        _publish("edits", create_table_artifact, key=_key(ctx, "edits"),
                 table=edits_table(record.edits, record.apply_report, record.decision),
                 description=f"edits of step {record.step}")
    if record.gate is not None and record.decision != "reject" and previous_skill != current_skill:
        _publish("diff", create_markdown_artifact, key=_key(ctx, "skill-diff"),
                 markdown=skill_diff_markdown(record.step, previous_skill, current_skill, record.gate),
                 description=f"accepted skill change at step {record.step}")


def publish_promotion(ctx: RunContext, event: RegistryEvent) -> None:
    """A nightly run's promotion decision, with the scores it was made on."""
    _publish("promotion", create_markdown_artifact, key=_key(ctx, "promotion"), markdown=promotion_markdown(event),
             description=f"promotion decision of {ctx.run_name}")
