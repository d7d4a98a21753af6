"""flows/, tasks/ and deployments/ are imported only as skillopt.flows, skillopt.tasks and
skillopt.deployments. A checkout also has the repository root on sys.path, where `import flows.train`
would still work and load a second copy of the module; an installed wheel has no such package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOW_LAYER = ("flows", "tasks", "deployments")
SOURCE_FOLDERS = ("skillopt", *FLOW_LAYER, "tests", "bench", "scripts")


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


def test_the_flow_layer_is_imported_under_the_skillopt_namespace():
    offenders = []
    for folder in SOURCE_FOLDERS:
        # rglob does not descend into the skillopt/flows etc. symlinks, so each file is read once.
        for path in sorted((ROOT / folder).rglob("*.py")):
            for lineno, name in _imported_names(ast.parse(path.read_text(encoding="utf-8"))):
                if name.split(".")[0] in FLOW_LAYER:
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    assert offenders == []


def test_skillopt_links_each_flow_layer_folder():
    for layer in FLOW_LAYER:
        link = ROOT / "skillopt" / layer
        assert link.is_symlink() and link.resolve() == (ROOT / layer).resolve(), link
