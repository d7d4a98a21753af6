"""Preflight of the model roles.

Per role: the resolved spec, whether the credential is present (never its value), a 0.5 s TCP
probe of the endpoint, the extras the backend needs, the exec CLI's version and flags, the GGUF
file. ``check_role(..., call=True)`` (``skillopt backends check``) also sends one counted
one-token request; the automatic preflight before ``train`` and ``eval`` makes no model call.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from skillopt.core.config import http_url_problem
from skillopt.core.errors import SkillOptError
from skillopt.llm.chat import ChatRequest, user
from skillopt.llm.clients import RoleClient
from skillopt.llm.roles import credential_state

PROBE_TIMEOUT_S = 0.5


@dataclass
class RoleCheck:
    role: str
    label: str
    ok: bool = True
    lines: list[str] = field(default_factory=list)
    problem: str | None = None

    def fail(self, problem: str) -> RoleCheck:
        self.ok = False
        self.problem = problem
        return self


def probe_endpoint(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the endpoint opens, else why not."""
    # A URL from an environment variable (OPENAI_BASE_URL …) has not been through the config's check.
    if problem := http_url_problem(base_url):
        return problem
    parsed = urlparse(base_url)
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"cannot reach {host}:{port} ({reason})"


def check_role(client: RoleClient, env: Mapping[str, str], *, call: bool) -> RoleCheck:
    """Check one role; with ``call`` also make one tiny counted request."""
    role = client.role
    check = RoleCheck(role.role, role.label())
    check.lines.append(f"credential: {credential_state(role, env)}")
    if role.key_required and not role.api_key_secret and not env.get(role.api_key_env or ""):
        return check.fail(f"no credential: export {role.api_key_env} or set model.{role.role}.api_key_env")
    for module, extra in client.info.requires:
        if importlib.util.find_spec(module) is None:
            return check.fail(f"the {role.backend} backend needs `pip install 'skillopt[{extra}]'`")
    model_path = role.options.get("model_path")
    if role.backend == "local" and model_path and not Path(model_path).is_file():
        return check.fail(f"model.{role.role}.options.model_path: no file at {model_path}")
    if client.info.kind == "chat" and role.base_url and role.backend not in ("scripted", "local"):
        problem = probe_endpoint(role.base_url)
        if problem:
            hint = "is the server running?" if problem.startswith("cannot reach") else "correct the URL"
            return check.fail(f"{problem}; {hint} (model.{role.role}.base_url)")
        check.lines.append(f"endpoint: {urlparse(role.base_url).netloc} reachable")
    try:
        backend = client.backend
        if client.info.kind == "exec":
            details = backend.preflight()
            check.lines.append(f"cli: {details['cli']} ({details['version']}), flags checked against its "
                               f"--help; sandbox {details['sandbox']}, {details['home']} home, auth "
                               f"{details['auth']}; no call made")
            if details["auth"] == "login" and details["home"] == "private":
                check.lines.append(
                    f"warning: the CLI will see no login: options.auth: login uses your login only with "
                    f"model.{role.role}.options.use_real_home: true; or set options.auth: api_key and export "
                    f"{role.api_key_env or 'the key variable'} (every item fails to authenticate otherwise)")
            return check
        if not call:
            return check
        response = client.chat(ChatRequest(
            messages=[user("Reply with the single word: ok")], stage="preflight", max_tokens=1,
            tags={"check": "backends"},
        ))
    except SkillOptError as error:
        return check.fail(str(error))
    usage = response.usage
    check.lines.append(
        f"call: served by {response.model or '?'} in {response.latency_s:.2f} s, "
        f"tokens in/out {usage.prompt_tokens}/{usage.completion_tokens}, attempts {response.attempts}"
    )
    listed = getattr(backend, "served_models", None)
    served = listed() if callable(listed) else None
    if served and role.model not in served:  # a server that ignores the field answers with what it has
        shown = ", ".join(served[:5]) + (" …" if len(served) > 5 else "")
        check.lines.append(f"warning: the server lists {shown}, not model.{role.role}.model "
                           f"{role.model!r}; the price table, the known context windows and the cache go by "
                           "that id: set it to the listed one")
    return check
