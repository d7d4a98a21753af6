"""Exceptions raised by the skillopt library.

Every error a user can cause (bad config, bad data, a malformed skill) derives from
``SkillOptError`` so the CLI can print its message without a traceback. Messages say what
was wrong, where, and what was expected; they never echo a configuration value, which
might be a secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class SkillOptError(Exception):
    """Base class of every error skillopt raises on purpose."""


class ConfigError(SkillOptError, ValueError):
    """The configuration is invalid: an unknown key, a wrong type, a literal secret, a bad file."""


class DataError(SkillOptError, ValueError):
    """A dataset or split cannot be used: missing fields, duplicate ids, empty splits, bad encoding."""


class SkillFormatError(SkillOptError, ValueError):
    """A skill document's protected blocks are malformed (unbalanced or out-of-order markers)."""


class SecurityError(SkillOptError):
    """An action would expose a secret or reach outside its allowed paths."""


class StorageError(SkillOptError, OSError):
    """A file or folder skillopt must write cannot be written: a read-only place, a full disk, a lock held."""


def storage_error(path: object, error: OSError, doing: str = "write") -> StorageError:
    """One line naming ``path`` and the system's reason, e.g. "cannot write runs/x/summary.json: No space left
    on device"."""
    return StorageError(f"cannot {doing} {path}: {error.strerror or error}")


class BenchmarkSetupError(SkillOptError):
    """A benchmark's external requirement is missing (data, images, a judge, a tool); the message says
    how to fix it."""


class BenchmarkPluginError(SkillOptError):
    """A benchmark plug-in's own code failed or broke its contract: it cannot be loaded, or one of its
    methods raised or returned what the runner cannot use. The run stops; the message names the
    benchmark, the method and the item."""


#: Command-line options as error messages name them, and what a deployment run calls the same setting
#: (its parameters), in the order they are tried: a run started from the Prefect UI or `prefect deployment
#: run` has no command line to pass an option to.
_DEPLOYMENT_TERMS: tuple[tuple[str, str], ...] = (
    (r"\bpass --data ([A-Z]+)\b", r"set the deployment parameter data to \1"),
    (r"\bpass --data\b", "set the deployment parameter data"),
    (r"--data:", "deployment parameter data:"),
    (r"--data\b", "the deployment parameter data"),
    (r"--run-name\b", "the deployment parameter run_name"),
    (r"(?:-c|--config) FILE\b", "the deployment parameter config_file"),
    (r"--no-cache\b", "the override run.refresh_cache=true"),
    (r"--(target|optimizer|judge)-(backend|model)\b", r"the deployment parameter \1_\2"),
    (r"--(backend|model)\b", r"the deployment parameter \1"),
    (r"--effort\b", "the deployment parameter cli_roles.effort"),
    (r"(?<![\w-])-o (?=[a-z_]+\.)", "the overrides entry "),
)


def in_deployment_terms(message: str, named: Mapping[str, str] | None = None) -> str:
    """``message`` with each command-line option it names replaced by the deployment parameter to set,
    e.g. "pass --data DIR" → "set the deployment parameter data to DIR". ``named`` maps the deployment's
    named parameters to the config keys they set (``epochs`` → ``train.epochs``): an override of one of
    those keys is named as that parameter first."""
    for name, key in (named or {}).items():
        message = re.sub(rf"(?<![\w-])-o {re.escape(key)}\b",
                         f"the deployment parameter {name} (or the overrides entry {key})", message)
    for pattern, words in _DEPLOYMENT_TERMS:
        message = re.sub(pattern, words, message)
    return message
