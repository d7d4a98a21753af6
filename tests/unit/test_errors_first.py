"""Errors first, once, fast: `train`, `eval` and `demo` refuse a bad input before Prefect is imported.

Each command runs in one fresh interpreter (so `sys.modules` starts without Prefect); the script reports,
per command, its exit code, what it printed and whether Prefect had been imported when the error came.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QA_DATA = ROOT / "tests" / "fixtures" / "qa"

_SCRIPT = """
import io, json, sys
from skillopt.shell.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err)
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(),
                    "prefect_imported": any(m == "prefect" or m.startswith("prefect.") for m in sys.modules)})
print(json.dumps(results))
"""


def _run_in_fresh_interpreter(commands: list[list[str]], cwd: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "PREFECT_API_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bad_inputs_are_reported_in_one_line_with_exit_2_before_prefect_is_imported(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text("# a skill\n", encoding="utf-8")
    commands = {
        "typo'd key": ["demo", "-o", "train.epocs=2"],
        "missing data file": ["train", "qa", "--data", str(tmp_path / "missing.jsonl")],
        "bad split": ["eval", "demo", "--skill", str(skill), "--split", "validation"],
        "unknown --backend": ["demo", "--backend", "opnai"],
        "missing credential": ["train", "qa", "--data", str(QA_DATA), "--backend", "openai"],
    }
    results = _run_in_fresh_interpreter(list(commands.values()), tmp_path)
    expected = {
        "typo'd key": "train.epocs: unknown key",
        "missing data file": "missing.jsonl",
        "bad split": "unknown split name 'validation'",
        "unknown --backend": "--backend (or --target-backend): unknown backend 'opnai'",
        "missing credential": "no credential: export OPENAI_API_KEY",
    }
    for (case, argv), result in zip(commands.items(), results, strict=True):
        assert result["argv"] == argv
        assert result["code"] == 2, (case, result)
        lines = result["err"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, result["err"])
        assert expected[case] in lines[0], (case, lines[0])
        assert result["out"] == "", (case, result["out"])
        assert not result["prefect_imported"], f"{case}: Prefect was imported before the error"
    assert not (tmp_path / "runs").exists()  # a refused run leaves no run directory behind


def test_resuming_a_run_whose_starting_skill_has_changed_stops_before_prefect(tmp_path):
    """The run's first snapshot (skills/step_0000.md) is the skill it started from; a skill edited since
    would otherwise stop the run only when the flow wrote that snapshot again."""
    skill = tmp_path / "skill.md"
    skill.write_text("# a skill\n\n- one rule\n", encoding="utf-8")
    snapshot = tmp_path / "runs" / "r1" / "skills" / "step_0000.md"
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text("# a skill\n\n- one rule\n\n<!-- SLOW_UPDATE_START -->\n\n<!-- SLOW_UPDATE_END -->\n",
                        encoding="utf-8")  # as a run writes it: the empty block does not change the skill
    # --backend openai without its key: a run that got past this check would stop at the credential.
    argv = ["train", "qa", "--data", str(QA_DATA), "--backend", "openai", "--skill", str(skill),
            "--run-name", "r1"]
    skill.write_text("# a skill\n\n- one rule\n- and one more\n", encoding="utf-8")
    (changed,) = _run_in_fresh_interpreter([argv], tmp_path)
    assert changed["code"] == 2 and not changed["prefect_imported"], changed
    snapshot_shown = Path("runs/r1/skills/step_0000.md")
    assert changed["err"] == (f"error: --run-name r1: the run started from another skill ({snapshot_shown}); "
                              f"{skill} has changed since. Restore it to resume, or start a new run with "
                              "another --run-name\n"), changed["err"]
    skill.write_text("# a skill\n\n- one rule\n", encoding="utf-8")
    (same,) = _run_in_fresh_interpreter([argv], tmp_path)
    assert same["code"] == 2 and "no credential: export OPENAI_API_KEY" in same["err"], same


def test_a_malformed_data_file_is_reported_before_any_backend_problem(tmp_path):
    """Data first: it is what the user can fix offline. A scripted target with no rules file, an unreachable
    server and a missing credential each wait until the data reads."""
    bad = tmp_path / "items.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\nnot json\n', encoding="utf-8")
    unreachable = "http://127.0.0.1:9/v1"
    commands = {
        "scripted target without rules": ["train", "qa", "--data", str(bad), "--backend", "scripted"],
        "unreachable server": ["train", "qa", "--data", str(bad), "--backend", "openai_compatible",
                               "-o", f"model.target.base_url={unreachable}",
                               "-o", f"model.optimizer.base_url={unreachable}"],
        "missing credential": ["train", "qa", "--data", str(bad), "--backend", "openai"],
    }
    results = _run_in_fresh_interpreter(list(commands.values()), tmp_path)
    for case, result in zip(commands, results, strict=True):
        assert result["code"] == 2, (case, result)
        assert result["err"] == f"error: {bad}: line 2: malformed JSON (Expecting value at column 1)\n", \
            (case, result["err"])
    # With the data fixed, each backend problem is the one reported.
    bad.write_text("".join(f'{{"question": "q{i}", "answer": "a{i}"}}\n' for i in range(20)),
                   encoding="utf-8")
    results = _run_in_fresh_interpreter(list(commands.values()), tmp_path)
    expected = ["scripted target has no replies", "cannot reach 127.0.0.1:9",
                "no credential: export OPENAI_API_KEY"]
    for case, result, words in zip(commands, results, expected, strict=True):
        assert result["code"] == 2 and words in result["err"], (case, result["err"])


def test_a_command_line_the_parser_refuses_is_one_line_naming_the_help(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "transfer", "--skills", "initial",
                           "--bench", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("error: the following arguments are required: --targets (see `skillopt transfer "
                           "--help`)\n")


def test_the_dry_run_and_its_budget_check_never_import_prefect(tmp_path):
    results = _run_in_fresh_interpreter(
        [["train", "demo", "--dry-run", "-o", "budget.max_calls=10"]], tmp_path
    )
    assert results[0]["code"] == 0, results[0]["err"]
    assert "budget: the expected run passes budget.max_calls" in results[0]["out"]
    assert not results[0]["prefect_imported"]


def test_the_console_command_keeps_exit_codes_and_flushes_its_output(tmp_path):
    """`python -m skillopt.shell.cli` leaves through os._exit after the exit handlers: nothing printed may be
    lost."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    bad = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "demo", "-o", "train.epocs=2"],
                         cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert [line[:7] for line in bad.stderr.splitlines()] == ["error: "]
    good = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "schedule", "--steps", "300"],
                          cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert (
        len(lines) == 301 and lines[0] == "step 1: 4" and lines[-1].startswith("# cosine 4->2 over 300 steps")
    )


