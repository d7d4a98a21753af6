"""The `skillopt` command as a user runs it: config show/validate and the schedule planner."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections import Counter

import pytest

from skillopt.shell.cli import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_config_show_prints_resolved_yaml_with_the_override_and_its_source():
    code, out, err = run("config", "show", "searchqa", "-o", "optimizer.learning_rate=8")
    assert code == 0, err
    assert re.search(r"^optimizer:\n(  .*\n)*?  learning_rate: 8$", out, re.M)
    assert "# optimizer.learning_rate: -o optimizer.learning_rate" in out
    assert "# benchmark.split_dir: shipped:configs/searchqa.yaml" in out


def test_config_show_reports_credential_presence_only(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SENTINEL-0123456789abcdef")
    code, out, _ = run("config", "show", "qa", "-o", "model.target.backend=anthropic")
    assert code == 0
    assert "# model.target: set (env:ANTHROPIC_API_KEY)" in out
    assert "SENTINEL" not in out


def test_config_show_reports_each_credential_as_the_run_resolves_it(monkeypatch):
    monkeypatch.delenv("OPENAI_COMPATIBLE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, _ = run("config", "show", "qa", "-o", "model.target.backend=openai_compatible",
                       "-o", "model.target.options.preset=llamacpp", "-o", "model.target.model=m",
                       "-o", "model.target.base_url=http://127.0.0.1:8080/v1",
                       "-o", "model.optimizer.backend=scripted", "-o", "model.judge=null")
    assert code == 0
    # a local server's preset needs no key; the scripted optimizer sends none
    assert "# model.target: optional, missing (env:OPENAI_COMPATIBLE_API_KEY)" in out
    assert "# model.optimizer: not needed" in out and "# model.judge: disabled (model.judge: null)" in out


@pytest.mark.parametrize(
    "override,expected",
    [
        ("optimizer.learning_rate=abc", "optimizer.learning_rate: Input should be a valid integer"),
        ("optimizer.learnin_rate=8", "optimizer.learnin_rate: unknown key; did you mean 'learning_rate'?"),
    ],
)
def test_config_show_rejects_bad_overrides_naming_the_key(override, expected):
    code, out, err = run("config", "show", "searchqa", "-o", override)
    assert code != 0
    assert out == ""
    assert expected in err
    assert "Traceback" not in err


def test_config_validate_accepts_a_good_file_and_rejects_a_bad_one(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("_base_: searchqa.yaml\noptimizer: {learning_rate: 6}\n", encoding="utf-8")
    code, out, _ = run("config", "validate", str(good))
    assert code == 0 and "valid (benchmark: " not in out and "good.yaml: valid" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer: {lr_schedule: cosine}\n", encoding="utf-8")
    code, _, err = run("config", "validate", str(bad))
    assert code == 2
    assert "optimizer.lr_schedule: unknown key; did you mean 'lr_scheduler'?" in err
    assert "bad.yaml" in err


def test_a_typo_in_a_benchmark_key_is_caught_by_config_show_with_a_suggestion_and_the_file(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text('_base_: searchqa.yaml\nbenchmark: {split_rattio: "1:1:1"}\n', encoding="utf-8")
    code, out, _ = run("config", "validate", str(typo))  # no benchmark named: says where it is checked
    assert code == 0 and f"config show BENCHMARK -c {typo}" in out
    code, _, err = run("config", "show", "searchqa", "-c", str(typo))
    assert code == 2, err
    assert err.startswith("error: benchmark.split_rattio: unknown key; did you mean 'split_ratio'? "
                          "(benchmark searchqa, from ") and "typo.yaml" in err


def test_schedule_cosine_4_to_2_over_40_steps():
    code, out, _ = run("schedule", "--kind", "cosine", "--max", "4", "--min", "2", "--steps", "40")
    assert code == 0
    step_lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines] == [f"{s}:" for s in range(1, 41)]
    budgets = [int(line.split()[-1]) for line in step_lines]
    assert Counter(budgets) == {4: 13, 3: 13, 2: 14}
    assert budgets == sorted(budgets, reverse=True)


def test_schedule_cosine_8_to_2_over_8_steps():
    _, out, _ = run("schedule", "--kind", "cosine", "--max", "8", "--min", "2", "--steps", "8")
    budgets = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")]
    assert budgets == [8, 7, 6, 5, 4, 3, 2, 2]


def test_schedule_rejects_min_above_max():
    code, _, err = run("schedule", "--kind", "linear", "--max", "2", "--min", "4", "--steps", "3")
    assert code == 2
    assert "min_learning_rate" in err


def test_installed_command_runs_as_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "skillopt.shell.cli", "config", "show", "qa", "--no-sources"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "split_mode: ratio" in proc.stdout
    help_proc = subprocess.run(
        [sys.executable, "-m", "skillopt.shell.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_proc.returncode == 0
    for command in ("config", "schedule"):
        assert command in help_proc.stdout


def test_benchmarks_lists_the_installed_plug_ins_one_line_each():
    code, out, _ = run("benchmarks")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for name in ("demo", "qa", "searchqa"):
        assert name in lines and "unavailable" not in lines[name]
    assert "generated" in lines["demo"] and "ratio" in lines["qa"]


@pytest.mark.parametrize("command", [["backends"], ["train", "qa", "--dry-run"],
                                     ["backends", "check", "--no-call"]])
def test_a_mistyped_backend_is_one_line_with_exit_2(command):
    code, out, err = run(*command, "--backend", "opnai")
    assert code == 2
    assert err.strip() == ("error: --backend (or --target-backend): unknown backend 'opnai'; the backends "
                           "are: openai, azure_openai, anthropic, openai_compatible, codex_exec, "
                           "claude_code_exec, local, scripted")


def test_demo_with_another_backend_gets_past_the_scripted_options():
    code, out, err = run("train", "demo", "--dry-run", "--backend", "openai")
    assert (code, err) == (0, "")
    assert out.startswith("dry run of demo:")


@pytest.mark.parametrize("local_configs", [False, True], ids=["shipped configs", "configs/ in the cwd"])
def test_another_backend_with_overrides_drops_the_demos_options(tmp_path, monkeypatch, local_configs):
    """Pointing the demo at one's own server: --backend replaces scripted, and the scripted `rules` option
    goes with it, also when the demo's config is read from a configs/ folder in the working directory (a
    checkout next to another installation) and other -o overrides are given."""
    import shutil

    from skillopt.core.resources import shipped_dir

    if local_configs:
        shutil.copytree(shipped_dir("configs"), tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    code, out, err = run("train", "demo", "--backend", "openai_compatible", "-o",
                         "model.target.base_url=http://127.0.0.1:9/v1", "-o", "train.epochs=1", "--dry-run")
    assert (code, err) == (0, "")
    assert out.startswith("dry run of demo: 1 epochs")
    # An option the person gives the new backend is still checked.
    code, _, err = run("train", "demo", "--backend", "openai_compatible",
                       "-o", "model.target.options.rulez=x", "--dry-run")
    assert code == 2 and "model.target.options.rulez: unknown option; valid options: preset, " in err
    assert "(backend openai_compatible, from -o model.target.options.rulez)" in err


@pytest.mark.parametrize("local_configs", [False, True], ids=["shipped configs", "configs/ in the cwd"])
def test_a_config_file_naming_another_backend_drops_the_demos_options(tmp_path, monkeypatch, local_configs):
    """A -c file that gives a demo role another backend drops the scripted `rules` the demo's own config gave
    it, whether that config is the shipped one or a copy in the working directory's configs/ folder; an
    option the file itself gives the new backend is still checked."""
    import shutil

    from skillopt.core.resources import shipped_dir

    if local_configs:
        shutil.copytree(shipped_dir("configs"), tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "p5.yaml").write_text("model:\n  target: {backend: openai_compatible, base_url: "
                                  "http://127.0.0.1:8000/v1, model: demo-target}\n", encoding="utf-8")
    code, out, err = run("train", "demo", "--dry-run", "-c", "mine/p5.yaml", "-o", "train.epochs=1")
    assert (code, err) == (0, "")
    assert out.startswith("dry run of demo: 1 epochs")
    (mine / "typo.yaml").write_text("model:\n  target: {backend: openai_compatible, base_url: "
                                    "http://127.0.0.1:8000/v1, options: {prest: vllm}}\n", encoding="utf-8")
    code, _, err = run("train", "demo", "--dry-run", "-c", "mine/typo.yaml")
    assert code == 2 and "model.target.options.prest: unknown option; did you mean 'preset'? (backend " \
        "openai_compatible, from yaml:mine/typo.yaml)" in err
    assert "rules" not in err


@pytest.mark.parametrize("command", [
    ["train", "demo", "--dry-run"], ["train", "demo"], ["demo"], ["eval", "demo", "--skill", "initial"],
    ["compare", "initial", "initial", "demo"], ["backends", "check", "-b", "demo", "--no-call"],
])
def test_a_literal_key_refused_names_the_key_variable_of_the_backend_given_on_the_command_line(tmp_path,
                                                                                                command):
    """A key pasted into model.target.api_key_env, with --target-backend anthropic: the refusal says to
    export ANTHROPIC_API_KEY (it said OPENAI_API_KEY: the config layer named the variable before it saw the
    option), in one line naming the key and the file, without the key."""
    secret = "sk-ant-api03-SENTINEL0123456789abcdefghijklmnop"
    leak = tmp_path / "leak.yaml"
    leak.write_text(f"model:\n  target:\n    api_key_env: {secret}\n", encoding="utf-8")
    code, out, err = run(*command, "-c", str(leak), "--target-backend", "anthropic")
    assert code == 2 and secret not in out + err
    assert err.count("\n") == 1 and err.startswith("error: yaml:"), err
    assert ("leak.yaml: model.target.api_key_env: literal keys are not accepted; export ANTHROPIC_API_KEY or "
            "set model.target.api_key_env") in err, err


@pytest.mark.parametrize(("usage", "line"), [
    ({"calls": 6, "usd": 0.0, "unpriced_calls": 6}, "model calls 6, cost unknown (6 unpriced calls)"),
    ({"calls": 6, "usd": 0.012, "unpriced_calls": 1},
     "model calls 6, cost $0.0120 + unknown (1 unpriced call)"),
    ({"calls": 6, "usd": 0.012, "unpriced_calls": 0}, "model calls 6, cost $0.0120"),
    ({"calls": 0, "usd": 0.0, "unpriced_calls": 0, "cache_hits": 12},
     "model calls 0, cost $0.0000; 12 calls served from cache"),
])
def test_the_usage_line_never_prints_a_zero_cost_for_unpriced_calls(usage, line):
    from skillopt.shell.cli import usage_line

    assert usage_line(usage) == line


def test_the_scripted_target_on_data_without_replies_is_refused_once_before_any_run(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "mine.jsonl"
    rows = [{"id": f"q{i}", "question": f"{i}+{i}?", "answers": [str(2 * i)]} for i in range(12)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, out, err = run("train", "qa", "--data", str(data), "--backend", "scripted")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "the scripted target has no replies for this data" in err
    assert not (tmp_path / "runs").exists()


def test_the_scripted_target_on_fixture_data_with_replies_passes_the_check():
    from skillopt.benchmarks.base import load_benchmark
    from skillopt.core.config import load_config
    from skillopt.run.run_checks import check_scripted_target

    loaded = load_config("qa", env={}, overrides=["benchmark.split_mode=split_dir",
                                                  "benchmark.split_dir=tests/fixtures/qa"])
    benchmark = load_benchmark("qa")
    bench_cfg = benchmark.Config.model_validate(loaded.config.benchmark.model_dump())
    check_scripted_target("qa", bench_cfg, type("Role", (), {"backend": "scripted", "options": {}})())


def test_the_summary_explains_a_best_that_the_epoch_boundary_raised(tmp_path):
    """The step lines said best 0.917; the final check found the slow update's skill at 1.000."""
    from skillopt.core.records import StepRecord
    from skillopt.run.runs import RunDir
    from skillopt.shell.cli import best_after_the_last_step

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.record_step(StepRecord(step=1, epoch=1, step_in_epoch=1, budget=4, decision="accept_new_best",
                               current_score=0.917, best_score=0.917))
    run.record_step(StepRecord(step=1, epoch=1, step_in_epoch=1, budget=0, decision="slow_update",
                               kind="slow_update", current_score=1.0, best_score=0.917))
    summary = {"run_dir": str(run.path), "config": {"evaluation": {"gate_metric": "hard"}},
               "scores": {"best": {"selection": {"hard": 1.0, "soft": 1.0}},
                          "final": {"selection": {"hard": 1.0, "soft": 1.0}}}}
    assert best_after_the_last_step(summary) == (
        "best 1.000, not the 0.917 of the step lines: the skill the slow update left scored 1.000 on the "
        "selection split at the final check, so it became the best")
    summary["scores"]["best"]["selection"] = {"hard": 0.917, "soft": 0.917}
    assert best_after_the_last_step(summary) is None


