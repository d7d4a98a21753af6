"""The ``azure_openai`` backend: Azure OpenAI deployments.

``model`` is the deployment name, ``price_model`` the underlying model, ``base_url`` the resource
endpoint. Authentication (``options.auth``): ``api_key``; ``entra`` and ``managed_identity`` through
the optional ``azure-identity`` extra; ``az_cli``, which runs ``az account get-access-token`` and
refreshes the token five minutes before it expires; ``auto`` picks the first that is available.
Bearer tokens are sent only to HTTPS hosts under Azure's OpenAI domains or ``trusted_hosts``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

from skillopt.core.errors import ConfigError, SecurityError
from skillopt.core.redact import Redactor
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.http_common import sdk_http_client
from skillopt.llm.openai import OpenAIWire, import_openai
from skillopt.llm.roles import ResolvedRole

DEFAULT_API_VERSION = "2024-10-21"
DEFAULT_SCOPE = "https://cognitiveservices.azure.com/.default"
TRUSTED_SUFFIXES = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
_REFRESH_MARGIN_S = 300


class AzureOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_version: str = DEFAULT_API_VERSION
    api: Literal["auto", "responses", "chat_completions"] = "auto"
    auth: Literal["auto", "api_key", "entra", "az_cli", "managed_identity"] = "auto"
    token_scope: str = DEFAULT_SCOPE
    client_id: str | None = None
    trusted_hosts: list[str] = Field(default_factory=list)


def check_token_host(endpoint: str, trusted_hosts: list[str]) -> None:
    """Refuse to send a bearer token anywhere but an HTTPS Azure host (or one the user trusts)."""
    parsed = urlparse(endpoint)
    host = (parsed.hostname or "").lower()
    trusted = host in {h.lower() for h in trusted_hosts} or host.endswith(TRUSTED_SUFFIXES)
    if parsed.scheme != "https" or not trusted:
        raise SecurityError(
            f"refusing to send an Azure bearer token to {parsed.scheme}://{host}: tokens go only to https "
            f"hosts under {', '.join('*' + s for s in TRUSTED_SUFFIXES)} or options.trusted_hosts"
        )


class AzCliToken:
    """A token from ``az account get-access-token``, cached and refreshed before it expires."""

    def __init__(self, scope: str, *, az: str, run: Callable[..., Any] = subprocess.run,
                 clock: Callable[[], float] = time.time) -> None:
        self.resource = scope.removesuffix("/.default")
        self.az = az
        self.run = run
        self.clock = clock
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            if self._token is None or self.clock() > self._expires - _REFRESH_MARGIN_S:
                self._token, self._expires = self._fetch()
            return self._token

    def _fetch(self) -> tuple[str, float]:
        argv = [self.az, "account", "get-access-token", "--resource", self.resource, "-o", "json"]
        proc = self.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise ConfigError("`az account get-access-token` failed; run `az login` (or choose "
                              "options.auth: api_key)")
        try:
            data = json.loads(proc.stdout)
            token = data["accessToken"]
        except (ValueError, KeyError):
            raise ConfigError("`az account get-access-token` printed no accessToken") from None
        if "expires_on" in data:
            expires = float(data["expires_on"])
        else:
            expires = (
                datetime.fromisoformat(str(data.get("expiresOn", ""))).timestamp()
                if data.get("expiresOn")
                else self.clock() + 3000
            )
        return token, expires


def _identity_available() -> bool:
    try:
        import azure.identity  # noqa: F401
    except ImportError:
        return False
    return True


def token_provider(
    role: ResolvedRole, options: AzureOptions, secrets: SecretSource
) -> tuple[str | None, Any]:
    """(api key, bearer-token provider): exactly one is set."""
    key = (
        secrets.get_block(role.api_key_secret) if role.api_key_secret else secrets.get(role.api_key_env or "")
    )
    auth = options.auth
    if auth == "auto":
        if key:
            auth = "api_key"
        elif _identity_available():
            auth = "entra"
        elif shutil.which("az"):
            auth = "az_cli"
        else:
            raise ConfigError(
                f"[{role.role}] azure_openai/{role.model}: no credential. Fix one of: export "
                f"{role.api_key_env or 'AZURE_OPENAI_API_KEY'} (or set model.{role.role}.api_key_env); "
                "pip install 'skillopt[azure]' for Entra ID; or install the az CLI and run `az login`"
            )
    if auth == "api_key":
        if not key:
            raise ConfigError(f"[{role.role}] azure_openai/{role.model}: no key; export {role.api_key_env} "
                              f"or set model.{role.role}.api_key_env")
        return key, None
    assert role.base_url is not None
    check_token_host(role.base_url, options.trusted_hosts)
    if auth == "az_cli":
        az = shutil.which("az")
        if not az:
            raise ConfigError("options.auth az_cli needs the `az` CLI on PATH")
        return None, AzCliToken(options.token_scope, az=az)
    if not _identity_available():
        raise ConfigError(f"options.auth {auth} needs `pip install 'skillopt[azure]'`")
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential, get_bearer_token_provider

    credential = (ManagedIdentityCredential(client_id=options.client_id) if auth == "managed_identity"
                  else DefaultAzureCredential())
    return None, get_bearer_token_provider(credential, options.token_scope)


def _factory(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> OpenAIWire:
    openai = import_openai()
    options = AzureOptions.model_validate(role.options)
    if not role.base_url:
        raise ConfigError(f"[{role.role}] azure_openai: no endpoint; export AZURE_OPENAI_ENDPOINT or set "
                          f"model.{role.role}.base_url")
    key, provider = token_provider(role, options, secrets)
    client = openai.AzureOpenAI(azure_endpoint=role.base_url, api_version=options.api_version, api_key=key,
                                azure_ad_token_provider=provider, max_retries=0,
                                http_client=sdk_http_client(openai))
    api = options.api
    if api == "auto":
        api = "responses" if role.capabilities.get("api") == "responses" else "chat_completions"
    return OpenAIWire(role, client, api="responses" if api == "responses" else "chat",
                      redactor=Redactor([key] if key else []))


INFO = BackendInfo(
    name="azure_openai",
    factory=_factory,
    options_model=AzureOptions,
    default_model=None,
    key_env="AZURE_OPENAI_API_KEY",
    key_required=False,  # Entra ID and az CLI work without a key
    env_fields={"base_url": "AZURE_OPENAI_ENDPOINT", "options.api_version": "AZURE_OPENAI_API_VERSION",
                "options.client_id": "AZURE_CLIENT_ID"},
    requires=(),
    summary="Azure OpenAI deployments: API key, Entra ID (skillopt[azure]), managed identity or the az CLI",
)
