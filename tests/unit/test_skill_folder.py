"""Agent Skills folders: the one-text form of a folder, edits scoped to a file, the specification checks
(held to the reference validator ``skills-ref``), loading bad folders, rendering, export and install."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from skills_ref.validator import validate, validate_metadata

from skillopt.core.gate import decide
from skillopt.llm.exec_harness import ExecTask, _write_workspace
from skillopt.optimizer.merge import edit_json
from skillopt.optimizer.reflect import AnalystReply, current_skill_section, patch_from_reply
from skillopt.run.artifacts import edits_table, skill_diff_markdown
from skillopt.run.skill_install import export_run_skill, install_run_skill
from skillopt.shell.cli import main
from skillopt.skill.diff import changed_files, file_diffs
from skillopt.skill.document import (
    Edit,
    SkillDocument,
    apply_edits,
    inject_block,
    replace_block,
    skill_hash,
    target_text,
)
from skillopt.skill.files import SKILL_MD, join_files, split_files
from skillopt.skill.folder import SkillFolderError, load_skill, skill_folder_files, write_skill_folder
from skillopt.skill.render import render_inline
from skillopt.skill.spec import SkillSpec, front_matter, metadata_problems, skill_name_from

FRONT = "---\nname: word-problems\ndescription: Solve word problems and format answers exactly.\n---\n"
SKILL = f"{FRONT}\n# Word problems\n\n- Work it out.\n- Answer in tags."
RULES = "# Rules\n\n- Write dates as YYYY-MM-DD.\n- Work it out."


def folder(root: Path, *, skill_md: str = SKILL, name: str = "word-problems", **files: str | bytes) -> Path:
    path = root / name
    (path / "references").mkdir(parents=True)
    (path / "SKILL.md").write_text(skill_md, encoding="utf-8")
    (path / "references" / "rules.md").write_text(RULES, encoding="utf-8")
    for relative, content in files.items():
        target = path / relative.replace("__", "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
    return path


def loaded_text(tmp_path: Path) -> str:
    return load_skill(folder(tmp_path), max_file_bytes=10_000).text


# ------------------------------------------------------------------------------- one text, many files


def test_a_folder_is_one_text_with_skill_md_first_and_a_marker_per_file(tmp_path):
    skill = load_skill(folder(tmp_path, assets__template__txt="Hello"), max_file_bytes=10_000)
    assert skill.name == "word-problems" and skill.front_matter
    assert split_files(skill.text) == {SKILL_MD: SKILL, "assets/template/txt": "Hello",
                                       "references/rules.md": RULES}
    assert skill.text.startswith(FRONT) and "\n\n<!-- FILE: references/rules.md -->\n# Rules" in skill.text
    assert join_files(split_files(skill.text)) + "\n" == skill.text


def test_a_single_file_skill_keeps_its_text_hash_and_edits(tmp_path):
    path = tmp_path / "my_skill.md"
    text = "# Skill\n\n- one rule\n"
    path.write_text(text, encoding="utf-8")
    skill = load_skill(path, max_file_bytes=10_000)
    assert (skill.text, skill.name, skill.front_matter) == (text, "my-skill", False)
    edits = [Edit(op="append", content="- two"), Edit(op="replace", target="one rule", content="first rule")]
    new, report = apply_edits(text, edits)
    assert new == "# Skill\n\n- first rule\n\n- two\n" and report.n_applied == 2
    assert render_inline(text) == target_text(text)
    assert render_inline(inject_block(text, "SLOW_UPDATE", "")) == target_text(text)
    assert SkillSpec(name="my-skill", front_matter=False).problem(new) is None


def test_an_edit_works_inside_the_file_it_names(tmp_path):
    text = loaded_text(tmp_path)
    # "- Work it out." is in both files: unambiguous inside each one.
    new, report = apply_edits(text, [
        Edit(op="replace", target="- Work it out.", content="- Work it out step by step.",
             file="references/rules.md"),
        Edit(op="append", content="- Round to one decimal.", file="./references/rules.md"),
        Edit(op="insert_after", target="# Word problems", content="Read the rules file first."),
    ])
    assert [e.status for e in report.entries] == ["applied"] * 3
    assert [e.file for e in report.entries] == ["references/rules.md", "references/rules.md", SKILL_MD]
    files = split_files(new)
    assert files["references/rules.md"] == RULES.replace("- Work it out.", "- Work it out step by step.") + \
        "\n\n- Round to one decimal."
    assert files[SKILL_MD] == SKILL.replace("# Word problems", "# Word problems\nRead the rules file first.")
    assert changed_files(text, new) == [SKILL_MD, "references/rules.md"]


def test_edits_never_reach_another_file_or_a_marker(tmp_path):
    text = loaded_text(tmp_path)
    new, report = apply_edits(text, [
        Edit(op="delete", target="- Write dates as YYYY-MM-DD."),  # lives in references/rules.md only
        Edit(op="append", content="- x", file="references/missing.md"),
        Edit(op="delete", target="<!-- FILE: references/rules.md -->"),
        Edit(op="append", content="<!-- FILE: evil.md -->\n- y", file="references/rules.md"),
    ])
    assert [e.status for e in report.entries] == ["skipped_target_not_found", "skipped_target_not_found",
                                                  "skipped_protected", "applied"]
    assert "no file 'references/missing.md'" in report.entries[1].detail
    assert list(split_files(new)) == [SKILL_MD, "references/rules.md"]
    assert split_files(new)["references/rules.md"].endswith("- Work it out.\n\n- y")


def test_protected_blocks_follow_the_files_and_belong_to_skill_md(tmp_path):
    text = replace_block(loaded_text(tmp_path), "APPENDIX", "Apply the rules.")
    assert text.rstrip().endswith("<!-- APPENDIX_END -->")
    new, report = apply_edits(text, [Edit(op="append", content="- z")])  # SKILL.md: before the other files
    assert split_files(SkillDocument.parse(new).body)[SKILL_MD].endswith("- Answer in tags.\n\n- z")
    assert SkillDocument.parse(new).appendix == "Apply the rules."
    files = skill_folder_files(new, name="word-problems", description="d")
    block = "<!-- APPENDIX_START -->\nApply the rules.\n<!-- APPENDIX_END -->\n"
    assert files["SKILL.md"].decode().endswith(block)
    assert b"APPENDIX" not in files["references/rules.md"]


def test_the_optimizer_sees_the_file_tree_and_file_fields_survive_replies(tmp_path):
    text = loaded_text(tmp_path)
    section = current_skill_section(text)
    assert "## Skill files\n- SKILL.md (" in section and "- references/rules.md (" in section
    assert current_skill_section("# one file") == "## Current skill\n# one file"
    reply = AnalystReply.model_validate({"diagnosis": [], "patch": {"edits": [
        {"op": "append", "content": "- a", "file": "references/rules.md"},
        {"op": "append", "content": "- b"},  # an older reply without "file": SKILL.md
    ]}})
    patch = patch_from_reply(reply, kind="failure", rows=[], budget=4)
    assert [e.file for e in patch.edits] == ["references/rules.md", SKILL_MD]
    assert list(edit_json(patch.edits[0])) == ["file", "op", "target", "content", "support_count", "source"]
    assert "file" not in edit_json(patch.edits[1])


# ------------------------------------------------------------------------------------- specification

NAMES = ["word-problems", "a", "x" * 64, "x" * 65, "Word-Problems", "-lead", "trail-", "two--hyphens",
         "under_score", "space name", "café", "数字", "", "1-2-3"]


@pytest.mark.parametrize("name", NAMES)
def test_name_rules_agree_with_the_reference_validator(name, tmp_path):
    metadata = {"name": name, "description": "Does a thing."}
    assert bool(metadata_problems(metadata, None)) == bool(validate_metadata(metadata, None))
    skill_dir = tmp_path / "word-problems"
    assert bool(metadata_problems(metadata, "word-problems")) == bool(validate_metadata(metadata, skill_dir))


@pytest.mark.parametrize("metadata", [
    {"name": "ok"}, {"name": "ok", "description": ""}, {"name": "ok", "description": "d" * 1024},
    {"name": "ok", "description": "d" * 1025}, {"name": "ok", "description": "d", "license": "MIT"},
    {"name": "ok", "description": "d", "version": "1"},
    {"name": "ok", "description": "d", "compatibility": "c" * 501},
    {"description": "d"},
])
def test_other_front_matter_rules_agree_with_the_reference_validator(metadata):
    assert bool(metadata_problems(metadata, None)) == bool(validate_metadata(metadata, None))


def test_a_candidate_that_breaks_the_front_matter_gets_a_reason(tmp_path):
    text = loaded_text(tmp_path)
    spec = SkillSpec(name="word-problems", front_matter=True)
    assert spec.problem(text) is None
    rename = Edit(op="replace", target="name: word-problems", content="name: Word Problems")
    renamed, _ = apply_edits(text, [rename])
    assert "name 'Word Problems' must be lowercase" in (spec.problem(renamed) or "")
    other, _ = apply_edits(text, [Edit(op="replace", target="name: word-problems", content="name: other")])
    assert "must match the skill's folder name 'word-problems'" in (spec.problem(other) or "")
    described = "Solve word problems and format answers exactly."
    emptied, _ = apply_edits(text, [Edit(op="replace", target=described, content="")])
    assert "description must be a non-empty string" in (spec.problem(emptied) or "")
    gone, _ = apply_edits(text, [Edit(op="delete", target=FRONT)])
    assert spec.problem(gone) == "SKILL.md lost its YAML front matter (name, description)"
    broken, _ = apply_edits(text, [Edit(op="replace", target="---\n\n# Word", content="\n\n# Word")])
    assert "never closed" in (spec.problem(broken) or "")
    # A rewrite that dropped a file's marker line lost that file.
    rewritten = text.replace("<!-- FILE: references/rules.md -->\n", "")
    assert spec.problem(rewritten) is None
    assert spec.problem(rewritten, current=text) == (
        "the update lost the file(s) references/rules.md (their marker lines are gone)")
    assert spec.problem(renamed, current=text) is not None and spec.problem(text, current=text) is None


def test_skill_names_made_from_files_are_valid():
    for raw in ("My Skill v2", "SKILL", "__", "demo", "Über_Größe", "x" * 100):
        name = skill_name_from(raw)
        assert validate_metadata({"name": name, "description": "d"}, None) == [], raw


# ----------------------------------------------------------------------------------------- bad input


def bad_folders(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    no_skill = tmp_path / "no-skill"
    no_skill.mkdir()
    outside = tmp_path / "secret.md"
    outside.write_text("secret", encoding="utf-8")
    linked = folder(tmp_path / "l")
    os.symlink(outside, linked / "references" / "secret.md")
    not_markdown = tmp_path / "summary.json"
    not_markdown.write_text('{"scores": {}}', encoding="utf-8")
    return {
        "not markdown": (not_markdown, "not a markdown file"),
        "no SKILL.md": (no_skill, "no SKILL.md in the folder"),
        "unclosed front matter": (folder(tmp_path / "u", skill_md="---\nname: x\n# body"), "never closed"),
        "bad YAML": (folder(tmp_path / "y", skill_md="---\nname: [x\n---\nbody"), "not valid YAML"),
        "no description": (folder(tmp_path / "d", skill_md="---\nname: word-problems\n---\nbody"),
                           "front matter has no description"),
        "no front matter": (folder(tmp_path / "f", skill_md="# body"), "no YAML front matter"),
        "symlink out": (linked, "a symlink out of the skill folder"),
        "too large": (folder(tmp_path / "t", references__big__md="x" * 20_001), "over the limit of 20,000"),
        "not UTF-8": (folder(tmp_path / "n", references__latin__md=b"caf\xe9 rules"),
                      "not UTF-8 text (byte 3)"),
        "marker line": (folder(tmp_path / "m", references__m__md="<!-- FILE: x.md -->"),
                        "<!-- FILE: ... -->"),
    }


def test_bad_folders_fail_with_one_line_naming_the_file(tmp_path):
    for what, (path, expected) in bad_folders(tmp_path).items():
        with pytest.raises(SkillFolderError) as caught:
            load_skill(path, max_file_bytes=20_000)
        message = str(caught.value)
        assert expected in message and "\n" not in message and str(path) in message, what


def test_binaries_and_scripts_are_carried_unchanged(tmp_path):
    path = folder(tmp_path, assets__logo__png=b"\x89PNG\0\1", scripts__run__sh="echo hi\n")
    skill = load_skill(path, max_file_bytes=20_000)
    assert skill.carried == {"assets/logo/png": b"\x89PNG\0\1", "scripts/run/sh": b"echo hi\n"}
    assert "echo hi" not in skill.text
    trained = load_skill(path, max_file_bytes=20_000, train_scripts=True)
    assert "scripts/run/sh" in split_files(trained.text) and "scripts/run/sh" not in trained.carried


@pytest.mark.parametrize("case", ["no SKILL.md", "bad YAML", "symlink out", "too large", "not UTF-8",
                                  "not markdown"])
def test_the_cli_refuses_a_bad_skill_with_exit_2_and_writes_nothing(case, tmp_path, monkeypatch):
    path, expected = bad_folders(tmp_path)[case]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out, err = io.StringIO(), io.StringIO()
    code = main(["train", "demo", "--skill", str(path), "-o", "skill.max_file_bytes=20000"], stdout=out,
                stderr=err)
    assert code == 2
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0]
    assert list(work.iterdir()) == []


# ------------------------------------------------------------------------------------ what targets see


def test_chat_targets_get_the_body_then_each_reference_file(tmp_path):
    text = replace_block(loaded_text(tmp_path), "SLOW_UPDATE", "Mind the dates.")
    rendered = render_inline(text)
    assert rendered.startswith("# Word problems\n") and "name: word-problems" not in rendered
    # The guidance belongs to SKILL.md, as in the exported folder: after its body, before the other files
    # (after the last one it would read as part of that file).
    assert ("- Answer in tags.\n\n<!-- SLOW_UPDATE_START -->\nMind the dates.\n<!-- SLOW_UPDATE_END -->\n\n"
            "## Reference file: references/rules.md\n\n# Rules\n") in rendered
    assert rendered.endswith("\n") and not rendered.endswith("\n\n")


def test_exec_targets_get_the_folder_where_their_cli_discovers_skills(tmp_path):
    text = loaded_text(tmp_path)
    root = tmp_path / "ws"
    root.mkdir()
    _write_workspace(root, ExecTask(item_id="i", skill=text, task="t"), "run", ".claude/skills")
    installed = root / ".claude" / "skills" / "word-problems"
    assert validate(installed) == []
    assert (installed / "references" / "rules.md").read_text() == RULES + "\n"
    assert "## Reference file: references/rules.md" in (root / "SKILL.md").read_text()
    single = tmp_path / "single"
    single.mkdir()
    _write_workspace(single, ExecTask(item_id="i", skill="# one", task="t"), "run", ".agents/skills")
    assert sorted(p.name for p in single.iterdir()) == ["ATTACHMENTS.md", "SKILL.md", "task.md"]


# ---------------------------------------------------------------------------- diffs, report, artifacts


def test_diffs_and_artifacts_show_the_change_per_file(tmp_path):
    text = loaded_text(tmp_path)
    edit = Edit(op="append", content="- Round to one decimal.", file="references/rules.md")
    new, report = apply_edits(text, [edit])
    diffs = file_diffs(text, new)
    assert list(diffs) == ["references/rules.md"]
    assert "+- Round to one decimal." in diffs["references/rules.md"]
    rows = [{"id": "a", "hard": 1.0, "soft": 1.0}]
    gate = decide(rows, rows, current_score=0.5, best_score=0.5, metric="hard", use_gate=False)
    markdown = skill_diff_markdown(3, text, new, gate)
    assert "Files changed: `references/rules.md`" in markdown and "#### references/rules.md" in markdown
    assert "#### SKILL.md" not in markdown
    assert edits_table([edit], report, "accept")[0]["file"] == "references/rules.md"
    single = skill_diff_markdown(3, "# a\n", "# a\n- b\n", gate)
    assert "####" not in single and "+- b" in single


# ------------------------------------------------------------------------------------ export, install


def run_dir_of(tmp_path: Path, text: str, source: dict | None,
               carried: dict[str, bytes] | None = None) -> Path:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "best_skill.md").write_text(text, encoding="utf-8")
    (run / "config.yaml").write_text("benchmark:\n  name: demo\n", encoding="utf-8")
    if source is not None:
        (run / "skill.json").write_text(json.dumps(source), encoding="utf-8")
    for relative, data in (carried or {}).items():
        (run / "skill_carried" / relative).parent.mkdir(parents=True, exist_ok=True)
        (run / "skill_carried" / relative).write_bytes(data)
    return run


def test_export_writes_a_valid_folder_for_a_folder_run_and_a_single_file_run(tmp_path):
    folder_run = run_dir_of(tmp_path / "a", inject_block(loaded_text(tmp_path), "SLOW_UPDATE", ""),
                            {"name": "word-problems", "description": "x", "front_matter": True},
                            {"scripts/run.sh": b"echo\n"})
    out = export_run_skill(folder_run, tmp_path / "out")
    assert out == tmp_path / "out" / "word-problems" and validate(out) == []
    assert (out / "scripts" / "run.sh").read_bytes() == b"echo\n"
    assert "SLOW_UPDATE" not in (out / "SKILL.md").read_text()  # an empty block is not written
    # A run written before skill.json existed: named after its benchmark.
    single_run = run_dir_of(tmp_path / "b", "# Word problems\n\n- rule\n", None)
    out = export_run_skill(single_run, tmp_path / "out")
    assert out.name == "demo" and validate(out) == []
    metadata, body = front_matter((out / "SKILL.md").read_text())
    assert metadata == {"name": "demo", "description": "How to solve demo tasks (trained by skillopt)."}
    assert body == "# Word problems\n\n- rule\n"


def test_install_puts_the_folder_where_the_agent_reads_and_refuses_to_clobber(tmp_path):
    run = run_dir_of(tmp_path, loaded_text(tmp_path), None)
    project = tmp_path / "P"
    project.mkdir()
    out, err = io.StringIO(), io.StringIO()
    assert main(["skill", "install", str(run), "--agent", "claude-code", "--project", str(project)],
                stdout=out, stderr=err) == 0
    assert (project / ".claude" / "skills" / "word-problems" / "SKILL.md").is_file()
    assert install_run_skill(run, "claude-code", project=project) == project / ".claude/skills/word-problems"
    (project / ".claude" / "skills" / "word-problems" / "SKILL.md").write_text("mine", encoding="utf-8")
    assert main(["skill", "install", str(run), "--agent", "claude-code", "--project", str(project)],
                stdout=out, stderr=(err := io.StringIO())) == 2
    assert "holds a different skill; pass --force" in err.getvalue()
    assert (project / ".claude" / "skills" / "word-problems" / "SKILL.md").read_text() == "mine"
    home = tmp_path / "home"  # what --global does, with the home folder moved here
    assert install_run_skill(run, "codex", home=home) == home / ".agents" / "skills" / "word-problems"
    assert validate(home / ".agents" / "skills" / "word-problems") == []


def test_writing_a_folder_never_leaves_half_of_it(tmp_path):
    dest = tmp_path / "skill"
    write_skill_folder({"SKILL.md": b"a"}, dest)
    with pytest.raises(SkillFolderError):
        write_skill_folder({"SKILL.md": b"b", "../escape.md": b"x"}, dest, replace=True)
    assert (dest / "SKILL.md").read_bytes() == b"a" and not (tmp_path / "escape.md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skill"]


def test_the_hash_of_a_folder_skill_covers_every_file(tmp_path):
    text = loaded_text(tmp_path)
    new, _ = apply_edits(text, [Edit(op="append", content="- more", file="references/rules.md")])
    assert skill_hash(new) != skill_hash(text)


def test_deployments_take_a_skill_parameter(tmp_path, monkeypatch):
    from skillopt.deployments.serve import run_defaults
    from skillopt.flows.naming import config_overrides

    monkeypatch.chdir(tmp_path)
    defaults = run_defaults(mode="train", skill="skills/word-problems")
    assert defaults.parameters("demo")["skill"] == str(tmp_path / "skills" / "word-problems")
    assert "skill" not in run_defaults(mode="train").parameters("demo")
    assert config_overrides(None, ["train.epochs=1"], "s/w") == ["train.skill_init=s/w", "train.epochs=1"]


def test_progressive_rendering_is_refused_with_a_clear_config_error():
    from skillopt.core.config import load_config
    from skillopt.core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config("demo", overrides=["skill.render=progressive"], env={})
    assert "skill.render" in str(caught.value) and "use skill.render: inline" in str(caught.value)
    assert load_config("demo", overrides=["skill.render=inline"], env={}).config.skill.render == "inline"


def test_export_names_a_missing_run_directory_and_a_run_without_a_best_skill(tmp_path):
    with pytest.raises(SkillFolderError, match=r"nothere: no such run directory$"):
        export_run_skill(tmp_path / "nothere", tmp_path / "out")
    (tmp_path / "early").mkdir()
    with pytest.raises(SkillFolderError, match=r"early: no best_skill.md \(not a skillopt run directory"):
        export_run_skill(tmp_path / "early", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the same checks wherever a skill is read


def test_skill_md_of_a_folder_with_references_is_refused_alone(tmp_path):
    """Given as ``folder/SKILL.md``, the folder's other files would drop out of training unseen."""
    skill = folder(tmp_path)
    with pytest.raises(SkillFolderError, match=r"SKILL.md: its folder holds the skill's references/ too: "
                                                r"give the folder \(.*word-problems\) to train every file"):
        load_skill(skill / "SKILL.md", max_file_bytes=10_000)
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "SKILL.md").write_text(SKILL.replace("word-problems", "lone"), encoding="utf-8")
    assert load_skill(lone / "SKILL.md", max_file_bytes=10_000).name == "lone"


