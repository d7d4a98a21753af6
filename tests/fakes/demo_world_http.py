"""The demo world's target and optimizer behind the loopback OpenAI-compatible fake.

The demo's scripted handlers answer over a real HTTP protocol, so a run configured with the
``openai_compatible`` backend and this server's URL trains like the offline demo while the test
sees (and can hold) every request. Used by the resume and deployment tests.
"""

from __future__ import annotations

import json
import threading

from skillopt.benchmarks.demo import scripted as demo
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.prompts import optimizer_prompt
from tests.fakes.http_fakes import FakeOpenAIServer, ok


class DemoWorldServer:
    """The demo world's target and optimizer behind the OpenAI-compatible fake, with a kill switch."""

    def __init__(self) -> None:
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
        with self.lock:
            holding = self.hold_from is not None and len(self.answered) >= self.hold_from
        if holding:
            self.held.set()
            self.release.wait(timeout=300)
            return ok(text="too late")
        chat = self.as_chat_request(body)
        handler = {"rollout": demo.target, "analyst": demo.analyst, "merge": demo.merge, "ranking": demo.ranking,
                   "slow_update": demo.slow_update, "meta_skill": demo.meta_skill}[chat.stage]
        answer = handler(chat, 0)
        with self.lock:
            self.answered.append(canonical(body))
        return ok(text=answer if isinstance(answer, str) else json.dumps(answer), usage=self.usage)

    def as_chat_request(self, body: dict) -> ChatRequest:
        system_text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")
        user_text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        stage, tags = "rollout", {}
        if "## Edit budget" in user_text:
            stage, tags = "analyst", {"kind": "failure" if system_text.startswith(self.failure_intro) else "success"}
        elif "## Patches to merge" in user_text:
            stage = "merge"
        elif "## Candidate edits" in user_text:
            stage = "ranking"
        elif "## Skill at the start of the epoch" in user_text:
            stage = "slow_update"
        elif "## Previous epoch's last skill" in user_text:
            stage = "meta_skill"
        return ChatRequest(messages=[system(system_text), user(user_text)], stage=stage, tags=tags)


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def role_overrides(url: str) -> list[str]:
    """Config overrides that send the demo's target and optimizer calls to the fake at ``url`` (no judge)."""
    overrides = []
    for role in ("target", "optimizer"):
        overrides += [f"model.{role}.backend=openai_compatible", f"model.{role}.base_url={url}",
                      f"model.{role}.model=demo-{role}", f"model.{role}.options={{}}"]
    return [*overrides, "model.judge=null"]
