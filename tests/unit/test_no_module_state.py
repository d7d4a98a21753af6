"""No module-level mutable state in the model layer, and no writes to os.environ anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return (
        isinstance(value, ast.Call)
        and getattr(value.func, "id", getattr(value.func, "attr", "")) in _MUTABLE_CALLS
    )


def test_model_layer_has_no_module_level_mutable_state():
    offenders = []
    for path in sorted((ROOT / "skillopt" / "llm").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
            for target in targets:
                name = getattr(target, "id", "")
                # UPPER_CASE tables are constants by convention and never mutated after import.
                if name and not name.isupper() and _mutable(node.value):
                    offenders.append(f"{path.name}:{node.lineno} {name}")
            if isinstance(node, ast.Global):
                offenders.append(f"{path.name}:{node.lineno} global")
    assert offenders == []


def _exempt_lines(path: Path, tree: ast.Module) -> set[int]:
    """The one place that sets the environment: the preloaded process's forked child takes on the environment
    of the command it runs in place of (``skillopt.shell.preload._child``), as that command's own process has
    it."""
    if path.name != "preload.py":
        return set()
    return {line for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_child"
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}


def test_nothing_writes_to_os_environ():
    offenders = []
    for path in sorted((ROOT / "skillopt").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exempt = _exempt_lines(path, tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in exempt:
                continue
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Subscript) and "environ" in ast.unparse(target.value):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "os.environ.update", "os.environ.setdefault", "os.environ.pop", "os.putenv",
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
