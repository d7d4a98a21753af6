"""The ``skill-train`` flow's named parameters, turned into what a run is built from.

A person starting a run from the Prefect UI form or ``prefect deployment run skill-train/demo --param
epochs=1`` sets the common choices by name (epochs, batch size, learning rate, the starting skill, the
backend and model of each role); everything else goes through ``overrides``. Here the named ones become
config overrides (applied after ``overrides``, so the named field wins) and role options (over
``cli_roles``), in one place for the flow and for the flow run's name, which hashes the resolved config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skillopt.core.data import data_overrides

#: Named parameter -> the config key it sets.
CONFIG_PARAMETERS: dict[str, str] = {
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "learning_rate": "optimizer.learning_rate",
    "skill": "train.skill_init",
}
ROLES = ("target", "optimizer", "judge")
#: Named parameters of the model roles: every role's backend and model, then each role's own.
ROLE_PARAMETERS = ("backend", "model", *(f"{role}_{kind}" for role in ROLES for kind in ("backend", "model")))


def named_overrides(parameters: Mapping[str, Any]) -> list[str]:
    """The config overrides of the named parameters that are set, e.g. ``{"epochs": 1}`` →
    ``["train.epochs=1"]``."""
    return [f"{key}={parameters[name]}" for name, key in CONFIG_PARAMETERS.items()
            if parameters.get(name) is not None]


def run_overrides(parameters: Mapping[str, Any]) -> list[str]:
    """All overrides of a run, in the order they apply: the data's, ``overrides``, then the named ones."""
    return [*data_overrides(parameters.get("data")), *(parameters.get("overrides") or []),
            *named_overrides(parameters)]


def role_options(parameters: Mapping[str, Any], cli_roles: Mapping[str, Any] | None) -> dict[str, Any]:
    """``CliRoleOptions`` fields from ``cli_roles`` with the named role parameters over them."""
    roles: dict[str, Any] = dict(cli_roles or {})
    for kind in ("backend", "model"):
        if parameters.get(kind):
            roles[kind] = parameters[kind]
        per_role = dict(roles.get(f"role_{kind}") or {})
        for role in ROLES:
            if parameters.get(f"{role}_{kind}"):
                per_role[role] = parameters[f"{role}_{kind}"]
        if per_role:
            roles[f"role_{kind}"] = per_role
    return roles
