"""Each text benchmark's fixture items rolled out through the real `openai` SDK against the loopback
OpenAI-compatible fake, which answers with the plug-in's own scripted target behind real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from skillopt.benchmarks.base import benchmark_config, load_benchmark
from skillopt.benchmarks.runner import run_item
from skillopt.config import load_config
from skillopt.llm.base import BackendContext, BackendRegistry
from skillopt.llm.chat import ChatRequest, assistant, system, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set
from tests.fakes.http_fakes import ok

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXT_BENCHMARKS = ["qa", "searchqa", "livemathematicianbench", "sealqa", "officeqa", "spreadsheetbench"]


def scripted_reply_server(openai_server, benchmark):
    """The fake answers each chat completion with the benchmark's scripted target."""
    rules = resolve_rule_set(None, BackendContext(scripted_target_rules=tuple(benchmark.scripted_rules)),
                             where="test")
    backend = ScriptedBackend(rules, role="target")
    builders = {"system": system, "user": user, "assistant": assistant}

    def reply(request):
        messages = [builders[m["role"]](m["content"]) for m in request.body["messages"]]
        answer = backend.attempt(ChatRequest(messages=messages, stage="rollout"), timeout_s=30)
        return ok(text=answer.text)

    openai_server.handler = reply


@pytest.mark.parametrize("name", TEXT_BENCHMARKS)
def test_fixture_items_roll_out_through_the_openai_sdk(name, openai_server, tmp_path):
    benchmark = load_benchmark(name)
    scripted_reply_server(openai_server, benchmark)
    overrides = [f"benchmark.split_dir={FIXTURES / name}", "benchmark.split_mode=split_dir",
                 "model.target.backend=openai_compatible", f"model.target.base_url={openai_server.openai_base_url}",
                 "model.target.model=fixture-model", "model.judge.backend=scripted"]
    loaded = load_config(name, overrides=overrides, env={})
    cfg = benchmark_config(benchmark, loaded.config.benchmark)
    clients = ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())
    judge = None
    if benchmark.needs_judge(cfg):
        judge_client = clients.get("judge")

        def judge(item, prediction):
            from tasks.rollout import JudgeVerdict

            verdict, _ = judge_client.structured(benchmark.judge_request(item, prediction), JudgeVerdict)
            return verdict.verdict == "correct", verdict.reason

    rows = []
    for split in ("train", "val", "test"):
        for item in benchmark.load_split(cfg, split, run_dir=tmp_path):
            rows.append(run_item(benchmark, item, "", cfg, target=clients.target, judge=judge))
    assert openai_server.calls("/v1/chat/completions") >= len(rows) == 3
    assert all(row.answered and row.trajectory[-1]["type"] == "evaluation" for row in rows)
    solved = [row for row in rows if row.hard == 1.0]
    assert 0 < len(solved) < len(rows), [(r.id, r.fail_reason) for r in rows]
