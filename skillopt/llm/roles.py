"""Resolving the three model roles.

``resolve_roles`` is the one function that turns a loaded config, the named CLI options and the
environment into three ``ResolvedRole`` objects (the judge may be unresolvable), each with the
provenance of every field. ``train``, ``eval``, ``demo``, ``--dry-run``, ``backends check`` and the
deployments all call it; none keeps its own copy.

Precedence per field: named CLI options > ``-o`` overrides > YAML > environment > the backend's
defaults, which are looked up only after the backend is known. The global ``--backend`` /
``--model`` fill only roles that get no per-role CLI option and no ``-o model.<role>.backend|model``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, ValidationError

from skillopt.core.config import (
    DEFAULT_SOURCE,
    ROLES,
    SHIPPED_SOURCE_PREFIX,
    LoadedConfig,
    RoleSpec,
    did_you_mean,
    is_benchmark_config_source,
)
from skillopt.core.errors import ConfigError
from skillopt.llm.base import BackendInfo, BackendRegistry

RoleName = Literal["target", "optimizer", "judge"]

#: Fields the judge inherits from the optimizer when it has no block of its own (§1.1).
JUDGE_INHERITED = ("backend", "model", "price_model", "base_url", "api_key_env", "api_key_secret", "options")
#: The default ``timeout_s`` of the ``local`` backend and of ``openai_compatible`` on a loopback address.
LOCAL_TIMEOUT_S = 600.0
_EFFORTS = ("none", "minimal", "low", "medium", "high", "max")


@dataclass(frozen=True)
class CliRoleOptions:
    """The named CLI options of §1.4 layer 1."""

    backend: str | None = None
    model: str | None = None
    role_backend: Mapping[str, str] = field(default_factory=dict)
    role_model: Mapping[str, str] = field(default_factory=dict)
    effort: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse_efforts(cls, items: list[str]) -> dict[str, str]:
        """``["target=low", "optimizer=high"]`` → a mapping, checked."""
        efforts = {}
        for item in items:
            role, _, level = item.partition("=")
            if role not in ROLES or level not in _EFFORTS:
                raise ConfigError(
                    f"--effort {role!r}: expected ROLE=LEVEL with ROLE in {', '.join(ROLES)} "
                    f"and LEVEL in {', '.join(_EFFORTS)}"
                )
            efforts[role] = level
        return efforts


class ResolvedRole(BaseModel):
    """One role, fully resolved: a backend, a model, validated options and where each came from.

    It holds no secret, only the name of the variable or Secret block that does, so it can be
    pickled, logged and written into ``config.yaml``.
    """

    model_config = ConfigDict(frozen=True)

    role: RoleName
    backend: str
    model: str | None
    price_model: str | None
    reasoning_effort: str | None
    max_tokens: int | None
    temperature: float | None
    seed: int | None
    timeout_s: float
    base_url: str | None
    api_key_env: str | None
    api_key_secret: str | None
    key_required: bool
    rate_limit_key: str
    extra_body: dict[str, Any]
    options: dict[str, Any]
    capabilities: dict[str, Any]
    strict_params: bool
    provenance: dict[str, str]
    #: ``model.<role>.context_tokens``: the context window, when the user states it.
    context_tokens: int | None = None
    #: ``model.<role>.structured_output``: how structured calls ask for their shape.
    structured_output: Literal["auto", "json_schema", "json_object", "prompt"] = "auto"

    def label(self) -> str:
        """``backend(preset)/model`` as error messages show it."""
        preset = self.options.get("preset")
        backend = f"{self.backend}({preset})" if preset and preset != "generic" else self.backend
        return f"{backend}/{self.model or '?'}"

    def short_label(self) -> str:
        """``backend/model`` with a model file path cut to its name (``…/SmolLM2-135M-Instruct-Q4_1.gguf``
        reads ``SmolLM2-135M-Instruct-Q4_1``): how notes and warnings name the model."""
        return f"{self.backend}/{short_model_name(self.model)}"

    def fingerprint(self) -> str:
        """A hash of what changes a reply (never secrets): part of every task's cache key."""
        host = urlparse(self.base_url).netloc if self.base_url else None
        payload = {
            "backend": self.backend,
            "model": self.model,
            "price_model": self.price_model,
            "effort": self.reasoning_effort,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "host": host,
            "preset": self.options.get("preset"),
            "extra_body": self.extra_body,
            "options": {k: v for k, v in sorted(self.options.items()) if k not in ("workspace_root",)},
        }
        if self.context_tokens:  # it decides how much of a long trajectory the prompt shows
            payload["context_tokens"] = self.context_tokens
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ResolvedRoles:
    target: ResolvedRole
    optimizer: ResolvedRole
    judge: ResolvedRole | None
    #: Why the judge cannot be resolved (None when it can).
    judge_problem: str | None = None

    def get(self, role: str) -> ResolvedRole | None:
        return getattr(self, role)