def test_a_resumed_run_separates_this_attempts_calls_from_the_earlier_ones(tmp_path, caplog):
    import json as _json
    import logging

    from skillopt.run.runs import RunDir
    from skillopt.shell.cli import attempt_line

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    lines = [{"ts": "2026-12-04T10:00:00.000Z", "cache_hit": False}] * 3 + \
        [{"ts": "2026-12-04T10:00:01.000Z", "cache_hit": True}] + [{"ts": "2026-12-04T11:00:00.500Z"}] * 2
    run.usage_path.write_text("".join(_json.dumps(line) + "\n" for line in lines) + "{cut sho")
    assert run.paid_calls() == 5 and run.paid_calls(since="2026-12-04T11:00:00.000Z") == 2
    summary = {"run_dir": str(run.path)}
    assert attempt_line(summary, "2026-12-04T11:00:00.000Z") == (
        "of the 5 model calls, 2 were made by this attempt and 3 by earlier ones")
    assert attempt_line(summary, "2026-12-04T09:00:00.000Z") is None  # one attempt: nothing to separate

    from skillopt.core.config import load_config
    from skillopt.core.records import StepRecord
    from skillopt.run.runs import config_hash

    loaded = load_config("demo", env={})
    digest = config_hash(loaded.config)
    with caplog.at_level(logging.INFO, logger="skillopt.progress"):
        first = RunDir.open(tmp_path / "runs", "r1", loaded.config, config_hash=digest, provenance={})
        first.usage_path.write_text("".join(_json.dumps(line) + "\n" for line in lines))
        first.record_step(StepRecord(step=1, epoch=1, step_in_epoch=1, budget=4, decision="reject",
                                     current_score=0.5, best_score=0.5))
        RunDir.open(tmp_path / "runs", "r1", loaded.config, config_hash=digest, provenance={})
        refreshing = load_config("demo", overrides=["run.refresh_cache=true"], env={}).config  # same hash
        RunDir.open(tmp_path / "runs", "r1", refreshing, config_hash=digest, provenance={})
    assert "resuming r1: 5 calls from the cache" in caplog.messages
    assert ("resuming r1: 5 calls from the cache, its own (--no-cache calls again only what earlier runs "
            "stored)") in caplog.messages


