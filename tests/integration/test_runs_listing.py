"""``skillopt runs`` says why a run failed: the first line of its final state's message, under the run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from skillopt.shell.prefect_runs import REASON_CHARS, Upcoming, format_runs, recent_runs


def test_a_failed_run_is_listed_with_why_and_a_completed_one_without(prefect_settings):
    from prefect.client.orchestration import get_client

    why = ("Flow run encountered an exception: TooManyErrors: 5 model calls in a row failed after their "
           "retries (model.failfast_n 5); stopping. Last: item q-7: error: AuthError: [target] openai/gpt-x: "
           "the provider rejected the credential (HTTP 401) - check OPENAI_API_KEY")
    with httpx.Client(base_url=prefect_settings, timeout=30) as api:
        flow_id = api.post("/flows/", json={"name": "skill-train"}).json()["id"]
        created = []
        states = {"failed-run": {"type": "FAILED", "name": "Failed", "message": why + "\nTraceback"},
                  "done-run": {"type": "COMPLETED", "name": "Completed", "message": "All states"}}
        for name, state in states.items():
            response = api.post("/flow_runs/", json={"flow_id": flow_id, "name": name, "state": state})
            response.raise_for_status()
            created.append(response.json()["id"])
        try:
            with get_client(sync_client=True) as client:
                rows = {row.name: row for row in recent_runs(client, limit=50)}
        finally:
            for flow_run_id in created:
                api.delete(f"/flow_runs/{flow_run_id}").raise_for_status()

    assert rows["failed-run"].reason == why
    assert rows["done-run"].reason is None
    lines = format_runs([rows["failed-run"], rows["done-run"]])
    assert lines[0].startswith("Failed ") and lines[2].startswith("Completed ")
    assert lines[1].strip() == "why: " + why[:REASON_CHARS - 1].rstrip() + "…"


def test_runs_scheduled_for_later_are_summed_up_in_one_line_not_listed(prefect_settings):
    """A served deployment's schedule keeps its next runs waiting: listed one per line, newest first, they
    came before every run that happened. They are one line at the end; a run due or Late stays listed."""
    from prefect.client.orchestration import get_client

    now = datetime.now(UTC).replace(microsecond=0)

    def scheduled(at: datetime) -> dict:
        return {"type": "SCHEDULED", "name": "Scheduled", "state_details": {"scheduled_time": at.isoformat()}}

    with httpx.Client(base_url=prefect_settings, timeout=30) as api:
        flow_id = api.post("/flows/", json={"name": "skill-train"}).json()["id"]
        states = {"ran-run": {"type": "COMPLETED", "name": "Completed"},
                  "due-run": scheduled(now - timedelta(minutes=5)),
                  "next-run-1": scheduled(now + timedelta(hours=9)),
                  "next-run-2": scheduled(now + timedelta(hours=33))}
        created = []
        for name, state in states.items():
            response = api.post("/flow_runs/", json={"flow_id": flow_id, "name": name, "state": state})
            response.raise_for_status()
            created.append(response.json()["id"])
        try:
            upcoming: list[Upcoming] = []
            with get_client(sync_client=True) as client:
                rows = recent_runs(client, limit=50, upcoming=upcoming)
        finally:
            for flow_run_id in created:
                api.delete(f"/flow_runs/{flow_run_id}").raise_for_status()

    names = [row.name for row in rows]
    assert "ran-run" in names and "due-run" in names
    assert "next-run-1" not in names and "next-run-2" not in names
    assert upcoming == [Upcoming(deployment="skill-train", next_start=now + timedelta(hours=9), count=2)]
    lines = format_runs([row for row in rows if row.name in ("ran-run", "due-run")], upcoming)
    # newest first: the run that ran was created now, the due one was expected five minutes ago (the server's
    # late-runs service may already have marked it Late, a Scheduled state too)
    assert len(lines) == 3 and lines[0].startswith("Completed ")
    assert lines[1].startswith(("Scheduled ", "Late ")), lines[1]
    assert lines[2] == (f"next: skill-train at {now + timedelta(hours=9):%Y-%m-%d %H:%M} UTC "
                        "(2 runs scheduled)")
