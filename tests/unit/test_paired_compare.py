"""The paired comparison of two skills (``skillopt.core.paired``), skill references
(``skillopt.run.skill_source``) and
``skillopt compare``'s bad input, which stops with one line and exit 2 before any model call."""

from __future__ import annotations

from io import StringIO

import pytest

from skillopt.core.gate import sign_test_p_value
from skillopt.core.paired import bootstrap_interval, compare_rows, per_item_cost
from skillopt.core.records import ItemResult
from skillopt.run.skill_source import SkillSourceError, read_skill
from skillopt.shell.cli import main


def rows(values: dict[str, float], *, errors: tuple[str, ...] = (),
         usage: dict | None = None) -> list[ItemResult]:
    return [ItemResult(id=item, task_type="t", hard=value, soft=value, usage=usage or {},
                       phase="error" if item in errors else "done") for item, value in values.items()]


def side(label: str, items: list[ItemResult]) -> dict:
    return {"label": label, "origin": label, "sha": label * 12, "skill_tokens": 10,
            "per_item": per_item_cost(items)}


def compare(a: list[ItemResult], b: list[ItemResult], **options):
    return compare_rows(a, b, benchmark="demo", split="test", a=side("a", a), b=side("b", b), **options)


def test_a_skill_compared_with_itself_differs_by_zero_with_p_one():
    same = rows({f"i{n}": float(n % 2) for n in range(20)})
    result = compare(same, same)
    assert result.difference == 0.0
    assert (result.ci_low, result.ci_high) == (0.0, 0.0)
    assert result.p_value == 1.0 and result.method == "sign"
    assert result.flips.improved == [] and result.flips.regressed == [] and result.flips.unchanged == 20
    graded = rows({f"i{n}": n / 20 for n in range(20)})
    result = compare(graded, graded)
    assert result.difference == 0.0 and result.p_value == 1.0 and result.method == "bootstrap"


def test_flips_difference_interval_and_the_gate_sign_test():
    a = rows({f"i{n}": 0.0 for n in range(10)})
    b = rows({f"i{n}": 1.0 if n < 8 else 0.0 for n in range(10)})
    result = compare(a, b)
    assert result.difference == pytest.approx(0.8)
    assert result.flips.improved == [f"i{n}" for n in range(8)] and result.flips.regressed == []
    # Two-sided: twice the gate's one-sided sign test (2 * 2**-8); the one-sided p for B better is the gate's.
    assert result.p_b_better == sign_test_p_value(8, 0)
    assert result.p_value == pytest.approx(2 * 0.5**8)
    assert 0.5 <= result.ci_low < 0.8 < result.ci_high <= 1.0
    swapped = compare(b, a)
    assert swapped.difference == pytest.approx(-0.8) and swapped.p_value == result.p_value
    assert swapped.flips.regressed == result.flips.improved
    assert "B is better" in result.verdict() and "A is better" in swapped.verdict()


def test_error_rows_are_left_out_on_both_sides():
    a = rows({"x": 1.0, "y": 0.0, "z": 0.0})
    b = rows({"x": 0.0, "y": 1.0, "z": 1.0}, errors=("x",))
    result = compare(a, b)
    assert result.excluded == ["x"] and result.n == 2 and result.difference == 1.0


def test_interval_is_seeded_and_covers_the_mean():
    differences = [0.1, -0.2, 0.4, 0.0, 0.3, 0.25, -0.05, 0.15]
    first = bootstrap_interval(differences, seed=3)
    assert first == bootstrap_interval(differences, seed=3)
    assert first[0] < sum(differences) / len(differences) < first[1]


def test_cost_per_item_comes_from_the_rows_usage():
    usage = {"calls": 2, "prompt_tokens": 100, "completion_tokens": 20, "usd": 0.002}
    cost = per_item_cost(rows({"a": 1.0, "b": 0.0}, usage=usage) + rows({"c": 1.0}))
    assert (cost.tokens, cost.calls, cost.usd, cost.measured) == (120.0, 2.0, 0.002, 2)
    unpriced = per_item_cost(rows({"a": 1.0}, usage={**usage, "usd": None}))
    assert unpriced.usd is None


def test_skill_references(tmp_path):
    (tmp_path / "plain.md").write_text("- Answer in km.\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "best_skill.md").write_text("- best\n", encoding="utf-8")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: x\ndescription: y\n---\n- rule\n", encoding="utf-8")
    assert read_skill(str(tmp_path / "plain.md")).text == "- Answer in km.\n"
    assert read_skill(str(run)).text == "- best\n"
    assert read_skill(str(folder)).text.endswith("- rule\n")
    assert read_skill("initial", initial="- start\n").origin == "the benchmark's initial skill"

    from skillopt.run.registry import SkillRegistry

    registry = SkillRegistry(tmp_path / "skills")
    registry.promote("demo", "- one\n", source="a", reason="r")
    registry.promote("demo", "- two\n", source="b", reason="r")
    assert read_skill("registry:demo@1", skills_dir=tmp_path / "skills").text == "- one\n"
    assert read_skill("registry:", skills_dir=tmp_path / "skills", benchmark="demo").text == "- two\n"
    with pytest.raises(SkillSourceError, match="no version 7"):
        read_skill("registry:demo@7", skills_dir=tmp_path / "skills")
    with pytest.raises(SkillSourceError, match="no such file"):
        read_skill(str(tmp_path / "missing.md"))
    (tmp_path / "broken.md").write_text("- a\n<!-- APPENDIX_START -->\nnotes\n", encoding="utf-8")
    with pytest.raises(SkillSourceError, match="does not parse"):
        read_skill(str(tmp_path / "broken.md"))
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SkillSourceError, match="not UTF-8"):
        read_skill(str(tmp_path / "binary.md"))


