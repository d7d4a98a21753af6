"""Error rows: items whose model call failed after every retry.

An error row (``ItemResult.phase == "error"``, made by ``benchmarks.runner.error_row``) says nothing
about the skill: the target or the judge never answered. So it is

- counted apart from failures (step record, history, progress, summary);
- never shown to analysts, the deep probe or the epoch-boundary comparison as a failure
  (``answered_rows``, ``reflect.split_and_batch``, ``slow_update.pair_by_id``);
- left out of the gate on both sides, paired by item (``paired_answered``): an item that errored
  under either skill (or under the best skill the candidate is measured against) is compared by
  neither; the flow retries an evaluation with errors once more before the gate decides, and a gate
  where more than ``evaluation.max_error_share`` of the items are errors is skipped with a reason
  (``too_many_errors``);
- watched by ``ErrorStreak``: ``model.failfast_n`` error rows in a row stop the run with the last
  error and the fix.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from skillopt.core.errors import SkillOptError
from skillopt.core.records import ItemResult


def answered_rows(rows: Sequence[ItemResult]) -> list[ItemResult]:
    """``rows`` without error rows, in order."""
    return [row for row in rows if not row.is_error]


def error_ids(*sides: Sequence[ItemResult]) -> list[str]:
    """The ids that are error rows on any side, sorted."""
    return sorted({row.id for rows in sides for row in rows if row.is_error})


def paired_answered(*sides: Sequence[ItemResult]) -> tuple[list[list[ItemResult]], list[str]]:
    """Each side's rows without the items that errored on *any* side, and those ids (sorted).

    The sides are the same items under different skills, so what remains is compared pair by pair.
    """
    dropped = set(error_ids(*sides))
    return [[row for row in rows if row.id not in dropped] for rows in sides], sorted(dropped)


def too_many_errors(errors: int, total: int, max_share: float) -> str | None:
    """Why a gate over ``total`` items with ``errors`` error items must not decide, or None when it may."""
    if total == 0:
        return None
    if errors == total:
        return f"all {total} selection items are error rows; no item to compare the skills on"
    if errors / total > max_share:
        return (f"{errors} of {total} selection items are error rows ({errors / total:.0%}), more than "
                f"evaluation.max_error_share {max_share:.0%}; the step is skipped rather than decided on "
                "the rest")
    return None


class TooManyErrors(SkillOptError):
    """``model.failfast_n`` model calls in a row failed after their retries: the run stops."""


class ErrorStreak:
    """Counts error rows in a row across a run's rollouts (in item order within each evaluation).

    ``observe`` raises ``TooManyErrors`` when the streak reaches ``limit``, quoting the last error;
    any answered row resets it. Thread-safe: evaluations may run in parallel.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, int]:  # the run travels to workers; its lock does not
        return {"limit": self.limit, "count": self._count}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.limit, self._count, self._lock = state["limit"], state["count"], threading.Lock()

    def observe(self, rows: Sequence[ItemResult]) -> None:
        with self._lock:
            for row in rows:
                self._count = self._count + 1 if row.is_error else 0
                if self._count >= self.limit:
                    raise TooManyErrors(
                        f"{self._count} model calls in a row failed after their retries (model.failfast_n "
                        f"{self.limit}); stopping. Last: item {row.id}: {row.fail_reason}. Fix the cause the "
                        "message names (endpoint, credential, model, quota), then re-run the same command: "
                        "finished calls are reused."
                    )
