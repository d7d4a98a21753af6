"""Usage and cost accounting: the per-call ledger and the budget guard.

``UsageLedger`` appends one JSON line per model call to ``<run_dir>/usage.jsonl`` and keeps the
run's spend in memory. On resume it reads the file back only to restore the spend totals, so
budgets span restarts; it never tells anyone what to skip. ``before_call`` is the in-flight hard
stop (``budget.hard_factor`` × a cap); ``check_budget`` is the clean stop the flow's guard task
runs before each step, against the spend so far plus a projection of the next step.

What counts as spend (``Totals``): every recorded call, failed ones included.
Prefect cache hits are recorded (``cache_hit: true``, cost 0) and counted as ``cache_hits``,
but add nothing to calls, tokens or USD. ``tokens`` is prompt + completion tokens: cached
prompt tokens are inside the prompt count and reasoning tokens inside the completion count
(see ``skillopt.llm.pricing``). Calls without a price add to ``unpriced_calls``, not to ``usd``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, computed_field

from skillopt.core import live
from skillopt.core.config import ROLES, BudgetSection
from skillopt.core.errors import ConfigError, storage_error
from skillopt.llm.chat import STAGES, Stage, Usage
from skillopt.llm.errors import BudgetExceeded
from skillopt.llm.pricing import PriceTable
from skillopt.llm.roles import short_model_name

_log = logging.getLogger(__name__)

#: The token kinds a ``Usage`` reports, in display order.
TOKEN_KINDS = (
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_prompt_tokens",
    "cache_write_tokens",
)


class UsageRecord(BaseModel):
    """One line of ``usage.jsonl``: one model call (or one Prefect cache hit standing in for it)."""

    ts: str = Field(description="ISO 8601 UTC time the call was recorded")
    role: str
    backend: str
    model_requested: str | None
    model_served: str | None = None
    price_model: str | None = None
    stage: Stage
    tags: dict[str, Any] = Field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    cache_write_tokens: int | None = None
    latency_s: float = 0.0
    attempts: int = 1
    status: Literal["ok", "error"] = "ok"
    error_class: str | None = None
    cost_usd: float | None = Field(default=None, description="None = unpriced")
    cache_hit: bool = False


class RoleSpend(BaseModel):
    """What one role spent: the basis of the role shares in budget messages."""

    calls: int = 0
    tokens: int = 0
    usd: float = 0.0


class Totals(BaseModel):
    """Spend of a set of calls (a run, a step, or a projection of the next step)."""

    calls: int = 0
    errors: int = 0
    cache_hits: int = 0
    unpriced_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_write_tokens: int = 0
    usd: float = 0.0
    by_role: dict[str, RoleSpend] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens(self) -> int:
        """Tokens counted against ``budget.max_tokens``: prompt + completion."""
        return self.prompt_tokens + self.completion_tokens

    def add(self, record: UsageRecord) -> None:
        """Count ``record`` in place (a cache hit only bumps ``cache_hits``)."""
        if record.cache_hit:
            self.cache_hits += 1
            return
        self.calls += 1
        self.errors += int(record.status == "error")
        for kind in TOKEN_KINDS:
            setattr(self, kind, getattr(self, kind) + (getattr(record, kind) or 0))
        role = self.by_role.setdefault(record.role, RoleSpend())
        role.calls += 1
        role.tokens += (record.prompt_tokens or 0) + (record.completion_tokens or 0)
        if record.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.usd += record.cost_usd
            role.usd += record.cost_usd

    @classmethod
    def of(cls, records: Iterable[UsageRecord]) -> Totals:
        totals = cls()
        for record in records:
            totals.add(record)
        return totals

    @classmethod
    def mean(cls, items: list[Totals]) -> Totals:
        """Field-wise mean; counts round up, so a projection never undershoots by rounding."""
        if not items:
            return cls()

        def mean_of(values: Sequence[float]) -> float:
            return sum(values) / len(items)

        def count(values: list[int]) -> int:
            return math.ceil(mean_of(values) - 1e-9)

        fields: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if name != "by_role":
                values = [getattr(item, name) for item in items]
                fields[name] = count(values) if info.annotation is int else mean_of(values)
        by_role = {}
        for role in sorted({role for item in items for role in item.by_role}, key=role_order):
            spends = [item.by_role.get(role, RoleSpend()) for item in items]
            by_role[role] = RoleSpend(
                calls=count([s.calls for s in spends]),
                tokens=count([s.tokens for s in spends]),
                usd=mean_of([s.usd for s in spends]),
            )
        return cls(**fields, by_role=by_role)

    def times(self, factor: float) -> Totals:
        """Every count and sum times ``factor`` (counts round up, as in ``mean``): e.g. the spend of
        ``factor`` items from the spend of one."""
        fields: dict[str, Any] = {}
        for name, info in type(self).model_fields.items():
            if name != "by_role":
                value = getattr(self, name) * factor
                fields[name] = math.ceil(value - 1e-9) if info.annotation is int else value
        by_role = {role: RoleSpend(calls=math.ceil(spend.calls * factor - 1e-9),
                                   tokens=math.ceil(spend.tokens * factor - 1e-9), usd=spend.usd * factor)
                   for role, spend in self.by_role.items()}
        return Totals(**fields, by_role=by_role)


def cost_text(usage: Mapping[str, Any]) -> str:
    """The cost of a usage total or stage row (``usd``, ``calls``, ``unpriced_calls``) as people read it:
    ``$0.0123``; ``unknown (3 unpriced calls)`` when none of its calls has a price; ``$0.0123 + unknown (1
    unpriced call)`` when only some have. Calls without a price are never shown as costing $0."""
    calls, unpriced = int(usage.get("calls") or 0), int(usage.get("unpriced_calls") or 0)
    usd = float(usage.get("usd") or 0.0)
    if not unpriced:
        return f"${usd:.4f}"
    noun = f"{unpriced} unpriced call{'s' if unpriced != 1 else ''}"
    return f"unknown ({noun})" if calls and unpriced >= calls else f"${usd:.4f} + unknown ({noun})"


def role_order(role: str) -> tuple[int, str]:
    """A sort key: target, optimizer, judge, then any other role by name."""
    return (ROLES.index(role) if role in ROLES else len(ROLES), role)


class UsageLedger:
    """Thread- and process-safe record of every model call of a run, appended to a JSONL file.

    ``path`` None keeps the ledger in memory only (tests, dry runs). With a file, the file is the truth:
    each record is appended as one line in a single ``O_APPEND`` write, and the ledger learns records by
    reading what the file gained since it last looked — its own lines and those of the run's other
    processes (the rollouts of a Dask worker) alike. So an existing file restores the spend totals of
    earlier attempts, and the flow's totals and budget checks count every process's calls. A corrupt line
    (a crash mid-write) is skipped with a warning. Records are only ever appended, never rewritten.
    """

    def __init__(self, path: Path | None, prices: PriceTable, budget: BudgetSection | None = None) -> None:
        self.path = path
        self.prices = prices
        self.budget = budget
        self._lock = threading.Lock()
        self._records: list[UsageRecord] = []
        self._totals = Totals()
        self._warned_unpriced: set[tuple[str, str | None]] = set()
        #: How far into the file this ledger has read, and the number of lines read so far.
        self._offset = 0
        self._lines = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                if _ends_mid_line(path):
                    # Terminate a half-written last line so the next record starts on a line of its own.
                    with path.open("ab") as handle:
                        handle.write(b"\n")
                self._catch_up()

    def _catch_up(self) -> None:
        """Read the complete lines the file gained since the last look (call with the lock held or alone)."""
        if self.path is None:
            return
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written by another process waits
        self._offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            self._lines += 1
            if not line.strip():
                continue
            try:
                record = UsageRecord.model_validate_json(line)
            except ValidationError:
                _log.warning("%s: line %d is not a usage record (a crash mid-write?); skipped", self.path,
                             self._lines)
                continue
            self._records.append(record)
            self._totals.add(record)

    def record(
        self,
        *,
        role: str,
        backend: str,
        model_requested: str | None,
        model_served: str | None,
        stage: str,
        usage: Usage | None,
        latency_s: float,
        attempts: int,
        status: Literal["ok", "error"],
        error_class: str | None = None,
        tags: Mapping[str, Any] | None = None,
        cache_hit: bool = False,
        price_model: str | None = None,
        cost_usd: float | None = None,
    ) -> UsageRecord:
        """Price one call, append it to the ledger file and count it in the totals.

        ``price_model`` defaults to ``model_requested``. ``cost_usd`` is the cost the backend
        reported itself (an exec CLI's ``total_cost_usd``); given, it wins over the price table.
        A cache hit costs 0 and is not billed.
        An unpriced (backend, price model) gets cost None and one warning per ledger.
        """
        usage = usage or Usage()
        price_model = price_model or model_requested
        if cache_hit:
            cost: float | None = 0.0
        elif cost_usd is not None:
            cost = cost_usd
        else:
            cost = self.prices.cost(backend, price_model, usage)
        record = UsageRecord(
            ts=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            role=role,
            backend=backend,
            model_requested=model_requested,
            model_served=model_served,
            price_model=price_model,
            stage=stage,  # type: ignore[arg-type]
            tags=dict(tags or {}),
            **{kind: getattr(usage, kind) for kind in TOKEN_KINDS},
            latency_s=latency_s,
            attempts=attempts,
            status=status,
            error_class=error_class,
            cost_usd=cost,
            cache_hit=cache_hit,
        )
        line = record.model_dump_json(fallback=str) + "\n"
        warn = False
        with self._lock:
            if self.path is None:
                self._records.append(record)
                self._totals.add(record)
            else:
                try:
                    descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    try:
                        # One write: the lines of several processes never interleave.
                        os.write(descriptor, line.encode("utf-8"))
                    finally:
                        os.close(descriptor)
                except OSError as error:  # a full disk or read-only run folder: one line naming the file
                    raise storage_error(self.path, error) from None
                self._catch_up()
            if cost is None and (backend, price_model) not in self._warned_unpriced:
                self._warned_unpriced.add((backend, price_model))
                warn = True
        live.emit("call", record=record)
        if warn:
            _log.warning(
                "no price known for %s/%s; its calls are recorded with cost null. Add an entry to a "
                "pricing file (model.pricing_file) or set model.<role>.price_model to a priced model.",
                backend,
                short_model_name(price_model),
            )
        return record

    def before_call(
        self,
        *,
        role: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        stage: str | None = None,
    ) -> None:
        """Raise ``BudgetExceeded`` once spend has reached ``budget.hard_factor`` × any cap.

        This is the in-flight hard stop: the flow's guard (``check_budget``) normally stops the
        run cleanly first; calls already started when the cap is reached still finish.
        """
        if self.budget is None:
            return
        with self._lock:
            self._catch_up()
            spent = self._totals.model_copy(deep=True)
        factor = self.budget.hard_factor
        for cap in _caps(self.budget):
            value = cap.spent(spent)
            if value >= factor * cap.limit:
                raise BudgetExceeded(
                    f"hard budget stop: spent {cap.show(value)}, past {factor:g} × budget.{cap.key} "
                    f"{cap.show(cap.limit)} = {cap.show(factor * cap.limit)}; no further calls are made",
                    role=role,
                    backend=backend,
                    model=model,
                    stage=stage,
                    hint=f"raise budget.{cap.key} and resume",
                )

    def mark(self) -> int:
        """A position in the ledger; pass it as ``since`` to count only the calls after it."""
        with self._lock:
            self._catch_up()
            return len(self._records)

    def records(self, since: int = 0) -> list[UsageRecord]:
        with self._lock:
            self._catch_up()
            return list(self._records[since:])

    def totals(self, since: int = 0) -> Totals:
        """Spend of the whole run (restored records included), or of the calls after ``since``."""
        with self._lock:
            self._catch_up()
            if since == 0:
                return self._totals.model_copy(deep=True)
            records = self._records[since:]
        return Totals.of(records)

    def summary(self, since: int = 0) -> dict[str, Any]:
        """Per stage (``STAGES`` order), role and model: calls, errors, tokens, p50/p95 latency, USD.

        Returns ``{"by_stage": [row...], "by_role": [row...], "by_model": [row...], "total": row}``
        of plain JSON values, ready for ``summary.json`` and a table artifact.
        """
        records = self.records(since)
        by_stage: dict[str, list[UsageRecord]] = {}
        by_role: dict[str, list[UsageRecord]] = {}
        by_model: dict[tuple[str, str], list[UsageRecord]] = {}
        for record in records:
            by_stage.setdefault(record.stage, []).append(record)
            by_role.setdefault(record.role, []).append(record)
            by_model.setdefault((record.backend, record.model_requested or ""), []).append(record)
        return {
            "by_stage": [{"stage": s, **_row(by_stage[s])} for s in STAGES if s in by_stage],
            "by_role": [{"role": r, **_row(by_role[r])} for r in sorted(by_role, key=role_order)],
            "by_model": [{"backend": b, "model": m, **_row(by_model[(b, m)])} for b, m in sorted(by_model)],
            "total": _row(records),
        }


def _ends_mid_line(path: Path) -> bool:
    """Whether ``path`` is non-empty and its last byte is not a newline (read without reading the file)."""
    with path.open("rb") as handle:
        if handle.seek(0, os.SEEK_END) == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def _row(records: list[UsageRecord]) -> dict[str, Any]:
    totals = Totals.of(records)
    latencies = sorted(r.latency_s for r in records if not r.cache_hit)
    return {
        "calls": totals.calls,
        "errors": totals.errors,
        "cache_hits": totals.cache_hits,
        **{kind: getattr(totals, kind) for kind in TOKEN_KINDS},
        "tokens": totals.tokens,
        "p50_latency_s": percentile(latencies, 50),
        "p95_latency_s": percentile(latencies, 95),
        "usd": round(totals.usd, 6),
        "unpriced_calls": totals.unpriced_calls,
    }


def percentile(sorted_values: list[float], p: float) -> float | None:
    """The ``p``-th percentile by linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * p / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# --------------------------------------------------------------------------------------------
# Budget guard


class BudgetVerdict(BaseModel):
    """Whether to stop before the next step. ``cap`` names the budget key that stopped it."""

    stop: bool
    reason: str = ""
    message: str = ""
    cap: str | None = None


class _Cap:
    """One budget cap: its config key, its limit, how to read spend and how to print it."""

    def __init__(self, key: str, limit: float, unit: str) -> None:
        self.key = key
        self.limit = limit
        self.unit = unit

    def spent(self, totals: Totals) -> float:
        return {"usd": totals.usd, "tokens": totals.tokens, "calls": totals.calls}[self.unit]

    def role_share(self, spend: RoleSpend) -> float:
        return {"usd": spend.usd, "tokens": spend.tokens, "calls": spend.calls}[self.unit]

    def show(self, value: float) -> str:
        if self.unit == "usd":
            return f"${value:,.2f}"
        return f"{math.ceil(value):,} {self.unit}"

    def show_pair(self, value: float) -> str:
        """``$24.10 of $25.00`` or ``950 of 1,000 calls``."""
        if self.unit == "usd":
            return f"{self.show(value)} of {self.show(self.limit)}"
        return f"{math.ceil(value):,} of {self.show(self.limit)}"


def _caps(budget: BudgetSection) -> list[_Cap]:
    caps = []
    if budget.max_usd is not None:
        caps.append(_Cap("max_usd", budget.max_usd, "usd"))
    if budget.max_tokens is not None:
        caps.append(_Cap("max_tokens", budget.max_tokens, "tokens"))
    if budget.max_calls is not None:
        caps.append(_Cap("max_calls", budget.max_calls, "calls"))
    return caps


def _role_shares(cap: _Cap, spent: Totals) -> str:
    """``optimizer 71%, target 27%, judge 2%``: each role's share of the spend, largest first."""
    shares = {role: cap.role_share(spend) for role, spend in spent.by_role.items()}
    total = sum(shares.values())
    if total <= 0:
        return ""
    parts = []
    for role in sorted((r for r in shares if shares[r] > 0), key=lambda r: (-shares[r], role_order(r))):
        percent = 100 * shares[role] / total
        parts.append(f"{role} {'<1' if percent < 0.5 else round(percent)}%")
    return ", ".join(parts)


def check_budget(
    budget: BudgetSection, spent: Totals, projection: Totals | None, where: str
) -> BudgetVerdict:
    """Decide, before a step or epoch-level stage, whether the run must stop for its budget.

    Stops when spend has reached a cap (USD, then tokens, then calls) or when spend plus
    ``projection`` (the expected spend of the next step) would pass it. ``where`` names what is
    about to run, e.g. ``"epoch 3 step 2"``. Pure: reads nothing but its arguments.
    """
    for cap in _caps(budget):
        value = cap.spent(spent)
        projected = cap.spent(projection) if projection is not None else 0.0
        if value >= cap.limit:
            reason = f"spent {cap.show(value)}, reaching budget.{cap.key} {cap.show(cap.limit)}"
        elif value + projected > cap.limit:
            reason = (
                f"spent {cap.show(value)} + next step ~{cap.show(projected)} would pass "
                f"budget.{cap.key} {cap.show(cap.limit)}"
            )
        else:
            continue
        shares = _role_shares(cap, spent)
        spent_text = f"{cap.show_pair(value)}{f' ({shares})' if shares else ''}"
        head = (f"budget reached: {spent_text}" if value >= cap.limit else
                f"budget: {spent_text} spent, and {where} is expected to take ~{cap.show(projected)}")
        message = f"{head}; stopped before {where}; raise budget.{cap.key} and resume"
        return BudgetVerdict(stop=True, reason=reason, message=message, cap=cap.key)
    return BudgetVerdict(stop=False)


def projection_from_history(step_totals: list[Totals], estimate: Totals | None) -> Totals | None:
    """The expected spend of the next step: the mean of the last three finished steps (fewer if
    fewer have finished), else ``estimate`` (the dry-run estimate), which may be None."""
    if step_totals:
        return Totals.mean(step_totals[-3:])
    return estimate


def check_startable(
    budget: BudgetSection, prices: PriceTable, roles_price_models: Mapping[str, tuple[str, str | None]]
) -> None:
    """Refuse to start a run with ``budget.max_usd`` set when a role's model has no price.

    ``roles_price_models`` maps each role that will be used to its ``(backend, price_model)``.
    Raises ``ConfigError`` naming the unpriced roles and models, unless ``budget.allow_unpriced``.
    """
    if budget.max_usd is None or budget.allow_unpriced:
        return
    unpriced = [
        f"{role} ({backend}/{price_model or '<no model>'})"
        for role, (backend, price_model) in sorted(
            roles_price_models.items(), key=lambda item: role_order(item[0])
        )
        if not prices.is_priced(backend, price_model)
    ]
    if unpriced:
        raise ConfigError(
            f"budget.max_usd is set but no price is known for {', '.join(unpriced)}, so the budget "
            "cannot be enforced. Add entries to a pricing file (model.pricing_file), set "
            "model.<role>.price_model to a priced model, or set budget.allow_unpriced: true to run "
            "with their cost counted as unknown."
        )
