"""The ``target`` role as the shared runner uses it, served by the real ``scripted`` backend with the
fixture folder's ``scripted_rules.yaml`` (or rules a test gives), recording every request."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skillopt.llm.base import BackendContext
from skillopt.llm.chat import ChatRequest, ChatResponse
from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set


def fixture_rules(benchmark: Any) -> tuple[Any, ...]:
    """The target rules a ``--backend scripted`` run on ``tests/fixtures/<id>`` answers from."""
    from skillopt.benchmarks.scripted_target import target_rules

    return target_rules(benchmark.id, fixture_config_of(benchmark))


class RecordingScriptedTarget:
    """The target role served by the real scripted backend, recording every request it answers."""

    def __init__(self, rules: Any = None, context: BackendContext | None = None) -> None:
        rule_set = resolve_rule_set(rules, context or BackendContext(), where="test")
        self.backend = ScriptedBackend(rule_set, role="target")
        self.requests: list[ChatRequest] = []

    def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return self.backend.attempt(request, timeout_s=30)


class PluginScriptedTarget(RecordingScriptedTarget):
    """A recording scripted target that answers from the benchmark's fixture rules."""

    def __init__(self, benchmark: Any, rules: Any = None) -> None:
        super().__init__(rules, BackendContext(scripted_target_rules=fixture_rules(benchmark)))


FIXTURES_ROOT = Path(__file__).resolve().parents[1] / "fixtures"
SPLITS = ("train", "val", "test")


def fixture_config_of(benchmark: Any, overrides: Sequence[str] = (), *, data: Path | None = None) -> Any:
    """The benchmark config a user gets from ``skillopt train <id> --data tests/fixtures/<id> -o ...``
    (``--data <data>`` when a folder is given)."""
    from skillopt.benchmarks.base import benchmark_config
    from skillopt.core.config import load_config
    from skillopt.shell.cli import _data_overrides

    data_overrides = _data_overrides(str(data or FIXTURES_ROOT / benchmark.id))
    loaded = load_config(benchmark.id, overrides=[*data_overrides, *overrides], env={})
    return benchmark_config(benchmark, loaded.config.benchmark)


def items_by_id(benchmark: Any, config: Any, run_dir: Path) -> dict[str, Any]:
    """Every fixture item of all three splits, by id."""
    return {item.id: item for split in SPLITS
            for item in benchmark.load_split(config, split, run_dir=run_dir)}


def scripted_judge_of(benchmark: Any, rules: Any = None, calls: list[Any] | None = None) -> Any:
    """The ``Judge`` callable a plug-in's ``score`` gets, served by the real scripted judge (the ``auto``
    set unless ``rules`` are given) through the plug-in's own ``judge_request``; ``calls`` collects the
    ``(item id, prediction)`` of each call."""
    import json

    backend = ScriptedBackend(resolve_rule_set(rules, BackendContext(), where="test"), role="judge")

    def judge(item: Any, prediction: str) -> tuple[bool, str]:
        if calls is not None:
            calls.append((item.id, prediction))
        verdict = json.loads(backend.attempt(benchmark.judge_request(item, prediction), timeout_s=30).text)
        return verdict["verdict"] == "correct", verdict["reason"]

    return judge
