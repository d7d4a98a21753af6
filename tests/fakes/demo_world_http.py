"""The demo world's target and optimizer behind the loopback OpenAI-compatible fake.

The demo's scripted handlers answer over a real HTTP protocol, so a run configured with the
``openai_compatible`` backend and this server's URL trains like the offline demo while the test
sees (and can hold) every request. Used by the resume and deployment tests.

Two variants serve the signal tests:

- ``failing``: the rollouts of these questions always get HTTP 500 (a persistent outage for some
  items): the run must record them as error rows, not failures.
- ``slow``: the rollouts of these questions get their (right) answer after ``slow_s`` seconds.
- ``evidence_in_reply``: the target ends its reply with the ``Conventions:`` self-check line the
  demo's evaluation event carries, and the optimizer reads only that one (the evaluation event's
  line is struck from what the optimizer handlers see). With ``reply_padding`` the reply starts with
  that many characters of working notes, so the decisive line sits after them: the optimizer
  learns only if the tail of a long trajectory reaches it.

Two variants serve the structured-output tests:

- ``schema_only``: like llama.cpp or vLLM with a small model: an optimizer call whose ``response_format``
  carries a JSON schema gets the JSON the schema asks for (its required keys are checked), any other
  optimizer call gets prose that no parser can use.
- ``refuse_schema``: a server that rejects ``response_format`` with HTTP 400 and otherwise answers like the
  demo world (the schema then has to travel in the prompt).
- ``refuse_json_schema_s``: like llama-cpp-python's server, rejects a ``json_schema`` response format (after
  that many seconds) and takes ``json_object``.

``window_tokens`` makes it a server with that context window and nothing to say about it (no ``/props``,
no window in ``/models``), counting ``ceil(characters / 4) + 4`` tokens per message: like llama.cpp's
OpenAI-compatible server it rejects a prompt larger than the window with "Requested tokens (N) exceed context
window of W", and silently shrinks ``max_tokens`` to the room the prompt leaves, so a longer reply is cut
there with ``finish_reason: length``. ``window_log`` records each request's arrival (``time.time()``), prompt
tokens, ``max_tokens`` and what happened (``ok``, ``short``, ``overflow``).
"""

from __future__ import annotations

import json
import re
import threading
import time

from skillopt.benchmarks.demo import scripted as demo
from skillopt.benchmarks.demo.world import gold_answer, parse_question, score_response
from skillopt.core.prompts import optimizer_prompt
from skillopt.llm.chat import ChatRequest, system, user
from tests.fakes.http_fakes import FakeOpenAIServer, ok, slow, status

#: The evaluation event's detail line, struck from optimizer messages in ``evidence_in_reply`` mode.
_EVALUATION_CONVENTIONS = re.compile(r"^Conventions:[^\n]*\n?", re.MULTILINE)
_NOTE = "Working note: I restate the problem, list the quantities, and check each step of the arithmetic. "


