"""``skillopt benchmarks`` lists every shipped plug-in with its optional pip extras (issue: all eleven
public benchmarks plus ``qa`` and ``demo``)."""

from __future__ import annotations

import io
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from skillopt.benchmarks.base import ENTRY_POINT_GROUP, load_benchmark
from skillopt.shell.cli import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: The eleven public benchmarks, the bring-your-own ``qa`` and the built-in ``demo``.
SPEC_BENCHMARKS = {
    "qa",
    "demo",
    "searchqa",
    "livemathematicianbench",
    "docvqa",
    "babyvision",
    "mathverse",
    "mmrb",
    "officeqa",
    "sealqa",
    "spreadsheetbench",
    "swebench",
    "alfworld",
}


def shipped() -> dict[str, str]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return dict(project["entry-points"][ENTRY_POINT_GROUP])


def listing() -> dict[str, str]:
    out = io.StringIO()
    assert main(["benchmarks"], stdout=out, stderr=io.StringIO()) == 0
    return {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}


def test_pyproject_ships_all_thirteen_benchmarks_and_the_installed_metadata_matches():
    assert set(shipped()) == SPEC_BENCHMARKS
    installed = {entry.name: entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)}
    assert {name: installed.get(name) for name in shipped()} == shipped(), "reinstall: pip install -e ."


def test_every_shipped_benchmark_is_listed_available_with_its_extras():
    lines = listing()
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    optional = set(project["optional-dependencies"])
    for name in shipped():
        line = lines[name]
        assert "unavailable" not in line, line
        extras = load_benchmark(name).extras
        assert set(extras) <= optional, f"{name} declares extras pyproject does not define: {extras}"
        assert (f"extras: {','.join(extras)}" if extras else "no extras") in line
    assert "extras: alfworld" in lines["alfworld"] and "extras: swebench" in lines["swebench"]
    assert "needs the judge role" in lines["babyvision"] and "no judge" in lines["docvqa"]



def test_listing_lines_show_the_description_without_rest_markup():
    from skillopt.shell.cli import _one_line_summary

    assert _one_line_summary("DocVQA (``docvqa``): answers read off a page. More detail.\n\nLater.") == (
        "answers read off a page")
    assert _one_line_summary("") == ""
    long = _one_line_summary("x" * 300)
    assert len(long) == 110 and long.endswith("…")
    lines = listing()
    assert "``" not in "".join(lines.values())
    assert "pip install 'skillopt[NAME]'" in lines["an"]
