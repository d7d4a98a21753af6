"""Long items learn as well as short ones: the decisive text after 10k+ characters still reaches the
optimizer.

The demo world behind the OpenAI-compatible fake, in its ``evidence_in_reply`` variant: the optimizer learns a
convention only from the ``Conventions:`` self-check line at the *end* of the target's reply (the evaluation
event's copy is struck from what it reads). With ``reply_padding`` the reply starts with 11,000 characters of
working notes, so a minibatch of eight trajectories does not fit the optimizer's prompt whole and the renderer
must elide. Same seed, same config: the long world must end with the same decisions and scores as the short
one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow

PADDING = 11_000


def train(url: str, run_name: str) -> dict:
    from skillopt.flows.train import skill_train

    overrides = [*role_overrides(url), "model.retry.base=0.01", "train.batch_size=12"]
    return skill_train(benchmark="demo", overrides=overrides, run_name=run_name)


def step_decisions(run_dir: Path) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return [(r["kind"], r["decision"]) for r in records]


def test_items_with_the_decisive_text_after_11k_characters_learn_as_well_as_short_ones(
    prefect_settings, in_tmp
):
    results = {}
    for name, padding in (("short", 0), ("long", PADDING)):
        world = DemoWorldServer(evidence_in_reply=True, reply_padding=padding)
        with world.server:
            summary = train(world.server.openai_base_url, run_name=name)
        results[name] = (summary, world.analyst_messages)

    (short, short_messages), (long, long_messages) = results["short"], results["long"]
    # The short world learns at all (so the comparison means something) ...
    assert short["scores"]["best"]["test"]["hard"] > short["scores"]["baseline"]["test"]["hard"]
    # ... and the long world learns exactly as well: same decisions, same scores.
    assert step_decisions(Path(long["run_dir"])) == step_decisions(Path(short["run_dir"]))
    assert long["scores"] == short["scores"]
    # The long trajectories really were shortened, and their decisive tails survived.
    elided = [m for m in long_messages if re.search(r"\[… \d+ characters elided …\]", m)]
    assert elided, "no analyst prompt had to be shortened: the test does not exercise the budget"
    for message in elided:
        blocks = message.split("### Trajectory ")[1:]
        assert all(re.search(r"Conventions: [a-z_]+=(?:ok|missing)", block) for block in blocks)
    assert not any("characters elided" in m for m in short_messages)
