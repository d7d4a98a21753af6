"""The skill registry: promotions, kept decisions, rollbacks, and a history that never loses a version."""

from __future__ import annotations

import json

import pytest

from skillopt.run.registry import (
    RegistryError,
    RegistryEvent,
    SkillRegistry,
    promotion_markdown,
    promotion_verdict,
)
from skillopt.skill.document import skill_hash


def test_promote_writes_a_version_current_md_and_a_history_line(tmp_path):
    registry = SkillRegistry(tmp_path / "skills")
    event = registry.promote("demo", "# Skill v1\n", source="manual", reason="by hand")
    folder = tmp_path / "skills" / "demo"
    assert (folder / "current.md").read_text() == "# Skill v1\n"
    assert (folder / "versions" / "0001.md").read_text() == "# Skill v1\n"
    lines = [json.loads(x) for x in (folder / "history.jsonl").read_text().splitlines()]
    assert [(x["action"], x["version"], x["previous"]) for x in lines] == [("promote", 1, None)]
    assert event.skill_sha == skill_hash("# Skill v1\n")
    current = registry.current("demo")
    assert (current.version, current.text) == (1, "# Skill v1\n")
    assert registry.benchmarks() == ["demo"]


def test_rollback_walks_the_promotion_lineage_and_keeps_every_version(tmp_path):
    registry = SkillRegistry(tmp_path)
    for n in (1, 2, 3):
        registry.promote("demo", f"# v{n}\n", source="manual", reason="test")
    assert registry.rollback("demo").version == 2
    registry.promote("demo", "# v4\n", source="manual", reason="after rollback")  # its parent is v2
    assert registry.rollback("demo").version == 2
    assert registry.rollback("demo").version == 1
    assert registry.current("demo").text == "# v1\n"
    with pytest.raises(RegistryError, match="first promoted skill"):
        registry.rollback("demo")
    assert registry.versions("demo") == [1, 2, 3, 4]
    assert [e.action for e in registry.history("demo")] == ["promote"] * 3 + ["rollback", "promote"] + [
        "rollback"
    ] * 2


def test_rollback_with_nothing_promoted_is_a_clear_error(tmp_path):
    with pytest.raises(RegistryError, match="nothing is promoted"):
        SkillRegistry(tmp_path).rollback("demo")


def _decide_against_the_initial_skill(registry: SkillRegistry, candidate: str, score: float,
                                     run_name: str | None = None) -> RegistryEvent:
    """A nightly decision for "demo" with nothing promoted yet: the initial skill "# init" scored 0.4."""
    return registry.decide("demo", candidate=candidate, candidate_score=score,
                           incumbent_sha=skill_hash("# init\n"), incumbent_score=0.4, incumbent_version=None,
                           metric="hard", source="nightly", run_name=run_name)


def test_decide_promotes_only_a_different_skill_that_scores_strictly_higher(tmp_path):
    registry = SkillRegistry(tmp_path)
    first = _decide_against_the_initial_skill(registry, "# better\n", 0.6, run_name="r1")
    assert first.action == "promote" and first.version == 1
    assert "initial skill" in first.reason and "0.6000 vs 0.4000" in first.reason
    tie = registry.decide("demo", candidate="# other\n", candidate_score=0.6, incumbent_sha=first.skill_sha,
                          incumbent_score=0.6, incumbent_version=1, metric="hard", source="nightly")
    assert tie.action == "keep" and tie.version == 1 and "does not beat the promoted version 1" in tie.reason
    assert (tie.incumbent_score, tie.candidate_score) == (0.6, 0.6)
    same = registry.decide("demo", candidate="# better\n", candidate_score=0.9, incumbent_sha=first.skill_sha,
                           incumbent_score=0.6, incumbent_version=1, metric="hard", source="nightly")
    assert same.action == "keep" and "no better skill" in same.reason
    assert registry.current("demo").text == "# better\n"
    assert len(registry.history("demo")) == 3


def test_first_nightly_run_that_does_not_beat_the_initial_skill_promotes_nothing(tmp_path):
    registry = SkillRegistry(tmp_path)
    event = _decide_against_the_initial_skill(registry, "# worse\n", 0.2)
    assert event.action == "keep" and event.version is None
    assert registry.current("demo") is None
    assert not (tmp_path / "demo" / "current.md").exists()


def test_current_md_is_restored_from_its_version_after_a_crash(tmp_path):
    registry = SkillRegistry(tmp_path)
    registry.promote("demo", "# v1\n", source="manual", reason="test")
    (tmp_path / "demo" / "current.md").unlink()
    assert registry.current("demo").text == "# v1\n"


