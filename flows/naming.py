"""A flow run is named after the run directory it writes, so the Prefect UI and ``runs/`` use one name."""

from __future__ import annotations

import os
from typing import Any

from prefect.runtime import flow_run

from skillopt.core.config import load_config
from skillopt.core.data import data_overrides
from skillopt.core.errors import SkillOptError
from skillopt.flows.parameters import run_overrides
from skillopt.run.runs import run_directory_name


def config_overrides(data: str | None, overrides: list[str] | None, skill: str | None = None) -> list[str]:
    """The data's ``benchmark.*`` overrides (as ``--data`` gives them), the skill to start from
    (``train.skill_init``, as ``--skill`` gives it), then the given ones, which win."""
    return [*data_overrides(data), *([f"train.skill_init={skill}"] if skill else []), *(overrides or [])]


def run_directory_of(parameters: dict[str, Any], *, prefix: str | None = None) -> str:
    """The run directory name a flow run with ``parameters`` opens: ``run_name`` when given, else the
    config's (``<bench>[-<prefix>]-<yyyymmdd-hhmmss>-<config hash>`` unless ``run.run_name`` is set).
    A retried flow run keeps the name it has, so it resumes in the same directory."""
    if flow_run.run_count > 0 and flow_run.name:
        return str(flow_run.name)
    if parameters.get("run_name"):
        return str(parameters["run_name"])
    try:
        loaded = load_config(parameters["benchmark"], config_file=parameters.get("config_file"),
                             overrides=run_overrides(parameters),
                             env=os.environ)
    except SkillOptError:
        return str(parameters.get("benchmark", "skillopt"))  # the flow itself reports the config error
    return run_directory_name(parameters["benchmark"], loaded.config, prefix=prefix)


def train_run_name() -> str:
    """``flow_run_name`` of ``skill-train``."""
    return run_directory_of(flow_run.parameters)


def eval_run_name() -> str:
    """``flow_run_name`` of ``skill-eval``."""
    return run_directory_of(flow_run.parameters, prefix="eval")
