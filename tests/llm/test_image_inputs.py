"""Image inputs end to end, apart from the HTTP wire (tests/integration/test_benchmarks_over_http.py):

- exec targets get a benchmark item's images as workspace attachments that ``task.md`` names, and
  codex also as ``-i`` flags (the fake CLIs refuse a missing image, as the real codex does);
- cache keys follow image *content*: the reply store and the run's data hash change when a picture
  changes under the same path;
- a target that cannot take images stops an image benchmark in preflight, and an image benchmark
  that needs the judge stops in preflight when the judge role cannot be resolved.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from skillopt.benchmarks.base import BenchmarkSetupError, load_benchmark
from skillopt.benchmarks.runner import run_item
from skillopt.core.config import load_config
from skillopt.llm.base import BackendContext, BackendRegistry
from skillopt.llm.capabilities import image_support_problem
from skillopt.llm.chat import ChatRequest, ImagePart, TextPart, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.reply_store import ReplyStore
from skillopt.shell.cli import _data_overrides
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of, items_by_id
from tests.fixtures.make_images import tiny_png
from tests.llm.test_exec_backends import FakeCli, fake_cli  # noqa: F401 - the fixture

DOCVQA = FIXTURES_ROOT / "docvqa"


def exec_clients(tmp_path: Path, backend: str) -> ModelClients:
    # Without the OS sandbox, so the fake CLI can record what it was given next to itself (under bubblewrap
    # its folder is read-only; tests/security/test_exec_sandbox.py runs it there).
    overrides = [
        *_data_overrides(str(DOCVQA)),
        f"model.target.backend={backend}",
        f"model.target.options.workspace_root={tmp_path / 'workspaces'}",
        "model.target.timeout_s=30",
        "model.target.options.workspace_sandbox=none",
    ]
    loaded = load_config("docvqa", overrides=overrides, env={})
    context = BackendContext(run_id="imgrun01", protected_paths=(Path.cwd(),))
    return ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default(), context=context)


@pytest.mark.parametrize(("backend", "cli"), [("codex_exec", "codex"), ("claude_code_exec", "claude")])
def test_an_exec_target_gets_the_item_image_as_a_named_attachment(backend, cli, tmp_path, fake_cli: FakeCli):  # noqa: F811
    fake_cli.scenario("images")
    plugin = load_benchmark("docvqa")
    config = fixture_config_of(plugin)
    memo = items_by_id(plugin, config, tmp_path)["90001"]
    clients = exec_clients(tmp_path, backend)
    row = run_item(plugin, memo, "Copy spans exactly.", config, target=clients.target, judge=None)

    assert row.answered and row.predicted_answer == "IMAGES 01_q90001_d7001.png"
    call = fake_cli.run()
    attachment = "attachments/01_q90001_d7001.png"
    assert call["files"][attachment] == f"<binary {Path(memo['image_path']).stat().st_size} bytes>"
    task = call["files"]["task.md"]
    assert f"[image] {attachment}" in task and "## Question\nWhat is the date at the top of the memo?" in task
    assert "## Skill" not in task and "Copy spans exactly." in call["files"]["SKILL.md"]
    assert "March 3, 1998" not in task  # gold never reaches the workspace
    if cli == "codex":
        assert call["argv"][call["argv"].index("-i") + 1].endswith(attachment)
    # The trajectory names the image; usage is accounted as a rollout of the exec target.
    assert "[image] q90001_d7001.png" in row.trajectory[1]["content"]
    assert [(r.stage, r.backend) for r in clients.ledger.records()] == [("rollout", backend)]


def test_the_fake_codex_refuses_a_missing_image_like_the_real_one(tmp_path, fake_cli: FakeCli):  # noqa: F811
    from skillopt.llm.errors import ExecError
    from skillopt.llm.exec_harness import ExecTask

    fake_cli.scenario("images")
    clients = exec_clients(tmp_path, "codex_exec")
    not_an_image = tmp_path / "data" / "notes.png"
    not_an_image.parent.mkdir()
    not_an_image.write_text("plain text", encoding="utf-8")
    task = ExecTask(item_id="x", skill="", task="t", attachments=[not_an_image], images=[not_an_image])
    with pytest.raises(ExecError, match="not a supported image"):
        clients.target.run_exec(task)


def test_an_image_that_is_not_a_file_cannot_go_to_an_exec_target():
    from skillopt.core.errors import ConfigError
    from skillopt.llm.exec_harness import exec_task_from_messages

    message = user([TextPart(text="What is it?"), ImagePart(source=tiny_png((1, 2, 3)))])
    with pytest.raises(ConfigError, match="exec targets take images as files"):
        exec_task_from_messages("x", "", [message])


def test_reply_store_keys_follow_image_content_not_the_path(tmp_path):
    picture = tmp_path / "page.png"
    picture.write_bytes(tiny_png((10, 20, 30)))

    def key() -> str:
        request = ChatRequest(messages=[user([TextPart(text="Read it."), ImagePart(source=str(picture))])],
                              stage="rollout")
        return ReplyStore.key("role-fp", request)

    first = key()
    assert key() == first
    picture.write_bytes(tiny_png((10, 20, 31)))
    assert key() != first
    moved = tmp_path / "elsewhere" / "page.png"
    moved.parent.mkdir()
    shutil.copyfile(picture, moved)
    same_bytes = ChatRequest(messages=[user([TextPart(text="Read it."), ImagePart(source=str(moved))])],
                             stage="rollout")
    assert ReplyStore.key("role-fp", same_bytes) == key()  # the same picture elsewhere is the same request


def test_a_rollout_s_first_request_changes_when_an_image_changes_under_the_same_path(tmp_path):
    from skillopt.benchmarks.runner import first_messages

    data = tmp_path / "docvqa"
    shutil.copytree(DOCVQA, data)
    plugin = load_benchmark("docvqa")
    config = fixture_config_of(plugin, [f"benchmark.split_dir={data}", f"benchmark.data_root={data}"])

    def first_request_key() -> str:
        item = items_by_id(plugin, config, tmp_path)["90002"]
        return ChatRequest(messages=first_messages(plugin, item, "", config), stage="rollout").cache_key(
            "target"
        )

    before = first_request_key()
    assert first_request_key() == before
    (data / "images" / "q90002_d7002.png").write_bytes(tiny_png((0, 0, 0)))
    assert first_request_key() != before


def run_context_overrides(name: str, tmp_path: Path, *extra: str) -> list[str]:
    return [*_data_overrides(str(FIXTURES_ROOT / name)), "model.optimizer.backend=scripted",
            f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}", *extra]


def test_a_target_without_vision_stops_an_image_benchmark_in_preflight(tmp_path):
    from skillopt.run.assembly import Run

    overrides = run_context_overrides("docvqa", tmp_path, "model.target.backend=openai",
                                      "model.target.model=gpt-3.5-turbo", "model.judge=null")
    loaded = load_config("docvqa", overrides=overrides, env={})
    with pytest.raises(
        BenchmarkSetupError,
        match=r"benchmark docvqa sends images to the target, but \[target\] "
        r"openai/gpt-3.5-turbo cannot take them",
    ):
        Run.from_config(loaded, env={"OPENAI_API_KEY": "sk-test-not-used"})
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("backend", "kind", "model", "options", "overrides", "ok"),
    [
        ("scripted", "chat", None, {}, {}, True),
        ("codex_exec", "exec", None, {}, {}, True),
        ("anthropic", "chat", "claude-sonnet-4-5", {}, {}, True),
        ("openai", "chat", "gpt-4.1-mini", {}, {}, True),
        ("openai", "chat", "gpt-3.5-turbo", {}, {}, False),
        ("openai", "chat", "gpt-3.5-turbo", {}, {"vision": True}, True),
        ("azure_openai", "chat", "deepseek-chat", {}, {}, False),
        ("openai_compatible", "chat", "Qwen/Qwen2.5-VL-7B", {}, {}, True),
        ("openai_compatible", "chat", "some-text-model", {}, {"vision": False}, False),
        ("local", "chat", None, {}, {}, False),
        ("local", "chat", None, {"clip_model_path": "mmproj.gguf"}, {}, True),
    ],
)
def test_which_backends_take_images(backend, kind, model, options, overrides, ok):
    assert (image_support_problem(backend, kind, model, options, overrides) is None) is ok


@pytest.mark.parametrize("name", ["babyvision", "mathverse"])
def test_judge_benchmarks_stop_in_preflight_without_a_judge_role(name, tmp_path):
    from skillopt.run.assembly import Run

    overrides = run_context_overrides(name, tmp_path, "model.target.backend=scripted", "model.judge=null")
    with pytest.raises(BenchmarkSetupError, match=f"benchmark {name} needs the judge role: .*switched off"):
        Run.from_config(load_config(name, overrides=overrides, env={}), env={})
    # No usable credential for the judge's backend is the same stop, naming the variable.
    overrides = run_context_overrides(
        name, tmp_path, "model.target.backend=scripted", "model.judge.backend=openai"
    )
    with pytest.raises(BenchmarkSetupError, match=f"benchmark {name} needs the judge role: .*OPENAI_API_KEY"):
        Run.from_config(load_config(name, overrides=overrides, env={}), env={})
    assert not (tmp_path / "runs").exists()


def test_the_analyst_sees_image_names_by_default_and_the_images_only_with_analyst_images(tmp_path):
    from skillopt.benchmarks.images import item_image_paths
    from skillopt.core.config import OptimizerSection
    from skillopt.optimizer.reflect import analyst_request, with_item_images
    from tests.fakes.benchmark_target import PluginScriptedTarget

    plugin = load_benchmark("mmrb")
    config = fixture_config_of(plugin)
    items = items_by_id(plugin, config, tmp_path)
    rows = [run_item(plugin, item, "", config, target=PluginScriptedTarget(plugin), judge=None)
            for item in items.values()]
    request = analyst_request(kind="failure", skill="", budget=2, rows=rows)
    message = request.messages[-1]
    assert not message.images() and "[image] s1_2.png" in message.text() and "base64" not in message.text()
    assert OptimizerSection().analyst_images is False

    shown = with_item_images(
        request, rows, {row.id: item_image_paths(items[row.id]) for row in rows}, detail="low"
    )
    parts = shown.messages[-1].content
    assert parts[0].text == message.text()
    labels = [p.text for p in parts[1:] if isinstance(p, TextPart)]
    assert labels == [f"Images of trajectory {i} (item {row.id}):" for i, row in enumerate(rows, start=1)]
    assert len(shown.messages[-1].images()) == 7 and {p.detail for p in shown.messages[-1].images()} == {
        "low"
    }
    assert ReplyStore.key("fp", shown) != ReplyStore.key("fp", request)


def test_analyst_images_needs_an_optimizer_that_takes_images(tmp_path):
    from skillopt.run.assembly import Run

    overrides = run_context_overrides("mmrb", tmp_path, "model.target.backend=scripted", "model.judge=null",
                                      "model.optimizer.backend=openai", "model.optimizer.model=gpt-3.5-turbo",
                                      "optimizer.analyst_images=true")
    with pytest.raises(BenchmarkSetupError, match=r"shows images to the analyst .*\[optimizer\] "
                                                  r"openai/gpt-3.5-turbo cannot take them"):
        Run.from_config(load_config("mmrb", overrides=overrides, env={}), env={"OPENAI_API_KEY": "sk-test-x"})