def test_bad_names_and_corrupt_history_name_the_problem(tmp_path):
    registry = SkillRegistry(tmp_path)
    with pytest.raises(RegistryError, match="not a benchmark name"):
        registry.current("../etc")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "history.jsonl").write_text("{not json\n")
    with pytest.raises(RegistryError, match=r"history.jsonl:1"):
        registry.history("demo")
    with pytest.raises(RegistryError, match="empty skill"):
        registry.promote("qa", "  \n", source="x.md", reason="manual")


def test_promotion_markdown_shows_decision_and_scores():
    verdict = promotion_verdict(candidate_score=0.75, incumbent_score=0.5, candidate_sha="b" * 64,
                                incumbent_sha="a" * 64, incumbent_version=3, metric="hard")
    assert verdict.promote and "promoted version 3" in verdict.reason
    registry_event = RegistryEvent(
        benchmark="demo",
        action="promote",
        version=4,
        previous=3,
        reason=verdict.reason,
        source="nightly",
        skill_sha="b" * 64,
        candidate_sha="b" * 64,
        metric="hard",
        incumbent_score=0.5,
        candidate_score=0.75,
    )
    text = promotion_markdown(registry_event)
    assert "promoted as version 4" in text and "| 0.5000 |" in text and "| 0.7500 |" in text


def test_the_registry_stores_and_serves_skill_folders(tmp_path):
    from skills_ref.validator import validate

    from skillopt.skill.files import join_files, split_files

    registry = SkillRegistry(tmp_path / "skills")
    front = "---\nname: word-problems\ndescription: Solve word problems.\n---\n\n# Body"
    text = join_files({"SKILL.md": front, "references/rules.md": "- one rule"}) + "\n"
    registry.promote("demo", text, carried={"assets/logo.png": b"\x89PNG\0"}, source="test", reason="r")
    current = registry.current("demo")
    assert current is not None and current.text == text
    folder = tmp_path / "skills" / "demo" / "current" / "word-problems"
    assert current.folder == str(folder) and validate(folder) == []
    assert (folder / "references" / "rules.md").read_text() == "- one rule\n"
    assert (folder / "assets" / "logo.png").read_bytes() == b"\x89PNG\0"
    # A single-file version is served as a folder named after the benchmark; a rollback brings the first
    # back.
    registry.promote("demo", "# Plain skill\n", source="test", reason="r")
    plain = registry.current("demo")
    assert plain is not None and plain.folder.endswith("current/demo")
    assert validate(plain.folder) == []
    assert [p.name for p in (tmp_path / "skills" / "demo" / "current").iterdir()] == ["demo"]
    registry.rollback("demo")
    again = registry.current("demo")
    assert again is not None and again.folder == str(folder)
    assert split_files(again.text)["references/rules.md"] == "- one rule"
    assert (folder / "assets" / "logo.png").read_bytes() == b"\x89PNG\0"


def test_skills_promote_takes_a_skill_folder(tmp_path):
    import io

    from skillopt.shell.cli import main

    skill = tmp_path / "word-problems"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: word-problems\ndescription: d\n---\n\n# Body\n",
                                    encoding="utf-8")
    (skill / "references" / "rules.md").write_text("- rule\n", encoding="utf-8")
    out = io.StringIO()
    code = main(["skills", "promote", "demo", str(skill), "--skills-dir", str(tmp_path / "reg")], stdout=out,
                stderr=io.StringIO())
    assert code == 0 and "as a skill folder:" in out.getvalue()
    served = tmp_path / "reg" / "demo" / "current" / "word-problems"
    assert (served / "references" / "rules.md").read_text() == "- rule\n"


def test_a_skill_that_is_no_valid_folder_is_refused_before_anything_is_written(tmp_path):
    registry = SkillRegistry(tmp_path)
    registry.promote("demo", "# v1\n", source="manual", reason="test")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    history = (tmp_path / "demo" / "history.jsonl").read_text()
    for bad, why in [("# Notes\n\n<!-- FILE: ../../evil.md -->\npayload\n", "not a relative path inside"),
                     ("---\nname: Bad\ndescription: d\n---\nbody\n", "name 'Bad' must be lowercase")]:
        with pytest.raises(RegistryError, match=why):
            registry.promote("demo", bad, source="manual", reason="test")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "demo" / "history.jsonl").read_text() == history
    assert registry.current("demo").version == 1