def test_a_benchmark_whose_prompt_shows_the_gold_is_refused_before_the_run(monkeypatch):
    """GOLD_FIELDS are the plug-in contract's promise that gold reaches the optimizer only through the
    evaluation event; a build_messages that reads one is caught on a sample item before any call."""
    from skillopt.benchmarks.base import BenchmarkSetupError
    from skillopt.benchmarks.qa import QABenchmark
    from skillopt.core.config import load_config
    from skillopt.core.data import data_overrides
    from skillopt.llm.chat import user
    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.run_checks import check_run

    loaded = load_config("qa", overrides=data_overrides(str(QA_DATA)), env={})
    check_run(loaded, cli=CliRoleOptions(backend="scripted"), env={}, probe=False)  # the shipped one is clean
    original = QABenchmark.build_messages

    def leaking(self, item, skill, cfg):
        return [*original(self, item, skill, cfg), user(f"(the answer is {item.get('answers')})")]

    monkeypatch.setattr(QABenchmark, "build_messages", leaking)
    with pytest.raises(BenchmarkSetupError, match=r"benchmark qa: its prompt shows a gold field of the item "
                                                   r"\(answers, GOLD_FIELDS\): build_messages must not "
                                                   r"read them"):
        check_run(loaded, cli=CliRoleOptions(backend="scripted"), env={}, probe=False)


def _qa_checked(monkeypatch, **patches):
    """``check_run`` on the shipped QA data with the QA plug-in's attributes replaced by ``patches``."""
    from skillopt.benchmarks.qa import QABenchmark
    from skillopt.core.config import load_config
    from skillopt.core.data import data_overrides
    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.run_checks import check_run

    for name, value in patches.items():
        monkeypatch.setattr(QABenchmark, name, value)
    loaded = load_config("qa", overrides=data_overrides(str(QA_DATA)), env={})
    check_run(loaded, cli=CliRoleOptions(backend="scripted"), env={}, probe=False)


def test_a_gold_shown_upper_cased_is_still_a_gold_shown(monkeypatch):
    from skillopt.benchmarks.base import BenchmarkSetupError
    from skillopt.benchmarks.qa import QABenchmark
    from skillopt.llm.chat import user

    original = QABenchmark.build_messages

    def hinting(self, item, skill, cfg):
        return [*original(self, item, skill, cfg), user(f"(hint: {str(item.get('answers')).upper()})")]

    with pytest.raises(BenchmarkSetupError, match=r"its prompt shows a gold field of the item \(answers"):
        _qa_checked(monkeypatch, build_messages=hinting)


def test_gold_fields_that_name_no_field_of_the_items_are_refused_not_skipped(monkeypatch):
    """A misspelt GOLD_FIELDS once turned the gold check off without a word."""
    from skillopt.benchmarks.base import BenchmarkSetupError

    with pytest.raises(BenchmarkSetupError, match=r"benchmark qa: GOLD_FIELDS \(answer\) names no field "
                                                   r"of its items \(item \S+ has .*answers.*\); name the"):
        _qa_checked(monkeypatch, GOLD_FIELDS=("answer",))


def test_build_messages_that_returns_no_list_of_messages_is_named_before_the_run(monkeypatch):
    from skillopt.core.errors import BenchmarkPluginError

    def text_only(self, item, skill, cfg):
        return f"{skill}\n{item['question']}"

    with pytest.raises(BenchmarkPluginError, match=r"benchmark qa: build_messages\(\) returned str, not a "
                                                    r"list of Message, on item \S+ — a bug in the plug-in"):
        _qa_checked(monkeypatch, build_messages=text_only)


def test_a_plug_in_whose_prompts_folder_is_missing_is_refused_before_the_run(monkeypatch, tmp_path):
    """Without its folder a run started from a blank skill with no analyst guidance, without a word (a
    non-editable install that left the prompt files out)."""
    from skillopt.benchmarks.base import BenchmarkSetupError

    missing = tmp_path / "site-packages" / "mybench" / "prompts"
    with pytest.raises(BenchmarkSetupError, match=r"benchmark qa: its prompts folder .*prompts does not "
                                                   r"exist \(Benchmark.prompts_dir\)\. Ship initial_skill"):
        _qa_checked(monkeypatch, prompts_dir=property(lambda self: missing))
    missing.mkdir(parents=True)  # an empty folder is a choice: a blank skill, no guidance
    _qa_checked(monkeypatch, prompts_dir=property(lambda self: missing))
