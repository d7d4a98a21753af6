"""An endpoint's first structured call is its probe and runs alone; the calls that arrived while it ran then
go on side by side, not one after another (skillopt.llm.structured_output.StructuredModes.first_call)."""

from __future__ import annotations

import threading
import time

from skillopt.llm.structured_output import StructuredModes


def test_calls_that_waited_for_the_probe_then_run_side_by_side():
    modes = StructuredModes()
    lock = threading.Lock()
    inside: list[int] = []
    peak = [0]
    probe_in = threading.Event()
    release_probe = threading.Event()
    all_in = threading.Barrier(4, timeout=10)

    def call(probe: bool) -> None:
        with modes.first_call("openai_compatible|http://x|m"):
            with lock:
                inside.append(1)
                peak[0] = max(peak[0], len(inside))
            if probe:
                probe_in.set()
                assert release_probe.wait(10)
            else:
                all_in.wait()  # the three waiting calls are inside at once, or this times out
            with lock:
                inside.pop()

    first = threading.Thread(target=call, args=(True,))
    first.start()
    assert probe_in.wait(10)
    others = [threading.Thread(target=call, args=(False,)) for _ in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.2)
    assert peak[0] == 1  # nothing passes the probe while it runs
    release_probe.set()
    all_in.wait()
    for thread in [first, *others]:
        thread.join(10)
    assert peak[0] == 3 and not all_in.broken


def _three_structured_calls_at_once(server, *overrides: str) -> int:
    """Three structured optimizer calls started together against ``server`` (each reply 0.3 s late); the
    largest number of requests the server had in flight at once."""
    from concurrent.futures import ThreadPoolExecutor

    from pydantic import BaseModel

    from skillopt.core.config import load_config
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.chat import ChatRequest, user
    from skillopt.llm.clients import ModelClients
    from tests.fakes.http_fakes import ok, slow

    class Verdict(BaseModel):
        verdict: str

    server.plan("/v1/chat/completions", *[slow(0.3, ok(json={"verdict": "yes"})) for _ in range(3)])
    loaded = load_config("demo", overrides=[
        "model.optimizer.backend=openai_compatible", f"model.optimizer.base_url={server.openai_base_url}",
        "model.optimizer.model=small-model", "model.optimizer.options={thinking: server_default}",
        "model.judge=null", *overrides], env={})
    clients = ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())
    optimizer = clients.optimizer
    request = ChatRequest(messages=[user("Is it? Reply with JSON.")], stage="analyst")
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda _: optimizer.structured(request, Verdict)[0], range(3)))
    assert [reply.verdict for reply in replies] == ["yes"] * 3
    return server.max_in_flight


def test_with_the_window_unknown_the_first_structured_call_goes_alone(openai_server):
    # the fake lists its models without a window, and no table knows "small-model"
    assert _three_structured_calls_at_once(openai_server) == 2


def test_with_the_window_known_the_first_structured_calls_go_together(openai_server):
    assert _three_structured_calls_at_once(openai_server, "model.optimizer.context_tokens=8192") == 3