@pytest.mark.parametrize(("given", "message"), [("0", "0 is less than 1"), ("-3", "-3 is less than 1"),
                                                ("ten", "'ten' is not a whole number")])
def test_runs_refuses_a_count_below_one_before_asking_the_server(given, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["runs", "-n", given])
    assert stopped.value.code == 2
    assert f"argument -n/--limit: {message}" in capsys.readouterr().err


def test_runs_asks_for_more_than_a_page_a_page_at_a_time():
    from skillopt.shell.prefect_runs import PAGE, _pages

    rows = list(range(2 * PAGE + 30))
    asked: list[tuple[int, int]] = []

    def read(offset: int, count: int) -> list[int]:
        assert count <= PAGE, "a server refuses more than a page at once"
        asked.append((offset, count))
        return rows[offset:offset + count]

    assert _pages(read, 10) == rows[:10] and asked == [(0, 10)]
    asked.clear()
    assert _pages(read, 2 * PAGE + 5) == rows[:2 * PAGE + 5]
    assert asked == [(0, PAGE), (PAGE, PAGE), (2 * PAGE, 5)]
    asked.clear()
    assert _pages(read, 5 * PAGE) == rows and asked == [(0, PAGE), (PAGE, PAGE), (2 * PAGE, PAGE)]


@pytest.mark.parametrize(("given", "message"), [("70000", "70000 is not a port (1 to 65535)"),
                                                ("0", "0 is not a port (1 to 65535)"),
                                                ("http", "'http' is not a port number")])
