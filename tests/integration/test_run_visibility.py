"""Seeing a demo run: its Prefect artifacts read back from the API, its HTML report and the Prefect UI
in headless Chromium, and the dry-run estimate against the calls the run made.

One demo run (in a fresh folder, so its cache starts empty and every call is made) against the session's
Prefect server serves all tests.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.browser import chromium, screenshot

pytestmark = pytest.mark.slow

RUN = "demo-visible"


def key(kind: str) -> str:
    return f"{RUN}-{kind}"  # the run name starts with the benchmark, which the key does not repeat


@pytest.fixture(scope="module")
def demo_run(prefect_api, tmp_path_factory):
    from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_LEVEL, temporary_settings

    folder = tmp_path_factory.mktemp("visible")
    previous = os.getcwd()
    os.chdir(folder)
    try:
        with temporary_settings(updates={PREFECT_API_URL: prefect_api, PREFECT_LOGGING_LEVEL: "WARNING"}):
            from skillopt.flows.train import skill_train

            summary = skill_train(benchmark="demo", run_name=RUN)
    finally:
        os.chdir(previous)
    run_dir = folder / summary["run_dir"]
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return {"summary": summary, "run_dir": run_dir, "history": history, "cwd": folder}


def api(prefect_api: str, path: str, body: dict) -> list[dict]:
    request = urllib.request.Request(f"{prefect_api}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def versions(prefect_api: str, kind: str) -> list[dict]:
    """Every version of one artifact key, oldest first."""
    found = api(prefect_api, "/artifacts/filter", {"artifacts": {"key": {"any_": [key(kind)]}}})
    return sorted(found, key=lambda a: a["created"])


def table(artifact: dict) -> list[dict]:
    data = artifact["data"]
    return json.loads(data) if isinstance(data, str) else data


def steps(history: list[dict]) -> list[dict]:
    return [r for r in history if r["kind"] == "step"]


def test_artifacts_read_back_from_the_prefect_api(demo_run, prefect_api):
    history = steps(demo_run["history"])
    summary = demo_run["summary"]

    progress = versions(prefect_api, "progress")
    assert len(progress) == 1, "the progress artifact is updated in place, not re-created"
    assert progress[0]["type"] == "progress" and float(progress[0]["data"]) == 100.0
    assert f"Finished · Epoch 2/2 · step {len(history)}/{len(history)}" in progress[0]["description"]
    best = summary["scores"]["best"]["selection"]["hard"]  # the demo gates on hard scores
    assert f"| best | {best:.3f} |" in progress[0]["description"]

    accepted = [r for r in history if r["gate"] and r["decision"] != "reject"]
    diffs = versions(prefect_api, "skill-diff")
    assert len(diffs) == len(accepted) >= 1
    for artifact, record in zip(diffs, accepted, strict=True):
        assert artifact["type"] == "markdown"
        assert f"### Step {record['step']}: {record['decision']}" in artifact["data"]
        assert "```diff" in artifact["data"] and "\n+- " in artifact["data"]

    edits = table(versions(prefect_api, "edits")[-1])
    last_with_edits = [r for r in history if r["edits"]][-1]
    assert [row["op"] for row in edits] == [e["op"] for e in last_with_edits["edits"]]
    assert set(edits[0]) == {"rank", "file", "op", "target", "content", "support", "status", "decision"}
    assert [row["content"] for row in edits] == [" ".join(e["content"].split())[:400]
                                                 for e in last_with_edits["edits"]]

    (gates_card,) = versions(prefect_api, "gates")  # one gates card per run, not one per step
    gates = table(gates_card)
    assert [(row["step"], row["decision"]) for row in gates] == [
        (r["step"], r["decision"] if r["kind"] == "step" else f"{r['kind']}: {r['decision']}")
        for r in demo_run["history"]]  # the steps and the epoch boundaries
    rejected = [row for row in gates if row["decision"] == "reject"]
    assert rejected and all(row["candidate"] is not None and row["flips"] for row in rejected)

    (cost_card,) = versions(prefect_api, "cost")  # once, at the end: one card in the run's Artifacts tab
    cost = table(cost_card)
    assert cost[-1]["stage"] == "total" and cost[-1]["calls"] == summary["usage"]["total"]["calls"]
    assert {row["stage"] for row in cost} >= {"rollout", "analyst", "total"}

    (report_card,) = versions(prefect_api, "report")
    report = demo_run["run_dir"].resolve() / "report.html"
    assert report_card["type"] == "markdown" and report.is_file()
    assert report.as_uri() in report_card["data"]  # where the full HTML report is
    assert report_card["data"].count("](data:image/svg+xml;base64,") == 4

    # Every version of every key is attached to the run's top flow run (skill-train), none to its epochs.
    every = [a for kind in ("progress", "skill-diff", "edits", "gates", "cost", "report")
             for a in versions(prefect_api, kind)]
    (flow_run_id,) = {a["flow_run_id"] for a in every}
    request = urllib.request.Request(f"{prefect_api}/flow_runs/{flow_run_id}")
    with urllib.request.urlopen(request, timeout=30) as response:
        flow_run = json.load(response)
    assert flow_run["parent_task_run_id"] is None and flow_run["name"] == demo_run["run_dir"].name


def test_dry_run_estimate_is_within_20_percent_of_the_calls_made(demo_run, monkeypatch):
    from skillopt.core.config import load_config
    from skillopt.run.estimate import dry_run

    monkeypatch.chdir(demo_run["cwd"])
    estimate = dry_run(load_config("demo", overrides=[], env=os.environ), env=os.environ)
    made = demo_run["summary"]["usage"]
    assert estimate.calls == pytest.approx(made["total"]["calls"], rel=0.2)
    assert estimate.calls_low <= made["total"]["calls"] <= estimate.calls_high
    rollouts = next(s for s in estimate.stages if s.stage == "rollout")
    made_rollouts = next(row for row in made["by_stage"] if row["stage"] == "rollout")["calls"]
    assert rollouts.calls == pytest.approx(made_rollouts, rel=0.2)


def test_report_renders_plots_and_a_diff_in_chromium(demo_run):
    history = steps(demo_run["history"])
    run_dir = demo_run["run_dir"]
    expected = {
        "chart-scores": 2 * len(history) + sum(1 for r in history if r["gate"]),
        "chart-budget": 2 * len(history),
        # One point per step's snapshot; a slow update's snapshot (step_NNNN_slow_update.md) is not a step.
        "chart-skill-length": len(list((run_dir / "skills").glob("step_[0-9][0-9][0-9][0-9].md"))),
    }
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto((run_dir / "report.html").resolve().as_uri())
        for chart_id, points in expected.items():
            chart = page.locator(f"#{chart_id}")
            assert int(chart.get_attribute("data-points")) == points
            marks = chart.locator("circle.point")
            assert marks.count() == points
            box = marks.first.bounding_box()
            assert box is not None and box["width"] > 0  # drawn, not just present
        assert page.locator("#chart-cost circle.point").count() > 0
        assert page.locator("#chart-cost polyline").count() >= 1

        visible = page.locator(".diff-panel:not([hidden])")
        assert visible.count() == 1
        assert visible.locator(".line.add").count() >= 1 and visible.locator(".line.add").first.is_visible()
        first_change = next(r["step"] for r in history if r["gate"] and r["decision"] != "reject")
        page.select_option("#diff-step", str(first_change))
        visible = page.locator(".diff-panel:not([hidden])")
        assert visible.get_attribute("data-step") == str(first_change)
        assert visible.locator(".line.add").count() >= 1
        screenshot(page, "report-demo")


def test_prefect_ui_shows_the_skill_diff_and_gate_artifacts(demo_run, prefect_api):
    ui = prefect_api.removesuffix("/api")
    (diff,) = api(
        prefect_api, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": [key("skill-diff")]}}}
    )
    (gates,) = api(prefect_api, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": [key("gates")]}}})
    (run,) = api(prefect_api, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [diff["flow_run_id"]]}}})
    assert run["state_type"] == "COMPLETED"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{ui}/runs/flow-run/{run['id']}")
        page.get_by_text(run["name"]).first.wait_for(timeout=60_000)
        page.get_by_text("Artifacts", exact=True).first.click()
        page.get_by_text(key("skill-diff")).first.wait_for(timeout=60_000)
        assert page.get_by_text(key("gates")).count() == 1
        screenshot(page, "prefect-ui-flow-run-artifacts")

        # The report, from the run's Artifacts tab: its tables and its plots, drawn.
        page.get_by_text(key("report")).first.click()
        page.get_by_text("Training curves").first.wait_for(timeout=60_000)
        page.wait_for_function("Array.from(document.images).filter(i => i.src.startsWith('data:image/svg'))"
                               ".every(i => i.complete && i.naturalWidth > 0)", timeout=30_000)
        plots = page.evaluate("Array.from(document.images).filter(i => i.src.startsWith('data:image/svg'))"
                              ".map(i => [i.alt, i.naturalWidth, i.getBoundingClientRect().height])")
        assert [alt for alt, _, _ in plots] == ["score per step", "edit budget per step", "skill length",
                                                "cost by stage"], plots
        assert all(width > 0 and height > 0 for _, width, height in plots), plots
        assert page.locator("table").count() >= 2  # the scores and the steps
        assert "baseline" in page.locator("table").first.inner_text()
        screenshot(page, "prefect-ui-report-artifact")

        page.goto(f"{ui}/artifacts/artifact/{diff['latest_id']}")
        rendered = page.locator("pre").first
        rendered.wait_for(timeout=60_000)
        assert "+- " in rendered.inner_text() and "@@" in rendered.inner_text()
        assert page.get_by_text(f"Step {diff['data'].split('Step ')[1].split(':')[0]}:").count() >= 1
        screenshot(page, "prefect-ui-skill-diff")

        page.goto(f"{ui}/artifacts/artifact/{gates['latest_id']}")
        # The table's text cells fill in after the table itself appears (seen on a loaded machine).
        page.locator("table").first.get_by_text("accept_new_best").first.wait_for(timeout=60_000)
        cells = page.locator("table").first.inner_text()
        assert "decision" in cells and "accept_new_best" in cells and "reject" in cells
        screenshot(page, "prefect-ui-gates")


def test_the_flow_run_logs_tell_the_training_story_without_a_line_per_task(demo_run, prefect_api):
    (progress,) = api(prefect_api, "/artifacts/latest/filter",
                      {"artifacts": {"key": {"any_": [key("progress")]}}})
    (run,) = api(prefect_api, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [progress["flow_run_id"]]}}})
    assert run["name"] == RUN == demo_run["run_dir"].name  # one name in the UI and in runs/
    logs = api(prefect_api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200})
    lines = [log["message"] for log in logs]
    history = demo_run["history"]
    assert f"run directory: runs/{RUN}" in lines
    assert any(line.startswith("baseline on the selection split: ") for line in lines)
    steps_logged = [line for line in lines if line.startswith("epoch ") and " step " in line]
    assert len(steps_logged) == len(steps(history))
    for line, record in zip(steps_logged, steps(history), strict=True):
        assert f"step {record['step']}/" in line and f"-> {record['decision']}" in line
        if record["gate"]:  # the gate's own explanation: candidate against current, flips
            assert f"candidate {record['gate']['candidate_gate']:.3f}" in line and "flips +" in line
    assert any(line.startswith("epoch 2 boundary: slow update") for line in lines)
    assert [line for line in lines if line.startswith("epoch ") and " done: " in line] != []
    (finished,) = [line for line in lines if line.startswith(f"finished {RUN}: ")]
    best = demo_run["summary"]["scores"]["best"]["selection"]["hard"]
    assert f"best selection hard {best:.3f}" in finished
    # Prefect's own line per task run stays out at the default level.
    assert not [log for log in logs if log["task_run_id"] is not None]
    assert sum(line.startswith("Finished in state") for line in lines) <= 1  # the flow run's own