def resolve_roles(
    loaded: LoadedConfig,
    *,
    cli: CliRoleOptions | None = None,
    env: Mapping[str, str],
    registry: BackendRegistry,
) -> ResolvedRoles:
    """Resolve target, optimizer and judge. Raises ``ConfigError`` for an unusable target or optimizer."""
    cli = cli or CliRoleOptions()
    for role, name in cli.role_backend.items():  # a typo is an error even for a judge nobody needs
        _known_backend(role, name, "cli", registry)
    target = _resolve_one("target", loaded, cli, env, registry, inherited=None)
    optimizer = _resolve_one("optimizer", loaded, cli, env, registry, inherited=None)

    judge_spec = loaded.config.model.judge
    if judge_spec is None and "judge" not in cli.role_backend:
        switched_off = ResolvedRoles(target, optimizer, None,
                                     "model.judge is null (the judge is switched off)")
        check_providers(loaded, switched_off, env=env, registry=registry)
        return switched_off
    has_block = any(k.startswith("model.judge.") for k in loaded.sources) or "judge" in cli.role_backend
    inherited = None if has_block else optimizer
    try:
        judge = _resolve_one("judge", loaded, cli, env, registry, inherited=inherited)
    except ConfigError as exc:
        return ResolvedRoles(target, optimizer, None, str(exc))
    problem = None
    if judge.key_required and not (judge.api_key_secret or env.get(judge.api_key_env or "")):
        problem = (
            f"[judge] {judge.label()}: no credential: set {judge.api_key_env} or give the judge its own "
            "model.judge block"
        )
    resolved = ResolvedRoles(target, optimizer, judge, problem)
    check_providers(loaded, resolved, env=env, registry=registry)
    return resolved


#: Where a role's value came from when no config layer holds it: a named CLI option, or an endpoint taken from
#: the backend's environment variable (``OPENAI_BASE_URL``, …).
_CHOSEN_OUTSIDE_CONFIG = ("cli", "env:")


def recorded_config(loaded: LoadedConfig, roles: ResolvedRoles) -> LoadedConfig:
    """The config as the run uses it, for its run directory to record and hash: each role's values chosen on
    the command line (``--backend``, ``--target-backend``, ``--model``, ``--effort``, …) or taken from the
    backend's environment variables (its endpoint) written into ``model.<role>``, and the options the role
    left out (a replaced backend's, e.g. the demo's scripted ``rules``) removed, with their sources.

    Without it ``config.yaml`` named the config file's backend for a run that called another one, and a
    resume with another ``--model`` hashed the same as the run it continued: one run, two models."""
    data = loaded.config.model_dump()
    sources = dict(loaded.sources)
    changed = False
    for name in ROLES:
        role, spec = roles.get(name), data["model"].get(name)
        if role is None or spec is None:
            continue
        for field_name, source in role.provenance.items():
            if field_name in spec and field_name != "options" and source.startswith(_CHOSEN_OUTSIDE_CONFIG):
                changed |= spec[field_name] != getattr(role, field_name)
                spec[field_name] = getattr(role, field_name)
                sources[f"model.{name}.{field_name}"] = source
        for key in [key for key in spec["options"] if key not in role.options]:
            changed = True
            del spec["options"][key]
            sources.pop(f"model.{name}.options.{key}", None)
    if not changed:
        return loaded
    return LoadedConfig(config=type(loaded.config).model_validate(data), sources=sources)


