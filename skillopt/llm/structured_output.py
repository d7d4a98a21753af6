"""How a structured call asks its backend for a reply of a given shape, and what it learned doing so.

``model.<role>.structured_output`` picks the way:

- ``json_schema``: the backend constrains decoding to the response schema: OpenAI and Azure
  ``response_format``/``text.format`` with ``json_schema`` (strict where the schema allows), Anthropic
  one forced tool whose input schema is the response schema, OpenAI-compatible servers
  ``response_format`` with ``json_schema`` (llama.cpp, vLLM, SGLang, Ollama take it), the ``local``
  backend a JSON grammar.
- ``json_object``: the server is asked for any JSON object; the schema travels in the prompt.
- ``prompt``: nothing special on the wire; the schema travels in the prompt.
- ``auto`` (the default): what the backend does best. On ``openai_compatible`` that is ``json_schema``
  unless the preset knows the server takes only ``json_object``; the first structured call to an
  endpoint is the probe: a server that rejects the field (HTTP 400/422) is remembered for the rest of
  the run, gets ``json_object`` with the schema beside it (``{"type": "json_object", "schema": …}``: how
  llama-cpp-python's server takes a schema), and if it refuses that too, the schema in the prompt; one note
  says so each time.

Whatever the mode, the reply is still validated against the schema and parsed from text as a last
resort (``skillopt.llm.json_extract``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel

from skillopt.llm.json_extract import strict_json_schema

log = logging.getLogger("skillopt.llm")

#: The order an endpoint that refuses a mode falls back in.
FALLBACKS: tuple[str, ...] = ("json_schema", "json_object", "prompt")
StructuredOutput = Literal["auto", "json_schema", "json_object", "prompt"]
STRUCTURED_OUTPUTS: tuple[str, ...] = ("auto", "json_schema", "json_object", "prompt")


def wire_schema(schema: type[BaseModel]) -> tuple[dict[str, Any], bool]:
    """``schema`` as a constrained-output request carries it, and whether it is strict.

    Strict when the schema can be (every object closed, every key required); a schema with a free-form
    map cannot, and is sent as it is with ``strict: false``: servers still constrain to it."""
    try:
        return strict_json_schema(schema), True
    except ValueError:
        return schema.model_json_schema(), False


class StructuredModes:
    """What each endpoint turned out to accept, shared by the roles of one run (thread-safe).

    Keys are ``backend|base_url|model``: roles on one server share what it taught."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fallen_to: dict[str, str] = {}
        self._settled: set[str] = set()
        self._probes: dict[str, threading.Lock] = {}
        #: Held while a refused call decides the endpoint's next mode: two calls refused the same way at once
        #: move it one step, not two.
        self.refusals = threading.Lock()

    @contextlib.contextmanager
    def first_call(self, key: str, *, alone: bool = True) -> Iterator[None]:
        """Around a structured call to endpoint ``key``: the endpoint's first one runs alone (it is the
        probe: what it learns, a refused mode or the context window, every later call starts with); once it
        has ended, calls pass straight through. With ``alone`` False (the window is known already) there is
        nothing worth a probe: calls that meet a refused mode at once move the endpoint one step
        (``refusals``), and each call that overflows shrinks by itself."""
        if not alone:
            yield
            return
        with self._lock:
            probe = None if key in self._settled else self._probes.setdefault(key, threading.Lock())
        if probe is None:
            yield
            return
        with probe:
            with self._lock:
                settled = key in self._settled
            if not settled:
                try:
                    yield
                finally:
                    with self._lock:
                        self._settled.add(key)
                return
        yield  # the probe ended while this call waited for it: go on beside the others

    def fallen_to(self, key: str) -> str | None:
        """The mode endpoint ``key`` was moved to after refusing the one before, or None."""
        with self._lock:
            return self._fallen_to.get(key)

    def fall_to(self, key: str, mode: str) -> bool:
        """Remember that endpoint ``key`` now gets ``mode``; True the first time (say so then)."""
        with self._lock:
            if FALLBACKS.index(self._fallen_to.get(key, "json_schema")) >= FALLBACKS.index(mode):
                return False
            self._fallen_to[key] = mode
            return True
