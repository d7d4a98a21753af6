"""The evaluation deployments ``skillopt serve`` registers beside ``skill-train/<benchmark>``.

- ``skill-eval/<benchmark>``: score a skill on demand (by default the benchmark's promoted skill,
  ``registry:``; any registry version ``registry:<bench>@<N>``, file, folder or run directory from the
  Run form). No schedule.
- ``skill-compare/<benchmark>``: the paired comparison of two skills (by default the initial skill against
  the promoted one). No schedule.
- ``skill-transfer/matrix``: one deployment for every served benchmark: the promoted skill and the initial
  one on every named target model (``model.targets``) the served benchmarks' configs all define, on the serve
  schedule, so "does tonight's skill still help on model B" runs each night after training. Without named
  targets it is served unscheduled (its Run form takes them).

Each carries what ``skillopt serve`` was given (``--data``, ``-c``, ``-o``, the role options) as default
parameters, like the training deployments, and runs at most one at a time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from skillopt import __version__

#: The skills ``skill-compare`` and ``skill-transfer`` compare unless the Run form says otherwise.
DEFAULT_SKILLS = ("initial", "registry:")
#: The one transfer deployment's name: ``skill-transfer/matrix``.
TRANSFER_DEPLOYMENT = "matrix"


def deployment_names(benchmarks: Sequence[str]) -> list[str]:
    """The full names of the evaluation deployments served for ``benchmarks``."""
    return [*(f"{flow}/{benchmark}" for benchmark in benchmarks for flow in ("skill-eval", "skill-compare")),
            f"skill-transfer/{TRANSFER_DEPLOYMENT}"]


def shared_parameters(defaults: Any) -> dict[str, Any]:
    """The parameters every evaluation deployment takes from ``serve``'s command line (``RunDefaults``)."""
    parameters: dict[str, Any] = defaults.input_parameters()
    if defaults.cli_roles:
        parameters["cli_roles"] = dict(defaults.cli_roles)
    return parameters


def common_targets(benchmarks: Sequence[str], defaults: Any,
                   env: Mapping[str, str] = os.environ) -> list[str]:
    """The named target models (``model.targets``) that every benchmark's config defines, sorted."""
    from skillopt.core.config import load_config
    from skillopt.core.data import data_overrides

    names: set[str] | None = None
    for benchmark in benchmarks:
        loaded = load_config(benchmark, config_file=defaults.config_file,
                             overrides=[*data_overrides(defaults.data), *defaults.overrides], env=env)
        found = set(loaded.config.model.targets)
        names = found if names is None else names & found
    return sorted(names or ())


def decision_deployments(benchmarks: Sequence[str], defaults: Any, *, schedules: Any,
                         concurrency_limit: int = 1) -> list[Any]:
    """``skill-eval/<b>`` and ``skill-compare/<b>`` per benchmark, and one ``skill-transfer``."""
    from prefect.types.entrypoint import EntrypointType

    from skillopt.flows.compare import skill_compare
    from skillopt.flows.evaluate import skill_eval
    from skillopt.flows.transfer import skill_transfer

    shared = shared_parameters(defaults)
    common: dict[str, Any] = {"concurrency_limit": concurrency_limit, "version": __version__,
              "entrypoint_type": EntrypointType.MODULE_PATH}
    deployments = []
    for benchmark in benchmarks:
        tags = ["skillopt", f"benchmark:{benchmark}"]
        deployments.append(skill_eval.to_deployment(
            name=benchmark, parameters={"benchmark": benchmark, "skill_file": "registry:", **shared},
            description=f"Evaluate a {benchmark} skill on demand (default: the promoted one; any "
                        "registry:<bench>@<version>, file or run directory).", tags=tags, **common))
        deployments.append(skill_compare.to_deployment(
            name=benchmark, parameters={"benchmark": benchmark, "skill_a": DEFAULT_SKILLS[0],
                                        "skill_b": DEFAULT_SKILLS[1], **shared},
            description=f"Compare two {benchmark} skills item by item (default: the initial skill against "
                        "the promoted one): difference, 95% interval, p-value, flips, cost.", tags=tags,
            **common))
    targets = common_targets(benchmarks, defaults) if benchmarks else []
    deployments.append(skill_transfer.to_deployment(
        name=TRANSFER_DEPLOYMENT, parameters={"benchmarks": list(benchmarks), "skills": list(DEFAULT_SKILLS),
                                    "targets": targets, **shared},
        schedules=schedules if targets else None,
        description="The transfer matrix: skills x named target models x benchmarks, one cached evaluation "
                    "per cell; matrix.json, a heatmap and a table artifact.",
        tags=["skillopt", "transfer"], **common))
    return deployments
