"""Serve one ``skill-train`` deployment per registered benchmark (DESIGN.md §5.3).

Each deployment is named ``skill-train/<benchmark>``, runs ``mode: nightly`` by default (warm start
from the promoted skill, promote only what beats it), has a nightly cron schedule (default
``0 3 * * *`` UTC) and a deployment concurrency limit of 1: a run triggered while another run of the
same benchmark is still going waits in line instead of training beside it. Runs execute in child
processes of the serving process, in its working directory, so ``runs/``, the cache and the skill
registry land there. ``skillopt serve`` runs this; ``python -m skillopt.deployments.serve`` does the same.

    prefect deployment run skill-train/demo --param mode=train
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from skillopt import __version__
from skillopt.benchmarks.base import ENTRY_POINT_GROUP
from skillopt.errors import ConfigError

DEFAULT_CRON = "0 3 * * *"
DEFAULT_TIMEZONE = "UTC"
#: At most one run per benchmark at a time; later ones wait (Prefect's ENQUEUE collision strategy).
CONCURRENCY_PER_BENCHMARK = 1
FLOW_NAME = "skill-train"


def registered_benchmarks() -> list[str]:
    """The benchmark plug-ins installed under the ``skillopt.benchmarks`` entry point group, sorted."""
    return sorted({entry.name for entry in entry_points(group=ENTRY_POINT_GROUP)})


def chosen_benchmarks(names: Sequence[str]) -> list[str]:
    """``names`` checked against the registered benchmarks (all of them when ``names`` is empty)."""
    registered = registered_benchmarks()
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise ConfigError(f"skillopt serve: unknown benchmark {', '.join(map(repr, unknown))}; "
                          f"registered benchmarks: {', '.join(registered) or 'none'}")
    return list(dict.fromkeys(names)) or registered


def default_parameters(benchmark: str, *, config_file: str | None = None, overrides: Sequence[str] = (),
                       mode: str = "nightly") -> dict[str, Any]:
    """The parameters a deployment's runs get unless the trigger (UI form, ``--param``) changes them."""
    parameters: dict[str, Any] = {"benchmark": benchmark, "mode": mode}
    if config_file:
        parameters["config_file"] = config_file
    if overrides:
        parameters["overrides"] = list(overrides)
    return parameters


def build_deployments(benchmarks: Sequence[str], *, cron: str | None = DEFAULT_CRON, timezone: str = DEFAULT_TIMEZONE,
                      config_file: str | None = None, overrides: Sequence[str] = (), mode: str = "nightly") -> list[Any]:
    """One ``RunnerDeployment`` of ``skill-train`` per benchmark; ``cron=None`` or "" leaves them unscheduled."""
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from skillopt.flows.train import skill_train

    try:
        ZoneInfo(timezone)
        schedules = [Cron(cron, timezone=timezone)] if cron else None
    except (ValueError, ZoneInfoNotFoundError) as error:
        raise ConfigError(f"skillopt serve: not a valid schedule: cron {cron!r} in time zone {timezone!r} "
                          f"(expected five fields such as '{DEFAULT_CRON}' and an IANA zone such as UTC): "
                          f"{str(error).splitlines()[-1]}") from None
    deployments = []
    for benchmark in chosen_benchmarks(benchmarks):
        deployments.append(skill_train.to_deployment(
            name=benchmark,
            schedules=schedules,
            concurrency_limit=CONCURRENCY_PER_BENCHMARK,
            parameters=default_parameters(benchmark, config_file=config_file, overrides=overrides, mode=mode),
            description=f"Train the {benchmark} skill ({mode} by default: warm start from the promoted skill, "
                        "promote the new best only if it beats it on the selection split).",
            tags=["skillopt", f"benchmark:{benchmark}"],
            version=__version__,
            # Load the flow by module, so an installed package (a container, a work-pool host) finds it.
            entrypoint_type=EntrypointType.MODULE_PATH,
        ))
    return deployments


def serve_benchmarks(benchmarks: Sequence[str] = (), *, cron: str | None = DEFAULT_CRON,
                     timezone: str = DEFAULT_TIMEZONE, config_file: str | None = None,
                     overrides: Sequence[str] = (), mode: str = "nightly") -> None:
    """Register the deployments with the Prefect server and execute their runs until interrupted."""
    from prefect import serve

    serve(*build_deployments(benchmarks, cron=cron, timezone=timezone, config_file=config_file,
                             overrides=overrides, mode=mode))


if __name__ == "__main__":  # pragma: no cover - the CLI is the documented entry point
    from skillopt.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
