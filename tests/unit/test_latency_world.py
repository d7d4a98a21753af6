"""The benchmark's latency world (bench/latency_world.py) through skillopt's real openai_compatible client:
demo answers behind HTTP, a garbled optimizer reply repaired by the structured-call re-ask, and seeded faults
that the retry loop absorbs without changing any answer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from bench.latency_world import Faults, LatencyWorld
from skillopt.core.config import load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.llm.clients import ModelClients
from skillopt.optimizer.reflect import AnalystReply, analyst_request
from tests.fakes.demo_world import INITIAL_SKILL, items, rollout


def clients(world: LatencyWorld, tmp_path) -> ModelClients:
    overrides = ["model.judge=null", "model.retry.base=0.01", "model.retry.cap=0.05",
                 f"run.runs_dir={tmp_path / 'runs'}"]
    for role in ("target", "optimizer"):
        overrides += [f"model.{role}.backend=openai_compatible", f"model.{role}.base_url={world.base_url}",
                      f"model.{role}.model=demo-{role}", f"model.{role}.options={{}}"]
    return ModelClients.from_config(load_config("demo", overrides=overrides, env={}), env={},
                                    registry=BackendRegistry.default())


def failure_request(tmp_path) -> ChatRequest:
    rows = [row for row in rollout(items("train", tmp_path)[:6], INITIAL_SKILL) if row.failed]
    assert rows, "the initial skill should fail some demo items"
    return analyst_request(kind="failure", skill=INITIAL_SKILL, budget=4, rows=rows)


def test_optimizer_answers_validate_and_a_garbled_reply_is_repaired_by_the_reask(tmp_path):
    request = failure_request(tmp_path)
    with LatencyWorld(latency_s=0.0) as world:
        clean, _ = clients(world, tmp_path).optimizer.structured(request, AnalystReply)
        assert clean.patch.edits, "the demo analyst proposes conventions for failed items"
        assert world.counts()["analyst"]["answered"] == 1

    with LatencyWorld(latency_s=0.0, faults=Faults(garble_rate=0.99)) as world:
        repaired, response = clients(world, tmp_path).optimizer.structured(request, AnalystReply)
        counts = world.counts()["analyst"]
    assert repaired == clean
    assert (counts["garbled"], counts["reasks"], counts["answered"]) == (1, 1, 1)


def test_target_answers_survive_seeded_faults_unchanged(tmp_path):
    question = items("val", tmp_path)[0]
    request = ChatRequest(messages=[system(INITIAL_SKILL), user(str(question["question"]))], stage="rollout")
    with LatencyWorld(latency_s=0.0) as world:
        clean = clients(world, tmp_path).target.chat(request).text
    faults = Faults(rate=0.6, kinds=("500", "malformed"))
    with LatencyWorld(latency_s=0.0, faults=faults, seed=3) as world:
        answer = clients(world, tmp_path).target.chat(request)
        counts = world.counts()["rollout"]
    assert answer.text == clean
    assert answer.attempts == counts["requests"] == 1 + sum(counts["faults"].values())


def statuses(seed: int, body: dict) -> list[int]:
    found = []
    with LatencyWorld(latency_s=0.0, faults=Faults(rate=0.5, kinds=("500",)), seed=seed) as world:
        for _ in range(12):
            post = urllib.request.Request(
                f"{world.base_url}/chat/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(post, timeout=10) as response:
                    found.append(response.status)
            except urllib.error.HTTPError as error:
                found.append(error.code)
    return found


def test_fault_decisions_depend_on_the_seed_and_the_request_only():
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "Answer."}, {"role": "user", "content": "1+1?"}],
    }
    first = statuses(5, body)
    assert first == statuses(5, body)
    assert set(first) == {200, 500}
    assert statuses(6, body) != first
