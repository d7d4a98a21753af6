"""Per-benchmark deep-probe guidance: LiveMathematicianBench and BabyVision ship a ``deep_probe.md``
that the probe call carries as benchmark guidance; the scripted ``auto`` set answers the probe."""

from __future__ import annotations

import pytest

from skillopt.benchmarks.base import load_benchmark
from skillopt.core.records import ItemResult
from skillopt.llm.base import BackendContext
from skillopt.llm.scripted import AUTO_PROBE_INSTRUCTION, ScriptedBackend, resolve_rule_set
from skillopt.optimizer.probe import ProbeReply, probe_request


def failed_row() -> ItemResult:
    return ItemResult(id="x-1", task_type="t", hard=0.0, soft=0.0, fail_reason="wrong: chose A, correct B",
                      answered=True, phase="done",
                      trajectory=[{"type": "message", "role": "assistant", "turn": 1,
                                   "content": "<answer>A</answer>"}])


@pytest.mark.parametrize(("name", "phrases"), [
    ("livemathematicianbench", ("runner-up", "stronger or weaker")),
    ("babyvision", ("decisive visual cue", "two to four short intermediate conclusions")),
])
def test_the_probe_call_carries_the_benchmarks_own_guidance(name, phrases):
    guidance = (load_benchmark(name).prompts_dir / "deep_probe.md").read_text(encoding="utf-8")
    assert all(phrase in guidance for phrase in phrases)
    request = probe_request(skill="# Skill", rows=[failed_row()], benchmark_guidance=guidance)
    system_text = request.messages[0].text()
    assert "## Benchmark guidance" in system_text and guidance.strip() in system_text
    plain = probe_request(skill="# Skill", rows=[failed_row()])
    assert "## Benchmark guidance" not in plain.messages[0].text()


def test_the_scripted_auto_set_answers_the_probe_with_a_usable_instruction():
    backend = ScriptedBackend(resolve_rule_set(None, BackendContext(), where="test"), role="optimizer")
    request = probe_request(skill="# Skill", rows=[failed_row()])
    request = request.model_copy(update={"response_schema": ProbeReply})
    reply = backend.attempt(request, timeout_s=30)
    assert reply.parsed.probe_instruction == AUTO_PROBE_INSTRUCTION