def check_providers(loaded: LoadedConfig, roles: ResolvedRoles, *, env: Mapping[str, str],
                    registry: BackendRegistry) -> None:
    """Every ``model.providers`` entry is a key some role is limited by: its ``rate_limit_key`` (by default
    ``<backend>:<host[:port]>`` of its URL), ``exec:<backend>`` for an agentic CLI, or the key of a named
    target (``model.targets``). Else a ``ConfigError`` naming the entry, where it was set and the keys the
    roles have: an entry that matches no key would otherwise be ignored without a word. Not checked when a
    named target stands in for ``model.target`` (``skillopt.run.targets.with_target``)."""
    entries = loaded.config.model.providers
    if not entries or loaded.source_of("model.target").startswith("model.targets."):
        # A named target in place of model.target (transfer, compare --target): an entry may be for the
        # configured model.target, whose key is not known here.
        return
    users: dict[str, list[str]] = {}
    for name in ROLES:
        role = roles.get(name)
        if role is not None:
            for key in _limiter_keys(role, registry):
                users.setdefault(key, []).append(name)
    for name, key in _named_target_keys(loaded, env, registry):
        users.setdefault(key, []).append(f"targets.{name}")
    unused = [key for key in entries if key not in users]
    if not unused:
        return
    known = ", ".join(f"{key} ({', '.join(names)})" for key, names in users.items())
    lines = []
    for key in unused:
        prefix = f"model.providers.{key}"
        source = next((s for dotted, s in loaded.sources.items()
                       if dotted == prefix or dotted.startswith(f"{prefix}.")), None)
        where = f" (from {source})" if source else ""
        lines.append(f"model.providers: {key!r}{where} limits no role; the roles' keys are {known}; a key is "
                     "<backend>:<host[:port]> or a role's rate_limit_key")
    raise ConfigError("\n".join(lines))


def _limiter_keys(role: ResolvedRole, registry: BackendRegistry) -> list[str]:
    """The keys the clients' limiter takes for ``role``'s calls."""
    keys = [role.rate_limit_key]
    if registry.get(role.backend).kind == "exec":
        keys.append(f"exec:{role.backend}")
    return keys


def _named_target_keys(loaded: LoadedConfig, env: Mapping[str, str],
                       registry: BackendRegistry) -> list[tuple[str, str]]:
    """(name, key) for each ``model.targets`` entry, resolved as ``model.target`` with its backend pinned (as
    ``skillopt transfer`` and ``compare --target`` use it); one that does not resolve here gives the keys it
    states (its ``rate_limit_key``, or its backend and URL), and its own error when it is used."""
    found = []
    for name, spec in loaded.config.model.targets.items():
        model = loaded.config.model.model_copy(update={"target": spec})
        alone = LoadedConfig(config=loaded.config.model_copy(update={"model": model}), sources={})
        cli = CliRoleOptions(role_backend={"target": spec.backend},
                             role_model={"target": spec.model} if spec.model else {})
        try:
            role = _resolve_one("target", alone, cli, env, registry, inherited=None)
        except ConfigError:
            if spec.rate_limit_key:
                found.append((name, spec.rate_limit_key))
            elif spec.base_url:
                found.append((name, f"{spec.backend}:{urlparse(spec.base_url).netloc}"))
            continue
        found.extend((name, key) for key in _limiter_keys(role, registry))
    return found


