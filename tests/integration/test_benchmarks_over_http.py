"""Each text benchmark's fixture items rolled out through the real `openai` SDK against the loopback
OpenAI-compatible fake, which answers with the plug-in's own scripted target behind real HTTP."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from skillopt.benchmarks.base import benchmark_config, load_benchmark
from skillopt.benchmarks.runner import run_item
from skillopt.core.config import load_config
from skillopt.llm.base import BackendContext, BackendRegistry
from skillopt.llm.chat import ChatRequest, ImagePart, TextPart, assistant, system, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set
from tests.fakes.benchmark_target import fixture_rules
from tests.fakes.http_fakes import ok

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXT_BENCHMARKS = ["qa", "searchqa", "livemathematicianbench", "sealqa", "officeqa", "spreadsheetbench"]


def scripted_reply_server(openai_server, benchmark):
    """The fake answers each chat completion with the benchmark's scripted target."""
    rules = resolve_rule_set(None, BackendContext(scripted_target_rules=fixture_rules(benchmark)),
                             where="test")
    backend = ScriptedBackend(rules, role="target")
    builders = {"system": system, "user": user, "assistant": assistant}

    def reply(request):
        messages = [builders[m["role"]](wire_content(m["content"])) for m in request.body["messages"]]
        answer = backend.attempt(ChatRequest(messages=messages, stage="rollout"), timeout_s=30)
        return ok(text=answer.text)

    openai_server.handler = reply


def wire_content(content):
    """Chat Completions content back into chat parts: text as is, an ``image_url`` data URI as an image."""
    if isinstance(content, str):
        return content
    return [
        TextPart(text=part["text"]) if part["type"] == "text" else ImagePart(source=part["image_url"]["url"])
        for part in content
    ]


@pytest.mark.parametrize("name", TEXT_BENCHMARKS)
def test_fixture_items_roll_out_through_the_openai_sdk(name, openai_server, tmp_path):
    benchmark = load_benchmark(name)
    scripted_reply_server(openai_server, benchmark)
    overrides = [
        f"benchmark.split_dir={FIXTURES / name}",
        "benchmark.split_mode=split_dir",
        "model.target.backend=openai_compatible",
        f"model.target.base_url={openai_server.openai_base_url}",
        "model.target.model=fixture-model",
        "model.judge.backend=scripted",
    ]
    loaded = load_config(name, overrides=overrides, env={})
    cfg = benchmark_config(benchmark, loaded.config.benchmark)
    clients = ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())
    judge = None
    if benchmark.needs_judge(cfg):
        judge_client = clients.get("judge")

        def judge(item, prediction):
            from skillopt.run.rollouts import JudgeVerdict

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


# ------------------------------------------------------------------------------------------ images

IMAGE_BENCHMARKS = ["docvqa", "babyvision", "mathverse", "mmrb"]


def fixture_rollouts(name, target_overrides, env, tmp_path):
    """Every fixture item of ``name`` rolled out with the scripted judge and the given target role."""
    from tests.fakes.benchmark_target import scripted_judge_of

    benchmark = load_benchmark(name)
    overrides = [f"benchmark.split_dir={FIXTURES / name}", "benchmark.split_mode=split_dir",
                 f"benchmark.data_root={FIXTURES / name}", *target_overrides]
    loaded = load_config(name, overrides=overrides, env=env)
    cfg = benchmark_config(benchmark, loaded.config.benchmark)
    clients = ModelClients.from_config(loaded, env=env, registry=BackendRegistry.default())
    judge = scripted_judge_of(benchmark) if benchmark.needs_judge(cfg) else None
    items = [
        item
        for split in ("train", "val", "test")
        for item in benchmark.load_split(cfg, split, run_dir=tmp_path)
    ]
    rows = [run_item(benchmark, item, "", cfg, target=clients.target, judge=judge) for item in items]
    return items, rows


def item_images_b64(item):
    paths = item.get("image_paths") or [item["image_path"]]
    return [base64.b64encode(Path(path).read_bytes()).decode("ascii") for path in paths]


