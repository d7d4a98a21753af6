"""The backend protocol and the registry of backends.

A backend is described by a ``BackendInfo``: its name, its option schema, its defaults (model,
base URL, credential variable, timeout) and a factory that builds the backend object for one
resolved role. Importing a backend module has no side effects and never imports its SDK; the
factory does that. Built-in backends live in ``skillopt/llm/<name>.py``; third parties register
theirs in the entry-point group ``skillopt.backends`` (the entry point loads a ``BackendInfo`` or a
zero-argument callable returning one).

``ChatBackend.attempt`` makes exactly one attempt and raises a classified ``BackendError``
(``RateLimited`` carries ``retry_after``); retries, rate limits, accounting and parsing live in
``skillopt.llm.clients.RoleClient``, the one layer that does them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from skillopt.core.errors import ConfigError
from skillopt.llm.chat import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from skillopt.llm.roles import ResolvedRole

ENTRY_POINT_GROUP = "skillopt.backends"


class NoOptions(BaseModel):
    """Option schema of a backend that takes no options."""

    model_config = ConfigDict(extra="forbid")


class SecretSource(Protocol):
    """Where credentials come from: the environment, or Prefect Secret blocks injected by the tasks layer."""

    def get(self, name: str) -> str | None: ...

    def get_block(self, name: str) -> str | None: ...


@dataclass(frozen=True)
class EnvSecrets:
    """Credentials from an environment mapping; Secret blocks are not available here."""

    env: Mapping[str, str]

    def get(self, name: str) -> str | None:
        value = self.env.get(name)
        return value or None

    def get_block(self, name: str) -> str | None:
        return None


@dataclass(frozen=True)
class BackendContext:
    """What a backend may need beyond its role: given by whoever builds the clients.

    ``protected_paths`` are folders an exec workspace must stay outside of (the repository
    checkout, the run directory, dataset roots). ``scripted_target_rules`` are the benchmark
    plug-in's target rules, used by the ``scripted`` backend's ``auto`` set.
    """

    run_id: str = "adhoc"
    protected_paths: tuple[Path, ...] = ()
    scripted_target_rules: tuple[Any, ...] = ()


@runtime_checkable
class ChatBackend(Protocol):
    """One model endpoint for one role.

    ``attempt`` sends the request once and returns the response, or raises a ``BackendError``
    subclass that says what went wrong (``AuthError``, ``BadRequest``, ``RateLimited`` with
    ``retry_after``, ``ServerError``, ``CallTimeout``, ``ConnectionFailed`` ...). It never retries,
    never returns an error text as an answer, and never returns an empty success for a failure.
    It must be safe to call from several threads at once.
    """

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse: ...


@dataclass(frozen=True)
class BackendInfo:
    """Everything the resolver and the clients need to know about one backend."""

    name: str
    #: Builds the backend object for one role: ``factory(role, secrets, context)``.
    factory: Callable[[ResolvedRole, SecretSource, BackendContext], Any]
    kind: Literal["chat", "exec"] = "chat"
    options_model: type[BaseModel] = NoOptions
    default_model: str | None = None
    default_base_url: str | None = None
    #: The conventional variable holding the key; None when the backend needs no key.
    key_env: str | None = None
    key_required: bool = True
    default_timeout_s: float = 120.0
    #: Conventional environment variables that fill a role field left null (e.g. base_url).
    env_fields: Mapping[str, str] = field(default_factory=dict)
    #: Backend-specific adjustments after options are validated (presets): returns field updates.
    adjust: Callable[[dict[str, Any], BaseModel, Mapping[str, str]], dict[str, Any]] | None = None
    #: Extras this backend needs, as (import name, pip extra) pairs, checked at preflight.
    requires: tuple[tuple[str, str], ...] = ()
    roles: tuple[str, ...] = ("target", "optimizer", "judge")
    summary: str = ""


_BUILTIN_MODULES = {
    "openai": "skillopt.llm.openai",
    "azure_openai": "skillopt.llm.azure_openai",
    "anthropic": "skillopt.llm.anthropic",
    "openai_compatible": "skillopt.llm.openai_compatible",
    "codex_exec": "skillopt.llm.codex_exec",
    "claude_code_exec": "skillopt.llm.claude_code_exec",
    "local": "skillopt.llm.local",
    "scripted": "skillopt.llm.scripted",
}


def builtin_backend_modules() -> list[str]:
    """The modules of the built-in backends."""
    return list(_BUILTIN_MODULES.values())


class BackendRegistry:
    """An explicit registry object, handed to the resolver; no global state."""

    def __init__(self, infos: Iterable[BackendInfo] = ()) -> None:
        self._infos: dict[str, BackendInfo] = {}
        for info in infos:
            self.register(info)

    def register(self, info: BackendInfo) -> None:
        if info.name in self._infos:
            raise ConfigError(f"backend {info.name!r} is registered twice")
        self._infos[info.name] = info

    def get(self, name: str) -> BackendInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise ConfigError(
                f"unknown backend {name!r}; registered backends: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    @classmethod
    def default(cls, *, include_entry_points: bool = True) -> BackendRegistry:
        """The built-in backends plus every backend registered under ``skillopt.backends``."""
        registry = cls(importlib.import_module(module).INFO for module in _BUILTIN_MODULES.values())
        if include_entry_points:
            for entry in entry_points(group=ENTRY_POINT_GROUP):
                if entry.name in registry:
                    continue
                loaded = entry.load()
                info = loaded() if callable(loaded) and not isinstance(loaded, BackendInfo) else loaded
                if not isinstance(info, BackendInfo):
                    raise ConfigError(f"entry point {ENTRY_POINT_GROUP}:{entry.name} did not give a "
                                      "BackendInfo")
                registry.register(info)
        return registry