def _resolve_one(
    role: str,
    loaded: LoadedConfig,
    cli: CliRoleOptions,
    env: Mapping[str, str],
    registry: BackendRegistry,
    *,
    inherited: ResolvedRole | None,
) -> ResolvedRole:
    spec: RoleSpec | None = getattr(loaded.config.model, role)
    values: dict[str, Any] = spec.model_dump() if spec is not None else {}
    provenance: dict[str, str] = {name: loaded.source_of(f"model.{role}.{name}") for name in values}

    if inherited is not None:
        for name in JUDGE_INHERITED:
            values[name] = getattr(inherited, name)
            provenance[name] = "inherited:optimizer"

    # Layer 1: named CLI options.
    backend_from_override = provenance.get("backend", "").startswith("-o ")
    model_from_override = provenance.get("model", "").startswith("-o ")
    if role in cli.role_backend:
        values["backend"], provenance["backend"] = cli.role_backend[role], "cli"
    elif cli.backend and not backend_from_override and inherited is None:
        values["backend"], provenance["backend"] = cli.backend, "cli"
    if role in cli.role_model:
        values["model"], provenance["model"] = cli.role_model[role], "cli"
    elif cli.model and not model_from_override and inherited is None:
        values["model"], provenance["model"] = cli.model, "cli"
    if role in cli.effort:
        values["reasoning_effort"], provenance["reasoning_effort"] = cli.effort[role], "cli"

    backend_name = _known_backend(role, values.get("backend") or "openai", provenance.get("backend", ""),
                                  registry)
    info = registry.get(backend_name)
    if role not in info.roles:
        raise ConfigError(f"model.{role}.backend: {backend_name} can serve only {', '.join(info.roles)}")
    values["backend"] = backend_name

    # Layer 4: the backend's conventional environment variables, where nothing above set a value.
    for name, variable in info.env_fields.items():
        if name.startswith("options."):
            key = name.split(".", 1)[1]
            if values["options"].get(key) is None and env.get(variable):
                values["options"] = {**values["options"], key: env[variable]}
                provenance[name] = f"env:{variable}"
        elif values.get(name) is None and env.get(variable):
            values[name], provenance[name] = env[variable], f"env:{variable}"

    kept = _options_for(role, info, values.get("options") or {}, loaded,
                        backend_source=provenance.get("backend", ""))
    options = _validate_options(role, info, kept, lambda key: provenance.get(f"options.{key}")
                                or loaded.source_of(f"model.{role}.options.{key}"))
    values["options"] = options.model_dump(exclude_none=False)
    if info.adjust is not None:
        for name, value in info.adjust(values, options, env).items():
            if values.get(name) is None or name == "options":
                values[name] = value
                provenance.setdefault(name, "default")

    # Layer 5: backend defaults, looked up only now that the backend is known.
    if values.get("model") is None:
        values["model"], provenance["model"] = info.default_model, "default"
    if values.get("base_url") is None:
        values["base_url"] = info.default_base_url
    if values.get("api_key_env") is None:
        values["api_key_env"] = info.key_env
    if values.get("timeout_s") is None:
        values["timeout_s"] = info.default_timeout_s
        on_this_machine = backend_name == "openai_compatible" and is_loopback(values.get("base_url"))
        if backend_name == "local" or on_this_machine:
            # A model on this machine is slow and serves one request at a time: give it room.
            values["timeout_s"] = max(info.default_timeout_s, LOCAL_TIMEOUT_S)
    if values.get("price_model") is None:
        values["price_model"] = values["model"]
    if values.get("rate_limit_key") is None:
        host = urlparse(values["base_url"]).netloc if values.get("base_url") else "local"
        values["rate_limit_key"] = f"{backend_name}:{host}"

    return ResolvedRole(
        role=role,  # type: ignore[arg-type]
        backend=backend_name,
        model=values["model"],
        price_model=values["price_model"],
        reasoning_effort=values.get("reasoning_effort"),
        max_tokens=values.get("max_tokens"),
        temperature=values.get("temperature"),
        seed=values.get("seed"),
        timeout_s=float(values["timeout_s"]),
        base_url=values.get("base_url"),
        api_key_env=values.get("api_key_env"),
        api_key_secret=values.get("api_key_secret"),
        key_required=bool(values.get("key_required", info.key_required)),
        rate_limit_key=values["rate_limit_key"],
        extra_body=dict(values.get("extra_body") or {}),
        options=values["options"],
        capabilities=dict(values.get("capabilities") or {}),
        strict_params=bool(values.get("strict_params")),
        context_tokens=values.get("context_tokens"),
        structured_output=values.get("structured_output") or "auto",
        provenance={k: v for k, v in provenance.items() if k in ResolvedRole.model_fields},
    )


def short_model_name(name: str | None) -> str:
    """A model id as messages show it: a file path (a GGUF on disk) cut to the file's name without
    ``.gguf``; any other id as it is."""
    name = name or "?"
    if name.startswith("/") or "\\" in name or name.lower().endswith(".gguf"):
        name = PurePath(name.replace("\\", "/")).name
        name = name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    return name


