"""``skillopt runs`` says why a run failed: the first line of its final state's message, under the run."""

from __future__ import annotations

import httpx

from skillopt.shell.prefect_runs import REASON_CHARS, format_runs, recent_runs


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
