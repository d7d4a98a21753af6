"""Named target models: ``model.targets.<name>``, a ``model.target`` block each.

A transfer matrix (``skillopt transfer --targets A B``) or a comparison on another model
(``skillopt compare ... --target NAME``) evaluates with a named target in place of ``model.target``.
``with_target`` gives the config and the command-line role choice for that: the named block becomes
``model.target`` (its values recorded as coming from ``model.targets.<name>``), and its backend and model
are pinned for the target role, so a ``--backend`` meant for the other roles does not replace them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skillopt.core.config import LoadedConfig, SkillOptConfig
from skillopt.core.errors import ConfigError


def target_names(config: SkillOptConfig) -> list[str]:
    return sorted(config.model.targets)


def check_targets(config: SkillOptConfig, names: Sequence[str], *, where: str = "--targets") -> None:
    """Every name is a ``model.targets`` entry; else one line naming the unknown ones and the known ones."""
    unknown = [name for name in names if name not in config.model.targets]
    if unknown:
        known = ", ".join(target_names(config)) or "none (define model.targets.<name> in your config)"
        raise ConfigError(f"{where}: unknown model config {', '.join(map(repr, unknown))}; model.targets "
                          f"defines: {known}")


def with_target(loaded: LoadedConfig, cli_roles: Mapping[str, Any] | None,
                name: str) -> tuple[LoadedConfig, dict[str, Any]]:
    """``loaded`` with ``model.targets.<name>`` as its target, and ``cli_roles`` with that target's backend
    and model pinned for the target role."""
    check_targets(loaded.config, [name], where="--target")
    spec = loaded.config.model.targets[name]
    data = loaded.config.model_dump(mode="json")
    data["model"]["target"] = spec.model_dump(mode="json")
    config = SkillOptConfig.model_validate(data)
    sources = {key: value for key, value in loaded.sources.items() if not key.startswith("model.target.")}
    origin = f"model.targets.{name}"
    # The block as a whole, its defaults too (role resolution reads it: model.target's own key is gone here).
    sources["model.target"] = origin
    for field in spec.model_fields_set:
        sources[f"model.target.{field}"] = loaded.sources.get(f"{origin}.{field}", origin)
    roles = {key: (dict(value) if isinstance(value, Mapping) else value)
             for key, value in (cli_roles or {}).items()}
    roles["role_backend"] = {**(roles.get("role_backend") or {}), "target": spec.backend}
    role_model = dict(roles.get("role_model") or {})
    if spec.model:
        role_model["target"] = spec.model
    else:
        role_model.pop("target", None)
    roles["role_model"] = role_model
    return LoadedConfig(config=config, sources=sources), roles