def is_loopback(url: str | None) -> bool:
    """Whether ``url`` points at this machine (127.0.0.0/8, ::1, localhost)."""
    host = (urlparse(url).hostname or "") if url else ""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _known_backend(role: str, name: str, source: str, registry: BackendRegistry) -> str:
    """``name`` as a registered backend (aliases normalised), or a one-line ``ConfigError`` naming
    where it was set and the backends there are."""
    try:
        normalised = RoleSpec.model_validate({"backend": name}).backend
    except ValidationError:
        normalised = None
    if normalised is None or normalised not in registry.names():
        where = f"--backend (or --{role}-backend)" if source == "cli" else f"model.{role}.backend"
        raise ConfigError(f"{where}: unknown backend {name!r}; the backends are: "
                          f"{', '.join(registry.names())}")
    return normalised


def _options_for(role: str, info: BackendInfo, options: Mapping[str, Any], loaded: LoadedConfig, *,
                 backend_source: str) -> dict[str, Any]:
    """The options to validate for ``info``'s backend.

    When a higher layer replaced the backend a config file named (``--backend``, ``-o``, an environment
    variable, or the user's file over the benchmark's own config) the options that file gave its backend (e.g.
    the demo's scripted ``rules``) do not apply: the keys the new backend does not take are left out. It does
    not matter whether the benchmark's config is the shipped copy or a ``configs/`` folder in the working
    directory. Options the user gave on the command line, in the environment or in the file that names the
    backend are always kept, and checked.
    """
    if _is_file_source(backend_source):
        def replaced_sources(source: str) -> bool:
            return source != backend_source and is_benchmark_config_source(source)
    else:
        replaced_sources = _is_file_source
    known = set(info.options_model.model_fields)
    return {key: value for key, value in options.items()
            if key in known or not replaced_sources(loaded.source_of(f"model.{role}.options.{key}"))}


def _is_file_source(source: str) -> bool:
    """A value set by a config file (shipped, or read from a path), or a default: not by the person on the
    command line or in the environment."""
    return source.startswith((SHIPPED_SOURCE_PREFIX, "yaml")) or source in ("", "default")


def _validate_options(role: str, info: BackendInfo, options: Mapping[str, Any],
                      source_of: Callable[[str], str]) -> BaseModel:
    """``options`` checked by the backend's options model; each problem names the option, a close valid name
    for a mistyped one, the backend and where the option was set."""
    try:
        return info.options_model.model_validate(dict(options))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in error["loc"])
            if error["type"] == "extra_forbidden":
                names = list(info.options_model.model_fields)
                message = f"unknown option{did_you_mean(loc, names, what='options')}"
            else:
                message = error["msg"]
            source = source_of(str(error["loc"][0])) if error["loc"] else DEFAULT_SOURCE
            where = "" if source == DEFAULT_SOURCE else f", from {source}"  # a missing option was set nowhere
            problems.append(f"model.{role}.options.{loc}: {message} (backend {info.name}{where})")
        raise ConfigError("; ".join(problems)) from None


def provenance_table(roles: ResolvedRoles, env: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """Rows (role, field, value, source) for the start-up table; secrets show as set/missing only."""
    rows = []
    for role_name in ROLES:
        role = roles.get(role_name)
        if role is None:
            rows.append((role_name, "-", "unresolved", roles.judge_problem or ""))
            continue
        for name in (
            "backend",
            "model",
            "price_model",
            "reasoning_effort",
            "max_tokens",
            "temperature",
            "seed",
            "timeout_s",
            "base_url",
            "rate_limit_key",
        ):
            rows.append((role_name, name, str(getattr(role, name)), role.provenance.get(name, "default")))
        rows.append((role_name, "credential", credential_state(role, env), ""))
    return rows


def credential_state(role: ResolvedRole, env: Mapping[str, str]) -> str:
    """``set (env:VAR)``, ``missing (env:VAR)``, ``Secret block NAME`` or ``not needed``; never the value."""
    if role.api_key_secret:
        return f"Secret block {role.api_key_secret}"
    if not role.api_key_env:
        return "not needed"
    state = "set" if env.get(role.api_key_env) else ("missing" if role.key_required else "optional, missing")
    return f"{state} (env:{role.api_key_env})"
