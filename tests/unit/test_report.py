"""The HTML run report and comparison: self-contained, one mark per data point, escaped, with a diff
viewer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from skillopt.core.gate import decide
from skillopt.core.records import StepRecord
from skillopt.run.report import ReportError, load_run, render_compare, render_report, write_report
from skillopt.run.runs import RunDir
from skillopt.shell.cli import main

HOSTILE = '<script>alert("x")</script><img src=http://example.invalid/x.png>'


def rows(solved: int, total: int = 4) -> list[dict]:
    return [{"id": f"v{i}", "hard": float(i < solved), "soft": float(i < solved)} for i in range(total)]


def make_run(folder: Path, name: str = "toy-run") -> Path:
    """A three-step run: accepted, rejected, skipped; skills grow; a hostile line in the skill."""
    run = RunDir(folder / name)
    run.path.mkdir(parents=True)
    skills = ["# Skill\n- be brief\n", f"# Skill\n- be brief\n- {HOSTILE}\n", None, None]
    run.write_skill_snapshot(0, skills[0])
    gate1 = decide(rows(3), rows(1), current_score=0.25, best_score=0.25, metric="hard")
    gate2 = decide(rows(2), rows(3), current_score=0.75, best_score=0.75, metric="hard")
    records = [
        StepRecord(
            step=1,
            epoch=1,
            step_in_epoch=1,
            budget=4,
            decision=gate1.decision,
            gate=gate1,
            current_score=0.75,
            best_score=0.75,
            rollout_hard=0.25,
            edits_applied=1,
            n_total=4,
        ),
        StepRecord(
            step=2,
            epoch=1,
            step_in_epoch=2,
            budget=3,
            decision="reject",
            gate=gate2,
            current_score=0.75,
            best_score=0.75,
            rollout_hard=0.5,
            n_total=4,
        ),
        StepRecord(
            step=3,
            epoch=2,
            step_in_epoch=1,
            budget=2,
            decision="skip_no_patches",
            current_score=0.75,
            best_score=0.75,
            rollout_hard=1.0,
            n_total=4,
        ),
    ]
    for record in records:
        run.record_step(record)
    for step in (1, 2, 3):
        run.write_skill_snapshot(step, skills[1])
    usage = [
        {"stage": stage, "prompt_tokens": 100, "completion_tokens": 10, "cost_usd": 0.001, "cache_hit": False}
        for stage in ("rollout", "rollout", "analyst", "rollout", "merge")
    ]
    run.write_text("usage.jsonl", "".join(json.dumps(u) + "\n" for u in usage))
    run.write_json(
        "summary.json",
        {
            "run_name": name,
            "benchmark": "toy",
            "stopped_by": None,
            "wall_s": 3.0,
            "best_skill_sha": "ab" * 32,
            "scores": {
                "baseline": {"selection": {"hard": 0.25, "soft": 0.25}, "test": {"hard": 0.2, "soft": 0.3}},
                "best": {"selection": {"hard": 0.75, "soft": 0.75}, "test": {"hard": 0.6, "soft": 0.7}},
                "final": {"selection": {"hard": 0.75, "soft": 0.75}},
            },
            "counts": {"total": {"n": 3, "accepts": 1, "rejects": 1, "skips": 1}},
            "usage": {
                "total": {"calls": 5, "tokens": 550, "usd": 0.005},
                "by_stage": [{"stage": "rollout", "calls": 3, "tokens": 330, "usd": 0.003}],
            },
        },
    )
    return run.path


def figure(page: str, chart_id: str) -> str:
    match = re.search(
        rf'<figure class="chart" id="{chart_id}" data-points="(\d+)">(.*?)</figure>', page, re.S
    )
    assert match, f"no chart {chart_id}"
    return match.group(0)


def test_report_draws_one_mark_per_data_point_in_every_chart(tmp_path):
    page = render_report(load_run(make_run(tmp_path)))
    scores = figure(page, "chart-scores")
    # 3 selection points, 2 gated candidates (one accepted, one rejected), 3 rollout points.
    assert scores.count('<circle class="point') == 8 and 'data-points="8"' in scores
    assert (
        scores.count('class="point gate accepted"') == 1 and scores.count('class="point gate rejected"') == 1
    )
    # budget and edits applied, 3 steps each
    assert figure(page, "chart-budget").count("<circle") == 6
    assert figure(page, "chart-skill-length").count("<circle") == 4    # snapshots 0..3
    cost = figure(page, "chart-cost")
    assert cost.count("<circle") == 5 and 'data-series="rollout" data-points="3"' in cost
    assert "Cumulative USD" in cost  # priced calls plot dollars


def test_report_is_self_contained_and_escapes_skill_text(tmp_path):
    page = render_report(load_run(make_run(tmp_path)))
    assert HOSTILE not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', page)  # nothing fetched
    assert "default-src 'none'" in page  # and the page may not fetch anything either
    assert page.count("<script>") == 1  # the diff picker's inline script only


def test_diff_viewer_shows_the_last_change_and_keeps_every_step(tmp_path):
    page = render_report(load_run(make_run(tmp_path)))
    panels = re.findall(r'<section class="diff-panel" data-step="(\d+)"( hidden)?>', page)
    assert [step for step, _ in panels] == ["0", "1", "2", "3"]
    assert [step for step, hidden in panels if not hidden] == ["1"]  # the last step that changed the skill
    shown = page[page.index('data-step="1">'):page.index('data-step="2"')]
    assert '<span class="line add">+- &lt;script&gt;' in shown


def test_summary_section_lists_scores_and_cost(tmp_path):
    page = render_report(load_run(make_run(tmp_path)))
    assert "<td>best</td><td>test</td><td>0.600</td>" in page
    assert "1 accepted, 1 rejected, 1 skipped" in page and "$0.0050" in page


def test_the_summary_names_the_models_that_answered_each_role(tmp_path):
    folder = make_run(tmp_path)
    calls = [("target", "local", "SmolLM2-135M-Instruct.Q4_1.gguf")] * 3 + [("optimizer", "scripted", None)]
    calls += [("judge", "openai", "gpt-4.1-mini")] + [("judge", "openai", "gpt-4o")] * 2
    (folder / "usage.jsonl").write_text("".join(
        json.dumps({"role": role, "backend": backend, "model_requested": model or "scripted",
                    "model_served": model, "stage": "rollout", "cache_hit": False}) + "\n"
        for role, backend, model in calls))
    from skillopt.run.report_markdown import report_markdown

    models = ("target local/SmolLM2-135M-Instruct.Q4_1.gguf; optimizer scripted/scripted; "
              "judge openai/gpt-4o (2 calls), openai/gpt-4.1-mini (1 call)")
    assert f"<dt>models</dt><dd>{models}</dd>" in render_report(load_run(folder))
    assert f"Models: {models}." in report_markdown(load_run(folder))  # the report the Prefect UI shows


def test_calls_without_a_price_are_never_shown_as_costing_nothing(tmp_path):
    """A model missing from the price table (a new model name, a local server): the summary's usd is 0.0 with
    ``unpriced_calls``; the reports say the cost is unknown, as the command line's last lines do."""
    from skillopt.run.report_markdown import report_markdown

    folder = make_run(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    summary["usage"] = {"total": {"calls": 31, "tokens": 1909, "usd": 0.0, "unpriced_calls": 31},
                        "by_stage": [{"stage": "rollout", "calls": 28, "tokens": 1909, "usd": 0.0,
                                      "unpriced_calls": 28},
                                     {"stage": "merge", "calls": 3, "tokens": 0, "usd": 0.002,
                                      "unpriced_calls": 1}]}
    (folder / "summary.json").write_text(json.dumps(summary))
    run = load_run(folder)
    page = render_report(run)
    assert "<dt>cost</dt><dd>unknown (31 unpriced calls)</dd>" in page
    assert "<td>rollout</td><td>28</td><td>1909</td><td>unknown (28 unpriced calls)</td>" in page
    assert "<td>merge</td><td>3</td><td>0</td><td>0.0020 + unknown (1 unpriced call)</td>" in page
    assert "cost unknown (31 unpriced calls);" in report_markdown(run)
    assert "<td>unknown (31 unpriced calls)</td>" in render_compare([run])
    assert "0.0000" not in page + report_markdown(run) + render_compare([run])


def test_an_unfinished_run_still_gets_a_report(tmp_path):
    folder = make_run(tmp_path)
    (folder / "summary.json").unlink()
    page = render_report(load_run(folder))
    assert "has not finished" in page and 'id="chart-scores" data-points="8"' in page


def test_compare_puts_runs_side_by_side(tmp_path):
    folders = [make_run(tmp_path, name) for name in ("run-a", "run-b")]
    (folders[1] / "usage.jsonl").write_text(json.dumps({"role": "target", "backend": "openai",
                                                         "model_served": "gpt-4.1-mini", "stage": "rollout"}))
    page = render_compare([load_run(folder) for folder in folders])
    curves = figure(page, "chart-compare-scores")
    assert 'data-series="run-a" data-points="3"' in curves and 'data-series="run-b" data-points="3"' in curves
    assert page.count("<tr><td>run-") == 2
    assert "<td>run-a</td><td>toy</td><td>–</td>" in page  # its usage lines name no role
    assert "<td>run-b</td><td>toy</td><td>target openai/gpt-4.1-mini</td>" in page


def test_report_and_compare_commands_write_files(tmp_path, capsys):
    folder = make_run(tmp_path)
    assert main(["report", str(folder)]) == 0
    assert (folder / "report.html").read_text().startswith("<!DOCTYPE html>")
    out = tmp_path / "cmp.html"
    assert main(["compare", str(folder), str(make_run(tmp_path, "other")), "--out", str(out)]) == 0
    assert "2 runs compared" in out.read_text()
    assert write_report(folder, tmp_path / "elsewhere.html").is_file()


def test_a_folder_that_is_not_a_run_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ReportError, match="not a run directory"):
        load_run(tmp_path)
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_a_secret_in_the_run_directory_never_reaches_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-visible-in-a-skill-0123456789")
    folder = make_run(tmp_path)
    (folder / "skills" / "step_0004.md").write_text("# Skill\nkey: sk-test-visible-in-a-skill-0123456789\n")
    page = render_report(load_run(folder))
    assert "sk-test-visible-in-a-skill" not in page and "[REDACTED]" in page


