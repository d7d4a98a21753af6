"""Tokens and cost of one rollout, recorded on its result row (``ItemResult.usage``).

``ItemUsage`` wraps the target client a rollout talks to and adds up the usage of every reply it gets,
a reply served from the reply store included (it carries the usage of the call that made it), so a
row's usage is what the item costs with this skill, however much of it the cache paid. The cost is the
price table's for the role's price model (``None`` when the model is unpriced). Exec targets report no
per-call usage here, so their rows keep an empty ``usage``.
"""

from __future__ import annotations

import threading
from typing import Any

from skillopt.llm.chat import ChatRequest, ChatResponse


class ItemUsage:
    """The target client of one rollout, counting the tokens of its replies (thread-safe)."""

    def __init__(self, client: Any, *, prices: Any, backend: str, price_model: str | None) -> None:
        self._client = client
        self._prices = prices
        self._backend = backend
        self._price_model = price_model
        self._lock = threading.Lock()
        self._prompt = 0
        self._completion = 0
        self._calls = 0
        self._usd: float | None = 0.0

    def chat(self, request: ChatRequest) -> ChatResponse:
        response: ChatResponse = self._client.chat(request)
        cost = self._prices.cost(self._backend, self._price_model, response.usage)
        with self._lock:
            self._calls += 1
            self._prompt += response.usage.prompt_tokens or 0
            self._completion += response.usage.completion_tokens or 0
            self._usd = None if cost is None or self._usd is None else self._usd + cost
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def totals(self) -> dict[str, Any]:
        """``{calls, prompt_tokens, completion_tokens, usd}`` of the replies so far; {} before any."""
        with self._lock:
            if not self._calls:
                return {}
            return {"calls": self._calls, "prompt_tokens": self._prompt,
                    "completion_tokens": self._completion, "usd": self._usd}
