"""Errors are not failures: a run whose server fails some items' rollouts with persistent HTTP 500s counts
them as error rows, keeps them out of analyst prompts and gate scores, and ends with the same decisions and
scores as a clean run on the items that answered (same seed, same config).

The demo world behind the OpenAI-compatible fake, on demo items written to a split folder. The failing items
sit in the selection and test splits (every sixth item), so the training batches of both runs are the same and
any difference could only come from how the gate and the final evaluation treat error rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.demo.world import generate_splits
from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow


def write_splits(root: Path, splits: dict[str, list[dict]]) -> Path:
    for name, rows in splits.items():
        (root / name).mkdir(parents=True)
        (root / name / "items.json").write_text(json.dumps(rows), encoding="utf-8")
    return root


def train(url: str, data: Path, run_name: str, *extra: str) -> dict:
    from skillopt.flows.train import skill_train

    overrides = [*role_overrides(url), "model.retry.base=0.01", "model.retry.cap=0.02",
                 "benchmark.split_mode=split_dir", f"benchmark.split_dir={data}",
                 "evaluation.max_error_share=0.2", *extra]
    return skill_train(benchmark="demo", overrides=overrides, run_name=run_name)


def history(summary: dict) -> list[dict]:
    return [
        json.loads(line) for line in (Path(summary["run_dir"]) / "history.jsonl").read_text().splitlines()
    ]


def test_persistent_500s_are_error_rows_and_the_run_decides_as_a_clean_run_on_the_answered_items(
        prefect_settings, in_tmp):
    splits = generate_splits(42, {"train": 24, "val": 12, "test": 24})
    failing = {split: [row for k, row in enumerate(splits[split]) if k % 6 == 2] for split in ("val", "test")}
    failing_questions = frozenset(row["question"] for rows in failing.values() for row in rows)
    failing_ids = {row["id"] for rows in failing.values() for row in rows}
    full = write_splits(in_tmp / "full", splits)
    answered = write_splits(
        in_tmp / "answered",
        {
            split: [row for row in rows if row["question"] not in failing_questions]
            for split, rows in splits.items()
        },
    )

    faulty_world = DemoWorldServer(failing=failing_questions)
    with faulty_world.server:
        faulty = train(faulty_world.server.openai_base_url, full, "faulty")
    clean_world = DemoWorldServer()
    with clean_world.server:
        clean = train(clean_world.server.openai_base_url, answered, "clean")

    # Counted apart: every gate left the failing selection items out, and the summary says so.
    steps = [r for r in history(faulty) if r["kind"] == "step"]
    gated = [r for r in steps if r["gate"] is not None]
    assert gated, "no step reached the gate"
    assert all(sorted(r["gate_error_ids"]) == sorted(row["id"] for row in failing["val"]) for r in gated)
    assert faulty["counts"]["errors"]["gate"] == len(gated) * len(failing["val"])
    assert any("error rows" in warning for warning in faulty["warnings"])
    # Never shown to analysts.
    assert not any(
        question in message for message in faulty_world.analyst_messages for question in failing_questions
    )
    # The test evaluation recorded the failing items as error rows, not as wrong answers.
    rows = [json.loads(line) for line in
            (Path(faulty["run_dir"]) / "eval" / "best_test" / "results.jsonl").read_text().splitlines()]
    assert {r["id"] for r in rows if r["phase"] == "error"} == {row["id"] for row in failing["test"]}
    # Same decisions, same skill, same scores as the clean run on the items that answered.
    assert [(r["kind"], r["decision"]) for r in history(faulty)] == [
        (r["kind"], r["decision"]) for r in history(clean)
    ]
    assert (Path(faulty["run_dir"]) / "best_skill.md").read_text() == (
        Path(clean["run_dir"]) / "best_skill.md"
    ).read_text()
    assert faulty["scores"] == clean["scores"]
    assert failing_ids.isdisjoint(item for r in steps for item in r["batch_ids"])


def test_an_item_slower_than_its_limit_is_an_error_row_not_a_zero(prefect_settings, in_tmp):
    splits = generate_splits(7, {"train": 8, "val": 8, "test": 8})
    slow_rows = [splits["test"][1], splits["val"][2]]
    world = DemoWorldServer(slow=frozenset(row["question"] for row in slow_rows), slow_s=9)
    data = write_splits(in_tmp / "data", splits)
    with world.server:
        summary = train(world.server.openai_base_url, data, "slow", "benchmark.item_timeout_s=6",
                        "model.target.timeout_s=30", "train.epochs=1", "train.batch_size=8")

    rows = [json.loads(line) for line in
            (Path(summary["run_dir"]) / "eval" / "best_test" / "results.jsonl").read_text().splitlines()]
    late = [r for r in rows if r["id"] == slow_rows[0]["id"]]
    assert late and late[0]["phase"] == "error" and late[0]["hard"] == 0
    assert "benchmark.item_timeout_s (6 s)" in late[0]["fail_reason"]
    assert all(r["phase"] == "done" for r in rows if r["id"] != slow_rows[0]["id"])
    # summary.json: the slow selection item is left out of every gate as an error, never scored
    written = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert written["counts"]["errors"]["gate"] >= 1
    steps = [r for r in history(summary) if r["kind"] == "step" and r["gate"] is not None]
    assert steps and all(slow_rows[1]["id"] in r["gate_error_ids"] for r in steps)
    assert any("error rows" in warning for warning in written["warnings"])
