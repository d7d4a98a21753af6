"""Model prices and the cost of one call.

The shipped ``pricing.yaml`` (next to this module) lists USD prices per million tokens by a glob
over the role's ``price_model``. A user table (``model.pricing_file``) is merged over it: its
entries are tried first, and the first matching entry wins.

Token rules, so nothing is billed twice (the backends fill ``Usage`` to match):

- ``prompt_tokens`` is the whole prompt, *including* the tokens read from the provider's cache
  (``cached_prompt_tokens``) and the tokens written to it (``cache_write_tokens``), as OpenAI
  reports it. A backend whose API counts them apart (Anthropic's ``input_tokens`` excludes
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``) adds them up. Billed:
  cached at ``cached_input_per_mtok``, writes at ``cache_write_per_mtok``, the rest
  (``prompt - cached - writes``, never below 0) at ``input_per_mtok``.
- ``completion_tokens`` is the whole output, *including* reasoning tokens (OpenAI's
  ``output_tokens``/``completion_tokens`` contain ``reasoning_tokens``; Anthropic's thinking is
  inside ``output_tokens``). Billed output is therefore ``completion_tokens`` alone at
  ``output_per_mtok``; ``reasoning_tokens`` is informational and never added on top. Only when
  a backend reports reasoning but no completion count are the reasoning tokens billed as output.
- A count the provider did not report (``None``) bills as 0.

``local`` and ``scripted`` calls always cost 0.0.
"""

from __future__ import annotations

from datetime import date
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skillopt.core.config import parse_yaml_text
from skillopt.core.errors import ConfigError
from skillopt.llm.chat import Usage

#: The price table shipped with skillopt (package data).
SHIPPED_PRICING_FILE = Path(__file__).resolve().with_name("pricing.yaml")

#: Backends whose calls cost nothing: they run on this machine.
FREE_BACKENDS = frozenset({"local", "scripted"})

#: Backends that report the cost of each call themselves (Claude Code's ``total_cost_usd``), so a
#: missing price-table entry does not leave them unpriced.
SELF_PRICED_BACKENDS = frozenset({"claude_code_exec"})

_PER_MTOK = 1_000_000


def _price(**kwargs: Any) -> Any:
    return Field(ge=0, allow_inf_nan=False, **kwargs)


class PriceEntry(BaseModel):
    """One row of a price table: USD per million tokens for the price models ``match`` covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str = Field(min_length=1, description="glob over price_model, case-insensitive")
    backend: str | None = Field(default=None, description="glob or exact backend name; None = any backend")
    input_per_mtok: float = _price()
    output_per_mtok: float = _price()
    cached_input_per_mtok: float | None = _price(default=None)
    cache_write_per_mtok: float | None = _price(default=None)

    def matches(self, backend: str, price_model: str) -> bool:
        if not fnmatchcase(price_model.lower(), self.match.lower()):
            return False
        return self.backend is None or fnmatchcase(backend.lower(), self.backend.lower())

    def cost(self, usage: Usage) -> float:
        """USD of one call with ``usage`` at this entry's prices (rules in the module docstring)."""
        prompt = usage.prompt_tokens or 0
        cached = usage.cached_prompt_tokens or 0
        written = usage.cache_write_tokens or 0
        fresh = max(prompt - cached - written, 0)
        output = (
            usage.completion_tokens if usage.completion_tokens is not None else (usage.reasoning_tokens or 0)
        )
        cached_rate = (
            self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        )
        write_rate = self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        return (
            fresh * self.input_per_mtok
            + cached * cached_rate
            + written * write_rate
            + output * self.output_per_mtok
        ) / _PER_MTOK


class _PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    as_of: date | None = None
    entries: list[Any] = Field(default_factory=list)


class PriceTable(BaseModel):
    """Price entries in lookup order (first match wins) and the date the shipped prices are from."""

    model_config = ConfigDict(frozen=True)

    as_of: date
    entries: tuple[PriceEntry, ...] = ()
    user_as_of: date | None = None
    user_file: str | None = None

    @classmethod
    def load(cls, user_file: Path | str | None = None) -> PriceTable:
        """The shipped table, with the entries of ``user_file`` (if given) tried first.

        Raises ``ConfigError`` naming the file (and the entry index) for unreadable files, bad YAML,
        unknown keys and invalid prices.
        """
        shipped_as_of, shipped = _read_price_file(SHIPPED_PRICING_FILE)
        if shipped_as_of is None:
            raise ConfigError(
                f"{SHIPPED_PRICING_FILE}: as_of: missing; the shipped table must carry its date"
            )
        if user_file is None:
            return cls(as_of=shipped_as_of, entries=shipped)
        user_as_of, user = _read_price_file(Path(user_file))
        return cls(
            as_of=shipped_as_of, entries=user + shipped, user_as_of=user_as_of, user_file=str(user_file)
        )

    def lookup(self, backend: str, price_model: str | None) -> PriceEntry | None:
        """The first entry matching ``backend`` and ``price_model``, or None (unpriced)."""
        if not price_model:
            return None
        return next((e for e in self.entries if e.matches(backend, price_model)), None)

    def is_priced(self, backend: str, price_model: str | None) -> bool:
        """Whether calls of this backend and price model get a cost (free, self-reported or in the table)."""
        return (
            backend in FREE_BACKENDS
            or backend in SELF_PRICED_BACKENDS
            or self.lookup(backend, price_model) is not None
        )

    def cost(self, backend: str, price_model: str | None, usage: Usage) -> float | None:
        """USD of one call; 0.0 for ``local``/``scripted``; None when the model is unpriced."""
        if backend in FREE_BACKENDS:
            return 0.0
        entry = self.lookup(backend, price_model)
        return None if entry is None else entry.cost(usage)


def _read_price_file(path: Path) -> tuple[date | None, tuple[PriceEntry, ...]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"pricing file not found: {path} (model.pricing_file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read pricing file ({type(exc).__name__})") from None
    document = parse_yaml_text(text, source=str(path))
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(
            f"{path}: expected a mapping with 'as_of' and 'entries', not {type(document).__name__}"
        )
    try:
        parsed = _PriceFile.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None
    entries = []
    for index, raw in enumerate(parsed.entries):
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: entries[{index}]: expected a mapping, not {type(raw).__name__}")
        try:
            entries.append(PriceEntry.model_validate(raw))
        except ValidationError as exc:
            raise ConfigError(f"{path}: entries[{index}]: {_describe(exc)}") from None
    return parsed.as_of, tuple(entries)


def _describe(exc: ValidationError) -> str:
    """The validation problems as ``key: message`` (never echoing values)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{where}: {message}")
    return "; ".join(problems)