def test_server_start_refuses_a_port_that_is_not_one(given, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["server", "start", "--port", given])
    assert stopped.value.code == 2
    assert f"argument --port: {message}" in capsys.readouterr().err


def _demo_roles(*argv: str) -> list[str]:
    from skillopt.core.config import load_config
    from skillopt.shell.cli import _build_parser, _demo_real_roles

    args = _build_parser().parse_args(["demo", *argv])
    return _demo_real_roles(load_config("demo", overrides=args.override, env={}), args)


REAL_TARGET = ("--target-backend", "openai_compatible", "-o", "model.target.base_url=http://127.0.0.1:9/v1",
               "-o", "model.target.model=m")


def test_the_demo_says_it_is_a_simulation_only_when_every_role_is_scripted():
    from skillopt.shell.cli import _demo_banner

    simulated = " ".join(_demo_banner(_demo_roles()))
    assert "a simulated run" in simulated and "no model, no key" in simulated
    real = " ".join(_demo_banner(_demo_roles(*REAL_TARGET)))
    assert "simulated" not in real and "no model" not in real
    assert "a real model as target openai_compatible/m" in real, real


def test_only_the_simulated_demo_suggests_running_it_with_a_local_model():
    from skillopt.shell.cli import _demo_next_steps

    assert any("skillopt demo --target-backend local" in line for line in _demo_next_steps(_demo_roles()))
    after_real = _demo_next_steps(_demo_roles(*REAL_TARGET))
    assert not any("skillopt demo --target-backend" in line for line in after_real)
    assert "skillopt train qa --data examples/qa/my_items.jsonl" in after_real[-1]