class DemoWorldServer:
    """The demo world's target and optimizer behind the OpenAI-compatible fake, with a kill switch."""

    def __init__(self, *, failing: frozenset[str] = frozenset(), evidence_in_reply: bool = False,
                 reply_padding: int = 0, latency_s: float = 0.0, schema_only: bool = False,
                 refuse_schema: bool = False, refuse_json_schema_s: float | None = None,
                 slow: frozenset[str] = frozenset(), slow_s: float = 0.0,
                 window_tokens: int | None = None) -> None:
        self.window_tokens = window_tokens
        self.window_log: list[tuple[float, int, int | None, str]] = []
        self.failing = failing
        #: How long each model reply takes (the server holds the request that long).
        self.latency_s = latency_s
        self.slow, self.slow_s = slow, slow_s
        self.schema_only = schema_only
        self.refuse_schema = refuse_schema
        self.refuse_json_schema_s = refuse_json_schema_s
        self.evidence_in_reply = evidence_in_reply
        self.reply_padding = reply_padding
        #: The analyst messages the optimizer received, for tests to inspect.
        self.analyst_messages: list[str] = []
        self.server = FakeOpenAIServer(handler=self.reply)
        self.lock = threading.Lock()
        self.answered: list[str] = []
        self.hold_from: int | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        self.failure_intro = optimizer_prompt("analyst_failure").splitlines()[0]
        #: The usage every reply reports (None: the fake's DEFAULT_USAGE), e.g. to price calls exactly.
        self.usage: dict[str, int] | None = None

    def reply(self, request):
        body = request.body
        if not isinstance(body, dict) or "messages" not in body:
            return None  # GET /models, /props: the fake's own replies
        with self.lock:
            holding = self.hold_from is not None and len(self.answered) >= self.hold_from
        if holding:
            self.held.set()
            self.release.wait(timeout=300)
            return ok(text="too late")
        if self.refuse_schema and "response_format" in body:
            return status(400, message="'response_format' is not supported by this server")
        asked = (body.get("response_format") or {}).get("type")
        if self.refuse_json_schema_s is not None and asked == "json_schema":
            time.sleep(self.refuse_json_schema_s)  # refusals of calls sent together overlap
            return status(400, message="response_format.type: Input should be 'text' or 'json_object'")
        received = time.time()
        prompt_tokens = fake_prompt_tokens(body)
        if self.window_tokens is not None and prompt_tokens > self.window_tokens:
            with self.lock:
                self.window_log.append((received, prompt_tokens, body.get("max_tokens"), "overflow"))
            return status(400, message=f"Requested tokens ({prompt_tokens}) exceed context window of "
                                       f"{self.window_tokens}")
        chat = self.as_chat_request(body)
        if chat.stage == "rollout" and chat.last_user_text() in self.failing:
            return status(500, message="the fake server fails this item every time")
        if chat.stage == "rollout" and chat.last_user_text() in self.slow:
            time.sleep(self.slow_s)  # a right answer, late
        if chat.stage == "analyst":
            with self.lock:
                self.analyst_messages.append(chat.last_user_text())
        if self.evidence_in_reply and chat.stage != "rollout":
            chat = chat.model_copy(update={"messages": [
                system(chat.system_text()), user(_EVALUATION_CONVENTIONS.sub("", chat.last_user_text()))]})
        handler = {
            "rollout": demo.target,
            "analyst": demo.analyst,
            "merge": demo.merge,
            "ranking": demo.ranking,
            "slow_update": demo.slow_update,
            "meta_skill": demo.meta_skill,
        }[chat.stage]
        answer = handler(chat, 0)
        if self.schema_only and chat.stage != "rollout":
            schema = constraining_schema(body)
            if schema is None:
                return ok(text="I looked at the trajectories carefully and I think the skill could be "
                               "improved by being clearer about the steps.", usage=self.usage)
            missing = set(schema.get("required", [])) - set(answer if isinstance(answer, dict) else {})
            assert not missing, f"the demo's {chat.stage} reply lacks the schema's keys {missing}"
        if self.evidence_in_reply and chat.stage == "rollout":
            answer = self.with_self_check(chat, str(answer))
        with self.lock:
            self.answered.append(canonical(body))
        text = answer if isinstance(answer, str) else json.dumps(answer)
        if self.window_tokens is not None:
            return self.within_window(body, prompt_tokens, text, received)
        reply = ok(text=text, usage=self.usage)
        return slow(self.latency_s, reply) if self.latency_s else reply

    def within_window(self, body: dict, prompt_tokens: int, text: str, received: float):
        """The reply as a server with ``window_tokens`` gives it: cut where the window ends."""
        assert self.window_tokens is not None
        room = self.window_tokens - prompt_tokens
        wanted = -(-len(text) // 4)
        cap = body.get("max_tokens")
        short = wanted > room and (cap is None or cap > room)
        with self.lock:
            self.window_log.append((received, prompt_tokens, cap, "short" if short else "ok"))
        if short:
            return ok(text=text[: room * 4], finish_reason="length",
                      usage={"prompt_tokens": prompt_tokens, "completion_tokens": room})
        return ok(text=text, usage={"prompt_tokens": prompt_tokens, "completion_tokens": wanted})

    def with_self_check(self, chat: ChatRequest, answer: str) -> str:
        """The reply with ``reply_padding`` characters of notes before it and the conventions line after
        it."""
        problem = parse_question(chat.last_user_text())
        if problem is None:
            return answer
        detail = score_response(problem.task_type, gold_answer(problem), answer).detail
        notes = (_NOTE * (self.reply_padding // len(_NOTE) + 1))[: self.reply_padding]
        return f"{notes}\n{answer}\n{detail}" if notes else f"{answer}\n{detail}"

    def as_chat_request(self, body: dict) -> ChatRequest:
        system_text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")
        user_text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        stage, tags = "rollout", {}
        if "## Edit budget" in user_text:
            stage, tags = (
                "analyst",
                {"kind": "failure" if system_text.startswith(self.failure_intro) else "success"},
            )
        elif "## Patches to merge" in user_text:
            stage = "merge"
        elif "## Candidate edits" in user_text:
            stage = "ranking"
        elif "## Skill at the start of the epoch" in user_text:
            stage = "slow_update"
        elif "## Previous epoch's last skill" in user_text:
            stage = "meta_skill"
        return ChatRequest(messages=[system(system_text), user(user_text)], stage=stage, tags=tags)


def fake_prompt_tokens(body: dict) -> int:
    """The prompt's tokens as the ``window_tokens`` server counts them."""
    return sum(-(-len(str(m.get("content") or "")) // 4) + 4 for m in body.get("messages") or [])


def constraining_schema(body: dict) -> dict | None:
    """The JSON schema a Chat Completions request constrains its reply to, or None."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else None


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def role_overrides(url: str) -> list[str]:
    """Config overrides that send the demo's target and optimizer calls to the fake at ``url`` (no judge)."""
    overrides = []
    for role in ("target", "optimizer"):
        overrides += [f"model.{role}.backend=openai_compatible", f"model.{role}.base_url={url}",
                      f"model.{role}.model=demo-{role}", f"model.{role}.options={{}}"]
    return [*overrides, "model.judge=null"]


#: The smallest demo run with a second step: two steps of four items, four selection items, one epoch, no test
#: split.
TWO_STEPS = ["benchmark.train_size=8", "train.batch_size=4", "benchmark.val_size=4", "train.epochs=1",
             "evaluation.eval_test=false"]


def train_two_steps(world: DemoWorldServer, run_name: str, *overrides: str) -> None:
    """``skill-train`` in this process on the demo (``TWO_STEPS``, plus ``overrides``), against ``world``."""
    from skillopt.flows import train as train_flow

    with world.server:
        url = world.server.openai_base_url
        train_flow.skill_train(benchmark="demo", run_name=run_name,
                               overrides=[*role_overrides(url), *TWO_STEPS, *overrides])