def test_eval_reads_a_skill_as_training_does(tmp_path):
    from skillopt.core.config import SkillSection
    from skillopt.run.skill_source import SkillSourceError, read_skill

    bad = tmp_path / "bad.md"
    bad.write_text("---\nname: Bad\ndescription: d\n---\nbody\n", encoding="utf-8")
    with pytest.raises(SkillSourceError, match="name 'Bad' must be lowercase"):
        read_skill(str(bad))
    # A run's skill text holds file markers; one naming a path outside the folder is refused.
    escaping = tmp_path / "escaping.md"
    escaping.write_text("# Notes\n\n<!-- FILE: ../../evil.md -->\npayload\n", encoding="utf-8")
    with pytest.raises(SkillSourceError, match=r"'\.\./\.\./evil\.md': not a relative path inside"):
        read_skill(str(escaping))
    run_text = tmp_path / "best_skill.md"
    run_text.write_text(loaded_text(tmp_path), encoding="utf-8")
    assert "<!-- FILE: references/rules.md -->" in read_skill(str(run_text)).text
    # The run's skill settings apply: the size limit, and scripts/ trained or carried.
    skill = folder(tmp_path / "s", **{"scripts__run.py": "print('hi')\n", "references__big.md": "x" * 20_000})
    assert read_skill(str(skill), settings=SkillSection(max_file_bytes=30_000)).text.count("print('hi')") == 0
    trained = read_skill(str(skill), settings=SkillSection(max_file_bytes=30_000, train_scripts=True))
    assert "<!-- FILE: scripts/run.py -->" in trained.text
    with pytest.raises(SkillSourceError, match=r"big.md: 20,000 bytes, over the limit of 10,000"):
        read_skill(str(skill), settings=SkillSection(max_file_bytes=10_000))


