"""Exceptions raised by the skillopt library.

Every error a user can cause (bad config, bad data, a malformed skill) derives from
``SkillOptError`` so the CLI can print its message without a traceback. Messages say what
was wrong, where, and what was expected; they never echo a configuration value, which
might be a secret.
"""

from __future__ import annotations


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