@pytest.mark.parametrize("error,code", [
    ("unreachable", 1),  # retryable: the run stopped after its retries; it resumes once the endpoint answers
    ("refused key", 2),  # not retryable: fix the credential first
])
def test_a_model_endpoint_failing_after_its_retries_ends_the_run_with_the_resume_hint(monkeypatch, error,
                                                                                      code):
    from skillopt.llm.errors import AuthError, ConnectionFailed
    from skillopt.shell import cli

    raised = {"unreachable": ConnectionFailed("cannot reach http://127.0.0.1:8080/v1: ConnectError",
                                              role="optimizer", backend="openai_compatible", model="m",
                                              stage="analyst", attempts=6),
              "refused key": AuthError("HTTP 401 from 127.0.0.1", role="target", backend="openai", model="m")}

    def stopped(args, out):
        raise raised[error]

    monkeypatch.setattr(cli, "_cmd_eval", stopped)
    returned, _, err = run("eval", "demo", "--skill", "initial")
    assert returned == code
    if code == 1:
        assert err == ("error: [optimizer] openai_compatible/m (stage analyst): cannot reach "
                       "http://127.0.0.1:8080/v1: ConnectError after 6 attempts; re-run the same command to "
                       "resume once it answers\n")
    else:
        assert err == "error: [target] openai/m: HTTP 401 from 127.0.0.1\n"
