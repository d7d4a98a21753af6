"""Evaluation that decides, end to end on the demo world against a real Prefect API: `skillopt compare`
(paired test, flips, compare.json), the skill-transfer flow (one evaluation task per cell, matrix.json and a
heatmap), `train.selection: pareto` on a world built for it, and the evaluation deployments under
`skillopt serve`."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest

from skillopt.shell.cli import main

pytestmark = pytest.mark.slow

#: A skill stating three of the demo's conventions: better than the initial one on some items.
TRAINED = """# Word problems

- Put only the final answer inside `<answer>…</answer>`, with nothing else in the tag.
- Append the unit km to every distance answer, separated by a space.
- Round distances to one decimal place (write a trailing .0 if needed).
- Write city names in UPPERCASE.
- Prefix money amounts with a dollar sign ($), with no space after it.
- Show money amounts with exactly two decimal places.
- Group the thousands in money amounts with commas.
"""


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_compare_prints_difference_interval_p_and_flips_and_a_skill_against_itself_is_zero(
        prefect_settings, in_tmp):
    (in_tmp / "trained.md").write_text(TRAINED, encoding="utf-8")
    code, out, err = run_cli("compare", "initial", "trained.md", "demo", "--backend", "scripted")
    assert code == 0, err
    assert "difference B - A: +" in out and "95% interval [" in out and "sign test: p = " in out
    assert "flips: " in out
    folder = Path(next(line.split(": ", 1)[1] for line in out.splitlines()
                       if line.startswith("compare.json: "))).parent
    result = json.loads((folder / "compare.json").read_text())
    assert result["n"] == 24 and result["difference"] > 0 and result["ci_low"] <= result["difference"]
    assert result["difference"] == pytest.approx(result["b"]["gate"] - result["a"]["gate"])
    assert len(result["flips"]["improved"]) >= 1 and result["p_value"] < 1
    assert result["a"]["per_item"]["tokens"] > 0 and result["b"]["skill_tokens"] > result["a"]["skill_tokens"]
    assert "B is better" in (folder / "compare.html").read_text() or result["p_value"] > 0.05
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    # Filtered by key: the session's server holds every slow test's artifacts, more than one page.
    key = f"{folder.name}-compare"
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert [artifact.key for artifact in artifacts] == [key]

    code, out, err = run_cli("compare", "trained.md", "trained.md", "demo")
    assert code == 0, err
    folder = Path(next(line.split(": ", 1)[1] for line in out.splitlines()
                       if line.startswith("compare.json: "))).parent
    same = json.loads((folder / "compare.json").read_text())
    assert same["difference"] == 0 and same["p_value"] == 1 and same["flips"]["improved"] == []
    assert same["ci_low"] == same["ci_high"] == 0

    # The same skill as an Agent Skills folder: its front matter is not shown to the target, so its evaluation
    # comes from the cache, made for trained.md's text (this lookup once failed with a KeyError).
    folder_skill = in_tmp / "word-problems"
    folder_skill.mkdir()
    (folder_skill / "SKILL.md").write_text(
        f"---\nname: word-problems\ndescription: Demo conventions.\n---\n\n{TRAINED}", encoding="utf-8")
    code, out, err = run_cli("compare", "trained.md", str(folder_skill), "demo", "--out", "page.html")
    assert code == 0, err
    assert "page copied to page.html" in out and "0 worse" in (in_tmp / "page.html").read_text()
    folder = Path(next(line.split(": ", 1)[1] for line in out.splitlines()
                       if line.startswith("compare.json: "))).parent
    as_folder = json.loads((folder / "compare.json").read_text())
    assert as_folder["difference"] == 0 and as_folder["b"]["sha"] != as_folder["a"]["sha"]


def test_transfer_writes_a_2x2_matrix_and_shows_one_evaluation_task_per_cell(prefect_settings, in_tmp):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterName,
    )

    (in_tmp / "trained.md").write_text(TRAINED, encoding="utf-8")
    code, out, err = run_cli("transfer", "--skills", "initial", "trained.md", "--targets", "scripted_a",
                             "scripted_b", "--bench", "demo", "--run-name", "transfer-2x2")
    assert code == 0, err
    folder = in_tmp / "runs" / "transfer-2x2"
    matrix = json.loads((folder / "matrix.json").read_text())
    cells = {(c["skill"], c["target"]): c for c in matrix["cells"]}
    assert set(cells) == {(s, t) for s in ("initial", "trained.md") for t in ("scripted_a", "scripted_b")}
    assert cells[("initial", "scripted_a")]["difference"] == 0
    assert cells[("trained.md", "scripted_a")]["difference"] > 0
    # The smaller target applies at most two of the three rules: the skill helps it less.
    assert cells[("trained.md", "scripted_b")]["score"] <= cells[("trained.md", "scripted_a")]["score"]
    page = (folder / "matrix.html").read_text()
    assert page.count("<td style=\"background:") == 4 and "scripted_b" in page

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=["transfer-2x2"])))
        while True:
            names = [t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(
                id={"any_": [flow_run.id]}), limit=200)]
            cells_seen = sorted(n for n in names if n.startswith("cell "))
            if len(cells_seen) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["transfer-2x2-matrix"])))
    assert cells_seen == sorted(f"cell {s} | {t} | demo" for s in ("initial", "trained.md")
                                for t in ("scripted_a", "scripted_b"))
    assert any(a.key == "transfer-2x2-matrix" and a.type == "table" for a in artifacts)

    # Without the initial skill among the skills, its rows (every difference's baseline) are kept too.
    code, _, err = run_cli("transfer", "--skills", "trained.md", "--targets", "scripted_a", "--bench", "demo",
                           "--run-name", "transfer-1x1")
    assert code == 0, err
    (cell,) = json.loads((in_tmp / "runs" / "transfer-1x1" / "matrix.json").read_text())["cells"]
    results = in_tmp / "runs" / "transfer-1x1" / "cells" / "demo-scripted_a" / "eval" / "initial_test"
    rows = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    assert len(rows) == cell["n"] and cell["initial_score"] == pytest.approx(
        sum(row["hard"] for row in rows) / len(rows))


def test_pareto_keeps_two_skills_that_win_on_different_items_and_the_report_draws_the_front(
        prefect_settings, in_tmp):
    from skillopt.flows.train import skill_train

    world = '[{stage: rollout, handler: "tests.fakes.pareto_world:target"}]'
    summary = skill_train(benchmark="demo", run_name="pareto-world",
                          overrides=["train.selection=pareto", "evaluation.objectives=[]",
                                     f"model.target.options.rules={world}"])
    run_dir = Path(summary["run_dir"])
    front = json.loads((run_dir / "front.json").read_text())
    members = front["members"]
    assert len(members) >= 2
    wins = [(a["step"], b["step"]) for a in members for b in members
            if a is not b and any(value > b["items"].get(item, -1) for item, value in a["items"].items())]
    assert any((b, a) in wins for a, b in wins), "two kept skills each win an item the other loses"
    chosen = next(m for m in members if m["sha"] == front["chosen"])
    assert chosen["score"] == max(m["score"] for m in members)
    assert (run_dir / "best_skill.md").is_file() and summary["best_skill_sha"] == front["chosen"]
    report = (run_dir / "report.html").read_text()
    assert f'id="chart-front" data-points="{len(members)}"' in report and "<td>chosen</td>" in report


def test_serve_registers_the_evaluation_deployments_and_skill_eval_scores_a_registry_version(prefect_api,
                                                                                          tmp_path):
    from prefect.exceptions import ObjectNotFound

    from tests.integration.test_deployments import serving

    (tmp_path / "trained.md").write_text(TRAINED, encoding="utf-8")
    code, _, err = run_cli("skills", "promote", "demo", str(tmp_path / "trained.md"), "--skills-dir",
                           str(tmp_path / "skills"))
    assert code == 0, err
    started = datetime.now(UTC)
    with serving(prefect_api, tmp_path, "demo") as (handle, _, _):
        with handle.settings(), handle.client() as client:
            deadline = time.monotonic() + 60
            found = {}
            for name in ("skill-eval/demo", "skill-compare/demo", "skill-transfer/matrix"):
                # The server is shared by the session: an earlier serve may have registered the same
                # deployment; wait for this serve's registration.
                while name not in found:
                    try:
                        deployment = client.read_deployment_by_name(name)
                        if deployment.updated is not None and deployment.updated >= started:
                            found[name] = deployment
                            continue
                    except ObjectNotFound:
                        pass
                    assert time.monotonic() < deadline, f"{name} not registered by this serve"
                    time.sleep(0.5)
        assert found["skill-eval/demo"].parameters["skill_file"] == "registry:"
        assert found["skill-transfer/matrix"].parameters["targets"] == ["scripted_a", "scripted_b"]
        assert [s.schedule.cron for s in found["skill-transfer/matrix"].schedules] == ["0 3 * * *"]
        assert "and for evaluation: skill-eval/demo, skill-compare/demo, skill-transfer/matrix" in \
            handle.log.read_text()

        handle.deployment = "skill-eval/demo"
        flow_run = handle.wait(handle.trigger({"skill_file": "registry:demo@1"}))
        assert flow_run.state.type.value == "COMPLETED", handle.log.read_text()[-3000:]
    (eval_dir,) = (tmp_path / "runs").glob("demo-eval-*")
    scores = json.loads((eval_dir / "eval" / "test" / "scores.json").read_text())
    from skillopt.skill.document import skill_hash

    assert scores["n"] == 24 and scores["skill_sha"] == skill_hash(TRAINED)