def test_report_link_points_at_the_reports_server_or_the_file(tmp_path):
    from skillopt.run.artifacts import report_url

    report = tmp_path / "runs" / "My run" / "report.html"
    assert report_url(report, run_name="My run", reports_url="http://127.0.0.1:8080/") == \
        "http://127.0.0.1:8080/My%20run/report.html"
    assert report_url(report, run_name="My run", reports_url=None) == report.resolve().as_uri()


def test_step_axes_have_whole_number_ticks_and_the_score_chart_draws_the_baseline(tmp_path):
    page = render_report(load_run(make_run(tmp_path)))
    scores = figure(page, "chart-scores")
    x_ticks = re.findall(r'<text class="tick" x="[\d.]+" y="\d+" text-anchor="middle">([^<]+)</text>', scores)
    assert x_ticks and all(re.fullmatch(r"\d+", tick) for tick in x_ticks), x_ticks  # 3 steps: no "1.5"
    baseline = re.search(r'<line class="baseline"[^>]* data-y="([\d.]+)"', scores)
    assert baseline and float(baseline.group(1)) == 0.25  # the summary's baseline selection score
    assert "baseline (selection)" in scores


def test_the_slow_update_has_a_panel_of_its_own_after_its_step(tmp_path):
    """The epoch boundary's change once showed in the next step's panel (a rejected step that seemed to change
    the skill) or, after the last epoch, nowhere; it is its own panel now, and an ungated slow update does
    not take the default from the latest accepted step."""
    folder = make_run(tmp_path)
    run = RunDir(folder)
    step_three = (folder / "skills" / "step_0003.md").read_text()
    run.write_skill_snapshot(3, step_three + "- guidance from the slow update\n", after="slow_update")
    run.record_step(StepRecord(step=3, epoch=2, step_in_epoch=0, budget=0, decision="slow_update",
                               kind="slow_update", current_score=0.75, best_score=0.75))
    page = render_report(load_run(folder))
    panels = re.findall(r'<section class="diff-panel" data-step="([\w-]+)"( hidden)?>', page)
    assert [key for key, _ in panels] == ["0", "1", "2", "3", "3-slow-update"]
    assert [key for key, hidden in panels if not hidden] == ["1"]
    boundary = page[page.index('data-step="3-slow-update"'):]
    assert "after step 3: epoch boundary, slow update (slow_update)" in boundary
    assert '<span class="line add">+- guidance from the slow update</span>' in boundary
    step_panel = page[page.index('data-step="3"'):page.index('data-step="3-slow-update"')]
    assert "guidance from the slow update" not in step_panel


def test_the_markdown_report_carries_the_tables_and_the_plots_as_inline_images(tmp_path):
    import base64

    from skillopt.run.report_markdown import report_markdown

    text = report_markdown(load_run(make_run(tmp_path)), html_report="file:///x/report.html")
    assert "| baseline | selection | 0.250 | 0.250 |" in text
    assert "| 2 | 1 | reject | 0.500 | 0.750 | 0.750 | 0 |" in text
    images = re.findall(r"!\[([^\]]+)\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", text)
    assert [title for title, _ in images] == ["score per step", "edit budget per step", "skill length",
                                              "cost by stage"]
    score_svg = base64.b64decode(images[0][1]).decode()
    assert score_svg.startswith("<svg") and "<style>" in score_svg and 'class="baseline"' in score_svg
    assert score_svg.count('<circle class="point') == 8
    assert HOSTILE not in text
    assert "`file:///x/report.html`" in text
