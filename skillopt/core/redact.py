"""Keeping secrets out of everything skillopt prints or writes (see docs/configuration.md, "Credentials").

A ``Redactor`` knows the secret values loaded in this process (the values of credential-like
environment variables) plus the shapes secrets usually have (``sk-…`` keys, ``Bearer`` tokens,
JWTs, Azure SAS signatures and connection strings, the ``user:password`` of a URL), and replaces
them with ``[REDACTED]``. The CLI passes its output through one; ``RedactingFilter`` does the same
for log records; :func:`redact_tree` does it for config dumps, where it also blanks the values of
credential-named keys in free-form maps (``extra_body``, headers).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"

#: Environment variables that hold provider credentials by convention (docs/backends.md).
CONVENTIONAL_KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "DASHSCOPE_API_KEY",
    "DEEPSEEK_API_KEY",
    "VLLM_API_KEY",
    "OPENAI_COMPATIBLE_API_KEY",
)

# Variable names whose values are treated as secrets wherever they appear.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# Values shorter than this are too likely to collide with ordinary text ("1", "true").
_MIN_SECRET_LENGTH = 8

_PATTERNS = (
    re.compile(r"\bsk-(?:ant-)?[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bBearer\s+[A-Za-z0-9._~+/\-]+=*", re.IGNORECASE),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}"),
    re.compile(r"\bsig=[A-Za-z0-9%+/=]{10,}"),  # Azure SAS signature
    re.compile(r"\b(?:AccountKey|SharedAccessKey|Password)=[^;\s]+", re.IGNORECASE),
    re.compile(r"(?<=://)[^/?#@\s]+(?=@)"),  # the userinfo of a URL (user:password@host)
)

#: Values that look like secrets by shape alone; the config loader refuses them as literals.
SECRET_VALUE_PATTERNS = _PATTERNS[:3]


_URL_WITH_USERINFO = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@")
# Words that make a header or body key name a credential ("Authorization", "x-api-key", "X-Auth-Token").
_CREDENTIAL_WORDS = {"authorization", "auth", "token", "password", "passwd", "secret", "credential",
                     "credentials", "cookie", "apikey", "signature"}
_CREDENTIAL_KEY = re.compile(r"(?:^|_)(?:api|subscription|access|secret|private|account)_key(?:$|_)")
#: Keys whose values are free-form maps sent to a provider as they are.
FREE_FORM_KEYS = ("extra_body",)


def url_has_credentials(value: str) -> bool:
    """True when ``value`` is a URL with a userinfo part (``scheme://user:password@host``)."""
    return bool(_URL_WITH_USERINFO.match(value))


def names_credential(key: str) -> bool:
    """True when a header or body key names a credential: ``Authorization``, ``api-key``, ``X-Auth-Token``,
    ``password``, ``client_secret``… (``max_tokens`` or ``prompt_cache_key`` do not)."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    return bool(set(words) & _CREDENTIAL_WORDS) or bool(_CREDENTIAL_KEY.search("_".join(words)))


def is_free_form(key: str) -> bool:
    """True for a config key whose value is a free-form map passed on to a provider (bodies, headers)."""
    lowered = key.lower()
    return lowered in FREE_FORM_KEYS or lowered.endswith("headers")


def redact_tree(value: Any, redactor: Redactor, *, free_form: bool = False) -> Any:
    """``value`` (plain data) with every string redacted, and inside free-form maps the value of every
    credential-named key replaced by ``[REDACTED]``."""
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {key: (REDACTED if free_form and names_credential(str(key)) and child not in (None, "")
                      else redact_tree(child, redactor, free_form=free_form or is_free_form(str(key))))
                for key, child in value.items()}
    if isinstance(value, list):
        return [redact_tree(child, redactor, free_form=free_form) for child in value]
    return value


def looks_like_secret(value: str) -> bool:
    """True when ``value`` has the shape of an API key, bearer token or JWT."""
    return any(p.search(value) for p in SECRET_VALUE_PATTERNS)


def secret_values_from_env(env: Mapping[str, str]) -> list[str]:
    """The values of credential-like variables in ``env`` (conventional names and ``*KEY*`` etc.)."""
    values = []
    for name, value in env.items():
        if not value or len(value) < _MIN_SECRET_LENGTH:
            continue
        if name in CONVENTIONAL_KEY_VARIABLES or _SECRET_NAME.search(name):
            values.append(value)
    return values


class Redactor:
    """Replaces known secret values and secret-shaped strings in text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Redactor:
        """A redactor for every credential-like variable in ``env`` (default: ``os.environ``)."""
        return cls(secret_values_from_env(os.environ if env is None else env))

    def add(self, secret: str) -> None:
        """Also redact ``secret`` from now on."""
        if secret and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        for pattern in _PATTERNS:
            text = pattern.sub(REDACTED, text)
        return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message (and drops the raw args) of each record."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redactor(record.getMessage())
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # Pre-render the traceback so the redacted text is what handlers print.
            record.exc_text = self.redactor(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
