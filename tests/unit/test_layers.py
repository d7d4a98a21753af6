"""The rooms of ``skillopt/`` keep their import rules (docs/architecture.md): import-linter's contracts in
pyproject.toml hold on this tree, and the same contracts fail on a copy where a room reaches up or a library
room imports Prefect."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter comes with the dev extra")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    for folder in ("skillopt", "flows", "tasks", "deployments"):
        shutil.copytree(REPO / folder, root / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "_shipped"))
    return root


def test_the_tree_keeps_every_import_rule() -> None:
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_library_room_that_imports_prefect_breaks_a_contract(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    errors = root / "skillopt" / "core" / "errors.py"
    errors.write_text(errors.read_text(encoding="utf-8") + "\nimport prefect  # noqa\n", encoding="utf-8")
    result = lint(root)
    assert result.returncode != 0
    assert "skillopt.core is not allowed to import prefect" in result.stdout


def test_a_room_that_imports_a_room_above_it_breaks_the_layers(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    reflect = root / "skillopt" / "optimizer" / "reflect.py"
    reflect.write_text(reflect.read_text(encoding="utf-8") + "\nfrom skillopt.run import assembly  # noqa\n",
                       encoding="utf-8")
    result = lint(root)
    assert result.returncode != 0
    assert "skillopt.optimizer.reflect -> skillopt.run.assembly" in result.stdout
