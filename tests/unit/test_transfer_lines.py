"""What ``skillopt transfer`` prints: the matrix's shape in the right number, one line per cell, the files."""

from __future__ import annotations

from skillopt.shell.decision_cli import transfer_lines


def _result(skills: list[str], targets: list[str], benchmarks: list[str]) -> dict:
    cells = [{"benchmark": b, "target": t, "skill": s, "score": 0.5, "n": 4, "usd_per_item": None}
             for b in benchmarks for t in targets for s in skills]
    return {"split": "test", "skills": skills, "targets": targets, "benchmarks": benchmarks, "cells": cells,
            "run_dir": "runs/demo-transfer"}


def test_one_of_each_is_singular_and_more_are_plural():
    assert transfer_lines(_result(["a"], ["t"], ["demo"]))[0] == (
        "transfer matrix (test split): 1 skill x 1 target x 1 benchmark")
    lines = transfer_lines(_result(["initial", "runs/cc"], ["scripted_a", "scripted_b"], ["demo"]))
    assert lines[0] == "transfer matrix (test split): 2 skills x 2 targets x 1 benchmark"
    assert len(lines) == 1 + 4 + 2 and all("cost unknown" in line for line in lines[1:5])
    assert lines[-2:] == ["matrix.json: runs/demo-transfer/matrix.json",
                          "heatmap: runs/demo-transfer/matrix.html"]


def test_scores_line_up_whatever_the_length_of_a_skill_name():
    long_name = "runs/demo-20261207-133536-8fd8e3"
    lines = transfer_lines(_result(["initial", long_name], ["scripted_a", "b"], ["demo"]))[1:5]
    assert len({line.index("0.500 (n=4)") for line in lines}) == 1, lines
    assert all(long_name in line for line in lines[1::2])