@pytest.fixture
def no_model_calls(monkeypatch):
    """Any flow start fails the test: bad input must stop before Prefect and before any call."""
    import skillopt.shell.cli

    def refuse(*args, **kwargs):
        raise AssertionError("a flow started on bad input")

    monkeypatch.setattr(skillopt.shell.cli, "_run_flow", refuse)


@pytest.mark.parametrize(("argv", "message"), [
    (["compare", "initial", "{broken}", "demo"], "does not parse"),
    (["compare", "initial", "{missing}", "demo"], "no such file or folder"),
    (["compare", "initial", "{json}", "demo"], "not a markdown file"),
    (["eval", "demo", "--skill", "{json}"], "not a markdown file"),
    (["compare", "initial", "initial", "demo", "--target", "gpt9"], "unknown model config 'gpt9'"),
    (["compare", "initial", "initial", "nosuchbench"], "unknown benchmark 'nosuchbench'"),
    (["compare", "initial", "initial", "qa", "--backend", "scripted", "-o",
      "model.target.options.rules=demo"], "needs data_path"),
    (["compare", "initial", "initial", "qa", "--data", "{missing}"], "--data: nothing at"),
    (["transfer", "--skills", "initial", "--targets", "scripted_a", "nope", "--bench", "demo"],
     "unknown model config 'nope'"),
    (["transfer", "--skills", "initial", "{broken}", "--targets", "scripted_a", "--bench", "demo"],
     "does not parse"),
    (["transfer", "--skills", "initial", "--targets", "scripted_a", "--bench", "qa"],
     "model config 'scripted_a'"),
    (["compare", "only-one"], "expected SKILL_A SKILL_B BENCHMARK"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_call(argv, message, tmp_path, monkeypatch, capsys,
                                                          no_model_calls):
    monkeypatch.chdir(tmp_path)
    broken = "<!-- APPENDIX_END -->\n- a\n<!-- APPENDIX_START -->\n"
    (tmp_path / "broken.md").write_text(broken, encoding="utf-8")
    (tmp_path / "summary.json").write_text('{"scores": {}}', encoding="utf-8")
    argv = [arg.replace("{broken}", str(tmp_path / "broken.md")).replace("{missing}", str(tmp_path / "no.md"))
            .replace("{json}", str(tmp_path / "summary.json")) for arg in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_run_directories_alone_still_compare_runs(tmp_path, capsys):
    from tests.unit.test_report import make_run

    first, second = make_run(tmp_path, "one"), make_run(tmp_path, "two")
    out = tmp_path / "page.html"
    assert main(["compare", str(first), str(second), "--out", str(out)]) == 0
    assert main(["compare", "--runs", str(first), str(second), "--out", str(tmp_path / "b.html")]) == 0
    assert "2 runs compared" in out.read_text() and (tmp_path / "b.html").is_file()
    # The options of a paired comparison mean nothing to the runs page: said, not ignored.
    err = StringIO()
    assert main(["compare", "--runs", str(first), str(second), "--split", "val", "-o", "foo=1"],
                stdout=StringIO(), stderr=err) == 2
    assert err.getvalue() == ("error: skillopt compare --runs: --split, -o apply to a paired comparison "
                              "(SKILL_A SKILL_B BENCHMARK); the runs page reads only the run directories\n")


def test_compare_and_transfer_refuse_bad_input_before_prefect_is_imported(tmp_path):
    from tests.unit.test_errors_first import _run_in_fresh_interpreter

    (tmp_path / "broken.md").write_text("- a\n<!-- APPENDIX_START -->\n", encoding="utf-8")
    results = _run_in_fresh_interpreter([
        ["compare", "initial", "broken.md", "demo"],
        ["compare", "initial", "initial", "demo", "--target", "nope"],
        ["transfer", "--skills", "initial", "--targets", "scripted_a", "--bench", "qa"],
        ["eval", "demo", "--skill", "broken.md"],
    ], tmp_path)
    for result in results:
        assert result["code"] == 2 and len(result["err"].strip().splitlines()) == 1, result
        assert not result["prefect_imported"], result["argv"]
    assert results[1]["err"].startswith("error: --target: unknown model config 'nope'"), results[1]["err"]
