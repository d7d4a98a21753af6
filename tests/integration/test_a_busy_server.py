"""What skillopt reads back from a server that holds more than one page of an answer (the server lists
200 rows unless asked for more): the run that resumes a directory settles its previous flow run's epoch
sub-flow that was created but never started (so never recorded in ``flow_run.json``), however many other
unfinished sub-flows the server holds; and ``skillopt runs`` finds a run's best score among many more of
its artifacts than a page."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import httpx

from skillopt.shell.prefect_runs import PAGE
from skillopt.tasks.stale_runs import _crash_unfinished


def _post(api: httpx.Client, path: str, body: dict[str, Any]) -> str:
    response = api.post(path, json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def _flow_run_with_a_task(api: httpx.Client, flow_id: str, name: str) -> tuple[str, str]:
    """A running flow run and one task run in it (the task run an epoch sub-flow hangs from)."""
    flow_run = _post(api, "/flow_runs/", {"flow_id": flow_id, "name": name, "state": {"type": "RUNNING"}})
    task_run = _post(api, "/task_runs/", {"flow_run_id": flow_run, "task_key": "epoch", "dynamic_key": name,
                                          "name": f"epoch-{name}"})
    return flow_run, task_run


def _delete_flow_runs(api: httpx.Client, flow_run_ids: list[str]) -> None:
    """Leave the session's server as it was for later tests (no unfinished run of this test's making)."""
    for flow_run_id in flow_run_ids:
        api.delete(f"/flow_runs/{flow_run_id}").raise_for_status()


def test_a_sub_flow_never_started_is_crashed_with_its_parent_among_many_others(prefect_settings):
    with httpx.Client(base_url=prefect_settings, timeout=30) as api:
        flow_id = _post(api, "/flows/", {"name": "stale-runs-test"})
        parent, epoch_task = _flow_run_with_a_task(api, flow_id, "left-running")

        def never_started() -> str:
            return _post(api, "/flow_runs/", {"flow_id": flow_id, "name": "epoch-never-started",
                                              "parent_task_run_id": epoch_task, "state": {"type": "PENDING"}})

        # The server lists flow runs by descending id and ids are random: until one of the run's epochs has
        # a low id, so that a page of newer-looking ones of another run can hide it.
        ours = [never_started()]
        while UUID(min(ours)).int >= 1 << 126:
            ours.append(never_started())
        # Another run's epochs, still going: more than a page of them listed before the lowest of ours.
        other, other_task = _flow_run_with_a_task(api, flow_id, "still-going")
        others: list[str] = []
        while sum(UUID(run_id) > UUID(min(ours)) for run_id in others) <= PAGE:
            others.append(_post(api, "/flow_runs/", {
                "flow_id": flow_id, "name": f"other-epoch-{len(others)}", "parent_task_run_id": other_task,
                "state": {"type": "RUNNING"}}))

        settled = _crash_unfinished(UUID(parent), [])

        def state(flow_run_id: str) -> str:
            response = api.get(f"/flow_runs/{flow_run_id}")
            response.raise_for_status()
            return str(response.json()["state"]["type"])

        try:
            assert {state(run_id) for run_id in [parent, *ours]} == {"CRASHED"}
            assert settled == 1 + len(ours)
            # Nothing of the other run is touched.
            assert state(other) == "RUNNING"
            assert {state(run_id) for run_id in others[:5] + others[-5:]} == {"RUNNING"}
        finally:
            _delete_flow_runs(api, [parent, *ours, other, *others])


def test_skillopt_runs_finds_a_run_s_best_score_among_more_than_a_page_of_its_artifacts(prefect_settings):
    """`skillopt runs` reads each run's best score from its progress artifact; a long run keeps many more
    artifacts (a new version of its edits, gates and skill diff every step) than one page of the server's
    answer, and they must not hide it."""
    from prefect.client.orchestration import get_client

    from skillopt.shell.prefect_runs import recent_runs

    with httpx.Client(base_url=prefect_settings, timeout=30) as api:
        flow_id = _post(api, "/flows/", {"name": "skill-train"})
        run = _post(api, "/flow_runs/", {"flow_id": flow_id, "name": "long-run",
                                         "state": {"type": "RUNNING"}})
        # The server lists artifacts by descending id and ids are random: a progress artifact with a low id,
        # then more than a page of the run's other artifacts listed before it.
        while True:
            progress = _post(api, "/artifacts/", {
                "key": "long-run-progress", "type": "progress", "data": 40.0, "flow_run_id": run,
                "description": "| step | 4 |\n| best | 0.875 |"})
            if UUID(progress).int < 1 << 126:
                break
            api.delete(f"/artifacts/{progress}").raise_for_status()
        newer = 0
        while newer <= PAGE:
            step = _post(api, "/artifacts/", {"key": "long-run-edits", "type": "markdown", "data": "edits",
                                              "flow_run_id": run})
            newer += UUID(step) > UUID(progress)
        try:
            with get_client(sync_client=True) as client:
                rows = recent_runs(client, limit=20)
        finally:
            _delete_flow_runs(api, [run])
    assert [row.best for row in rows if row.name == "long-run"] == [0.875]
