"""A loopback OpenAI-compatible server that answers like the demo world, slowly and unreliably on purpose.

``LatencyWorld`` puts the demo world's scripted target and optimizer (``skillopt.benchmarks.demo.scripted``)
behind the loopback Chat Completions fake of ``tests/fakes/http_fakes.py``, so ``skillopt train demo`` with
``model.<role>.backend=openai_compatible`` pointed at it runs the real HTTP backend, retry loop and
structured-call helper against meaningful, deterministic answers:

- every reply waits ``latency_s`` (answer computation included), so a run's wall time can be compared
  with the critical-path bound;
- ``GET /v1/models`` lists the demo's two models with their context window (``max_model_len``, as vLLM
  reports it), so a run knows the window from the start as it does on a hosted model or a vLLM server;
- the stage of each request is read from its system message (the optimizer templates' first lines;
  anything else is a target rollout), and the world counts requests, answers, faults and tokens per stage;
- with ``Faults`` it injects, per attempt, HTTP 429 (with ``Retry-After``), HTTP 500, a reply held past the
  client's timeout and a malformed body, at a seeded rate; and garbles the JSON content of an optimizer
  stage's first reply (the structured-call helper's re-ask then gets the real answer). A decision depends
  only on the seed, the request body and how often that exact body has been seen, never on timing, so a
  soak run is reproducible;
- a re-ask (the conversation after the first assistant message) is answered from the original
  conversation, as a model that fixes its format would;
- ``hold_after(n)`` freezes every request from the n-th answer on (the resume benchmark kills the run
  while requests are held) and ``answered_bodies`` tells which calls completed.

Run it alone with ``python bench/latency_world.py --latency 0.5`` (prints its base URL).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: reach the repository's packages and test fakes
    sys.path.insert(0, str(ROOT))

from skillopt.benchmarks.demo import scripted as demo  # noqa: E402
from skillopt.core.prompts import optimizer_prompt  # noqa: E402
from skillopt.llm.chat import ChatRequest, Message  # noqa: E402
from skillopt.llm.clients import CORRECTION_LEAD  # noqa: E402
from tests.fakes.http_fakes import (  # noqa: E402
    Entry,
    FakeOpenAIServer,
    RecordedRequest,
    malformed_body,
    ok,
    raw,
    slow,
    status,
)

CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
#: The context window the world reports for every model, in ``GET /v1/models`` as vLLM does
#: (``max_model_len``).
CONTEXT_TOKENS = 32768

#: Optimizer template -> (stage, analyst kind). The first line of each template starts its system message.
_TEMPLATES = {
    "analyst_failure": ("analyst", "failure"),
    "analyst_success": ("analyst", "success"),
    "analyst_suggestions": ("analyst", "failure"),
    "analyst_full_rewrite": ("analyst", "failure"),
    "merge": ("merge", None),
    "merge_final": ("merge", None),
    "merge_skills": ("merge", None),
    "merge_suggestions": ("merge", None),
    "ranking": ("ranking", None),
    "ranking_suggestions": ("ranking", None),
    "autonomous_budget": ("lr", None),
    "rewrite": ("rewrite", None),
    "deep_probe": ("deep_probe", None),
    "slow_update": ("slow_update", None),
    "meta_skill": ("meta_skill", None),
}
_HANDLERS = {
    "rollout": demo.target, "analyst": demo.analyst, "merge": demo.merge, "ranking": demo.ranking,
    "lr": demo.learning_rate, "rewrite": demo.rewrite, "deep_probe": demo.deep_probe,
    "slow_update": demo.slow_update, "meta_skill": demo.meta_skill,
}
FAULT_KINDS = ("429", "500", "timeout", "malformed")


@dataclass(frozen=True)
class Faults:
    """Fault injection: ``rate`` of all attempts fail (kind drawn uniformly from ``kinds``); ``garble_rate``
    of optimizer calls get a first reply whose JSON content is unusable."""

    rate: float = 0.0
    garble_rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS
    retry_after_s: float = 1.0
    #: How long a "timeout" reply is held; set the clients' ``timeout_s`` below it.
    hold_s: float = 4.0

    def __post_init__(self) -> None:
        for name in ("rate", "garble_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"Faults.{name} must be in [0, 1), got {value}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"Faults.kinds: unknown {sorted(unknown)}; choose from {', '.join(FAULT_KINDS)}")

    @classmethod
    def soak(cls, rate: float, *, retry_after_s: float = 1.0, hold_s: float = 4.0) -> Faults:
        """Every attempt fails with probability ``rate``; optimizer first replies are garbled as often."""
        return cls(rate=rate, garble_rate=rate, retry_after_s=retry_after_s, hold_s=hold_s)


@dataclass
class StageCounts:
    requests: int = 0  # every HTTP request of the stage (faulted ones and re-asks included)
    answered: int = 0  # valid answers sent
    reasks: int = 0
    garbled: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Event:
    """One request as the world saw it: wall-clock arrival (epoch seconds), stage and what was sent."""

    at: float
    stage: str
    outcome: str  # "answer", "garbled" or a fault kind
    #: When the reply leaves (epoch seconds): arrival plus the latency.
    sent_at: float = 0.0
    #: The request body (``canonical``), to match a call made before a kill with one made after.
    key: str = ""


def _fraction(seed: int, *parts: Any) -> float:
    digest = hashlib.sha256(json.dumps([seed, *parts], default=str).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def canonical(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class LatencyWorld:
    """The demo world over HTTP with a fixed latency, per-stage counters and seeded faults."""

    def __init__(self, *, latency_s: float = 0.5, faults: Faults | None = None, seed: int = 0,
                 scripted_seed: int = 0) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.latency_s = latency_s
        self.faults = faults or Faults()
        self.seed = seed
        self.scripted_seed = scripted_seed
        self.server = FakeOpenAIServer(handler=self._reply)
        self._lock = threading.Lock()
        self._stages: dict[str, StageCounts] = {}
        self._seen: Counter[str] = Counter()
        self._events: list[Event] = []
        self._answered: list[str] = []
        self._hold_from: int | None = None
        self.held = threading.Event()
        self._release = threading.Event()
        self._intros = {
            optimizer_prompt(name).splitlines()[0].strip(): spec for name, spec in _TEMPLATES.items()
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LatencyWorld:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._release.set()
        self.server.stop()

    @property
    def base_url(self) -> str:
        return self.server.openai_base_url

    # -- control and read-outs -----------------------------------------------------------------

    def reset(self, *, latency_s: float | None = None, faults: Faults | None = None) -> None:
        """Forget counters, events and seen bodies (a fresh world on the same port)."""
        with self._lock:
            if latency_s is not None:
                self.latency_s = latency_s
            if faults is not None:
                self.faults = faults
            self._stages.clear()
            self._seen.clear()
            self._events.clear()
            self._answered.clear()
            self._hold_from = None
            self.held.clear()
            self._release.clear()
        self.server.clear_requests()

    def hold_after(self, answers: int | None) -> None:
        """Hold every request that arrives once ``answers`` calls have been answered (None: release)."""
        with self._lock:
            self._hold_from = answers
            if answers is None:
                self._release.set()
            else:
                self._release.clear()
                self.held.clear()

    def answered_bodies(self) -> list[str]:
        """Canonical request bodies of the calls answered validly, in answer order."""
        with self._lock:
            return list(self._answered)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def counts(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {
                stage: {**asdict(c), "faults": dict(c.faults)} for stage, c in sorted(self._stages.items())
            }

    # -- one request -------------------------------------------------------------------------

    def classify(self, body: dict[str, Any]) -> tuple[str, ChatRequest, bool]:
        """The stage, the demo request to answer (the original conversation) and whether it is a re-ask."""
        messages = body.get("messages") or []
        # A re-ask is the same conversation with a short correction added to its last user turn.
        original, reask = [], False
        for message in messages:
            content = _text(message.get("content"))
            if message.get("role") == "user" and CORRECTION_LEAD in content:
                content, reask = content.split(CORRECTION_LEAD, 1)[0].rstrip("\n"), True
            original.append({**message, "content": content})
        system_text = "\n".join(_text(m.get("content")) for m in original if m.get("role") == "system")
        stage, kind = self._intros.get(system_text.lstrip().split("\n", 1)[0].strip(), ("rollout", None))
        request = ChatRequest(
            messages=[Message(role=m["role"], content=_text(m.get("content"))) for m in original
                      if m.get("role") in ("system", "user")],
            stage=stage, tags={"kind": kind} if kind else {},
        )
        return stage, request, reask

    def _reply(self, recorded: RecordedRequest) -> Entry | None:
        started = time.monotonic()
        body = recorded.body if isinstance(recorded.body, dict) else {}
        if recorded.route == MODELS and recorded.method == "GET":
            model = {"object": "model", "owned_by": "latency-world", "max_model_len": CONTEXT_TOKENS}
            return raw(200, {"object": "list", "data": [{"id": f"demo-{role}", **model}
                                                         for role in ("target", "optimizer")]})
        if recorded.route != CHAT or not body.get("messages"):
            return None  # the fake's default reply (models list, odd requests)
        stage, request, reask = self.classify(body)
        key = canonical(body)
        with self._lock:
            attempt = self._seen[key]
            self._seen[key] += 1
            counts = self._stages.setdefault(stage, StageCounts())
            counts.requests += 1
            counts.reasks += reask
            holding = self._hold_from is not None and len(self._answered) >= self._hold_from
        if holding:
            self.held.set()
            self._release.wait()
            return status(503, message="the latency world was released after a hold")

        fault = self._fault(key, attempt)
        if fault is not None:
            self._note(stage, fault, counts)
            return self._fault_entry(fault)
        answer = _HANDLERS[stage](request, self.scripted_seed)
        text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        garble = (
            stage != "rollout"
            and not reask
            and _fraction(self.seed, "garble", canonical(body.get("messages"))) < self.faults.garble_rate
        )
        if garble:
            text = "Here is the object you asked for:\n```json\n" + text[: max(1, len(text) // 2)] + "\n```"
        usage = {"prompt_tokens": sum(_tokens(_text(m.get("content"))) for m in body["messages"]),
                 "completion_tokens": _tokens(text)}
        with self._lock:
            counts.prompt_tokens += usage["prompt_tokens"]
            counts.completion_tokens += usage["completion_tokens"]
            if garble:
                counts.garbled += 1
            else:
                counts.answered += 1
                self._answered.append(key)
            wait = self.latency_s - (time.monotonic() - started)
            now = time.time()
            self._events.append(
                Event(now, stage, "garbled" if garble else "answer", sent_at=now + max(0.0, wait), key=key)
            )
        entry = ok(text=text, usage=usage)
        return slow(wait, then=entry) if wait > 0 else entry

    def _fault(self, key: str, attempt: int) -> str | None:
        rate = self.faults.rate
        if rate <= 0 or _fraction(self.seed, "fault", key, attempt) >= rate:
            return None
        kinds = self.faults.kinds
        return kinds[int(_fraction(self.seed, "kind", key, attempt) * len(kinds))]

    def _note(self, stage: str, fault: str, counts: StageCounts) -> None:
        with self._lock:
            counts.faults[fault] += 1
            self._events.append(Event(time.time(), stage, fault))

    def _fault_entry(self, fault: str) -> Entry:
        if fault == "429":
            return slow(self.latency_s, then=status(429, retry_after=self.faults.retry_after_s,
                                                    message="rate limited by the latency world"))
        if fault == "500":
            return slow(self.latency_s, then=status(500, message="injected server error"))
        if fault == "timeout":
            return slow(self.faults.hold_s)
        return slow(self.latency_s, then=malformed_body("json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per reply (default 0.5)")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of failing attempts (default 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with LatencyWorld(latency_s=args.latency, faults=Faults.soak(args.fault_rate), seed=args.seed) as world:
        print(f"latency world on {world.base_url} (latency {args.latency:g} s, faults "
              f"{args.fault_rate:.0%}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(5)
        except KeyboardInterrupt:
            print(json.dumps(world.counts(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