def test_export_refuses_an_invalid_skill_and_a_run_missing_a_carried_file(tmp_path):
    good = loaded_text(tmp_path)
    text = good.replace("name: word-problems", "name: Bad Name")
    with pytest.raises(SkillFolderError, match=r"SKILL.md: front matter: name 'Bad Name'"):
        export_run_skill(run_dir_of(tmp_path / "a", text, None), tmp_path / "out")
    run = run_dir_of(tmp_path / "b", good, {"name": "word-problems", "description": "x",
                                                             "front_matter": True,
                                                             "carried": ["assets/logo.png"]})
    with pytest.raises(SkillFolderError, match=r"skill_carried: the skill carries assets/logo.png, missing"):
        export_run_skill(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_onto_a_file_is_one_line_and_folders_get_ordinary_modes(tmp_path):
    run = run_dir_of(tmp_path, loaded_text(tmp_path), None, {"scripts/run.sh": b"#!/bin/sh\necho\n",
                                                             "assets/logo.png": b"\x89PNG\0"})
    (tmp_path / "afile").write_text("y", encoding="utf-8")
    err = io.StringIO()
    assert main(["skill", "export", str(run), "--to", str(tmp_path / "afile")], stdout=io.StringIO(),
                stderr=err) == 2
    assert err.getvalue().count("\n") == 1 and "afile: cannot write the skill folder there" in err.getvalue()
    previous = os.umask(0o022)
    try:
        out = export_run_skill(run, tmp_path / "out")
    finally:
        os.umask(previous)
    mode = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert mode["."] == 0o755 and mode["scripts"] == 0o755  # readable by the agent's other users
    assert mode["scripts/run.sh"] == 0o755 and mode["assets/logo.png"] == 0o644 and mode["SKILL.md"] == 0o644
