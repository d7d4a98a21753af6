"""Training an Agent Skills folder end to end on the offline demo world (scripted backend), against a real
Prefect API: a reference file is improved, the run exports and installs as a valid folder, and a candidate
that breaks the specification is rejected with its reason in history.jsonl."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest
import yaml
from skills_ref.validator import validate

from skillopt.benchmarks.base import shipped_prompts_dir
from skillopt.benchmarks.demo.scripted import DEMO_RULES
from skillopt.run.artifacts import artifact_key
from skillopt.run.skill_install import export_run_skill, install_run_skill

pytestmark = pytest.mark.slow

DEMO_FOLDER = shipped_prompts_dir("demo") / "skill" / "demo-word-problems"


def train(*overrides: str, run_name: str) -> dict:
    from skillopt.flows.train import skill_train

    return skill_train(benchmark="demo", overrides=list(overrides), run_name=run_name)


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def artifacts(api_url: str, run: str, kind: str) -> list[dict]:
    """Every version of one of the run's artifacts, read back from the Prefect API."""
    body = {"artifacts": {"key": {"any_": [artifact_key("demo", run, kind)]}}}
    request = urllib.request.Request(f"{api_url}/artifacts/filter", data=json.dumps(body).encode(),
                                     method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def test_a_skill_folder_trains_its_reference_file_and_exports_and_installs(prefect_settings, in_tmp):
    folder = in_tmp / "demo-word-problems"
    shutil.copytree(DEMO_FOLDER, folder)
    (folder / "assets").mkdir()
    (folder / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0binary")
    summary = train(f"train.skill_init={folder}", run_name="folder-demo")
    run_dir = Path(summary["run_dir"])

    accepted = [r for r in history(run_dir) if r["kind"] == "step" and r["decision"].startswith("accept")]
    assert any("references/rules.md" in r["files_changed"] for r in accepted)
    edits = [e for r in accepted for e in r["edits"]]
    assert any(e["file"] == "references/rules.md" and e["op"] == "append" for e in edits)
    first = accepted[0]["step"]
    diffs = json.loads((run_dir / "steps" / f"{first:04d}" / "file_diffs.json").read_text())
    assert "+++ candidate step" in diffs["references/rules.md"]
    report = (run_dir / "report.html").read_text()
    assert "files changed: references/rules.md" in report
    diffs_shown = [a["data"] for a in artifacts(prefect_settings, "folder-demo", "skill-diff")]
    assert any("Files changed: `references/rules.md`" in d and "#### references/rules.md" in d
               for d in diffs_shown)
    tables = [a["data"] for a in artifacts(prefect_settings, "folder-demo", "edits")]
    rows = [row for data in tables for row in (json.loads(data) if isinstance(data, str) else data)]
    assert any(row["file"] == "references/rules.md" and row["decision"] == "accepted" for row in rows)
    # The target read the rules from the reference file: the best skill beats the baseline on test.
    assert summary["scores"]["best"]["test"]["hard"] > summary["scores"]["baseline"]["test"]["hard"]

    exported = export_run_skill(run_dir, in_tmp / "out")
    assert exported == in_tmp / "out" / "demo-word-problems"
    assert validate(exported) == []
    rules = (exported / "references" / "rules.md").read_text()
    assert "<!-- FILE:" not in rules and "- Write city names in UPPERCASE." in rules
    assert (exported / "assets" / "logo.png").read_bytes() == b"\x89PNG\r\n\x1a\n\0binary"
    project = in_tmp / "P"
    project.mkdir()
    installed = install_run_skill(run_dir, "claude-code", project=project)
    assert installed == project / ".claude" / "skills" / "demo-word-problems"
    assert (installed / "SKILL.md").read_text() == (exported / "SKILL.md").read_text()


def test_an_edit_that_breaks_the_name_is_rejected_with_its_reason(prefect_settings, in_tmp):
    folder = in_tmp / "demo-word-problems"
    shutil.copytree(DEMO_FOLDER, folder)
    rename = {"name": "rename the skill", "stage": "analyst", "json": {
        "diagnosis": [], "execution_notes": [],
        "patch": {"reasoning": "A friendlier name.", "edits": [
            {"op": "replace", "target": "name: demo-word-problems", "content": "name: Demo Word Problems"}]}}}
    rules = in_tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump([rename, *[dict(r) for r in DEMO_RULES if r["stage"] != "analyst"]]))
    summary = train(f"train.skill_init={folder}", f"model.optimizer.options.rules={rules}", "train.epochs=1",
                    "gradient.failure_only=true", run_name="folder-rename")
    run_dir = Path(summary["run_dir"])

    steps = [r for r in history(run_dir) if r["kind"] == "step"]
    invalid = [r for r in steps if r["decision"] == "skip_invalid_skill"]
    assert invalid and not any(r["decision"].startswith("accept") for r in steps)
    reason = invalid[0]["warnings"][-1]
    assert "name 'Demo Word Problems' must be lowercase" in reason
    assert "must match the skill's folder name 'demo-word-problems'" in reason
    # Never written: no snapshot or best skill holds the broken name.
    assert all("Demo Word Problems" not in p.read_text() for p in (run_dir / "skills").iterdir())
    assert "Demo Word Problems" not in (run_dir / "best_skill.md").read_text()