@pytest.mark.parametrize("name", IMAGE_BENCHMARKS)
def test_images_reach_the_openai_compatible_fake_as_data_uri_image_parts(name, openai_server, tmp_path):
    scripted_reply_server(openai_server, load_benchmark(name))
    target = [
        "model.target.backend=openai_compatible",
        f"model.target.base_url={openai_server.openai_base_url}",
        "model.target.model=fixture-vl-model",
    ]
    items, rows = fixture_rollouts(name, target, {}, tmp_path)
    requests = openai_server.requests_for("/v1/chat/completions")
    assert len(requests) == len(items) >= 3  # every fixture item, once
    for item, request in zip(items, requests, strict=True):
        images = request.images
        assert [image["data"] for image in images] == item_images_b64(item)  # the file's bytes, in order
        assert all(image["url"].startswith("data:image/png;base64,") for image in images)
        assert not any(image["detail_sent"] for image in images)  # image_detail auto sends no detail
    solved = [row for row in rows if row.hard == 1.0]
    assert all(row.answered for row in rows) and 0 < len(solved) < len(rows)


def test_image_detail_high_goes_on_every_image_part(openai_server, tmp_path):
    scripted_reply_server(openai_server, load_benchmark("mmrb"))
    target = [
        "model.target.backend=openai_compatible",
        f"model.target.base_url={openai_server.openai_base_url}",
        "model.target.model=fixture-vl-model",
        "benchmark.image_detail=high",
    ]
    fixture_rollouts("mmrb", target, {}, tmp_path)
    details = [
        image["detail"] for r in openai_server.requests_for("/v1/chat/completions") for image in r.images
    ]
    assert details == ["high"] * 7  # 2 + 3 + 2 images


@pytest.mark.parametrize("name", ["docvqa", "mmrb"])
def test_images_reach_the_anthropic_fake_as_base64_image_blocks(name, anthropic_server, tmp_path):
    benchmark = load_benchmark(name)
    rules = resolve_rule_set(None, BackendContext(scripted_target_rules=fixture_rules(benchmark)),
                             where="test")
    backend = ScriptedBackend(rules, role="target")

    def reply(request):
        text = "\n".join(part["text"] for message in request.body["messages"] for part in message["content"]
                         if isinstance(message["content"], list) and part["type"] == "text")
        answer = backend.attempt(ChatRequest(messages=[user(text)], stage="rollout"), timeout_s=30)
        return ok(text=answer.text)

    anthropic_server.handler = reply
    env = {"ANTHROPIC_API_KEY": "sk-test"}
    target = ["model.target.backend=anthropic", f"model.target.base_url={anthropic_server.url}",
              "model.target.model=claude-sonnet-4-6"]
    items, rows = fixture_rollouts(name, target, env, tmp_path)
    requests = anthropic_server.requests_for("/v1/messages")
    assert len(requests) == 3
    for item, request in zip(items, requests, strict=True):
        blocks = request.images
        assert [(b["source_type"], b["media_type"]) for b in blocks] == [("base64", "image/png")] * len(
            blocks
        )
        assert [b["data"] for b in blocks] == item_images_b64(item)
    assert all(row.answered for row in rows) and any(row.hard == 1.0 for row in rows)


@pytest.mark.parametrize(
    ("target", "env", "route", "wire"),
    [
        (
            [
                "model.target.backend=openai",
                "model.target.model=gpt-4.1-mini",
                "model.target.options.api=responses",
            ],
            {"OPENAI_API_KEY": "sk-test"},
            "/v1/responses",
            "responses",
        ),
        (
            ["model.target.backend=azure", "model.target.model=my-gpt4o", "model.target.price_model=gpt-4o"],
            {"AZURE_OPENAI_API_KEY": "sk-test"},
            "/v1/chat/completions",
            "chat",
        ),
    ],
)
def test_a_docvqa_page_reaches_the_openai_responses_and_azure_wires(
    target, env, route, wire, openai_server, tmp_path
):
    openai_server.plan(route, *[ok(text="<answer>3/3/98</answer>")] * 3)
    base = openai_server.openai_base_url if wire == "responses" else openai_server.url
    items, rows = fixture_rollouts("docvqa", [*target, f"model.target.base_url={base}"], env, tmp_path)
    requests = openai_server.requests
    assert len(requests) == 3 and all(request.route == route for request in requests)
    for item, request in zip(items, requests, strict=True):
        [image] = request.images
        assert image["wire"] == wire and image["data"] == item_images_b64(item)[0]
        assert image["url"].startswith("data:image/png;base64,")
    assert [row.hard for row in rows] == [1.0, 0.0, 0.0]  # the memo's short form is exact
