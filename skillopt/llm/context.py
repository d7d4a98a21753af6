"""How much a model can read: context windows and the room they leave for a prompt.

A role's context window comes, first match wins, from

1. its ``model.<role>.context_tokens`` setting;
2. the backend, where it can say: ``openai_compatible`` servers list it in ``GET /models``
   (vLLM's ``max_model_len``, llama.cpp's ``meta.n_ctx`` / ``/props``, LM Studio's and gateways'
   ``context_length``), the ``local`` backend uses its ``options.n_ctx``;
3. ``KNOWN_CONTEXT_WINDOWS``, by ``price_model`` glob;
4. ``DEFAULT_CONTEXT_TOKENS``.

A server that rejects a prompt as too long often names its window (``maximum context length is
4096 tokens``, llama.cpp's ``n_ctx``); ``window_from_error`` reads it so the client can shrink
the prompt to fit and remember the window for later calls.

Prompts are sized in characters at ``CHARS_PER_TOKEN`` characters per token: a deliberately low
figure (English prose runs near 4 with common tokenizers; JSON, code and numbers lower), so an
estimate errs towards a prompt that fits.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

#: Characters per token when sizing prompts (see the module docstring for why it is low).
CHARS_PER_TOKEN = 3
#: The window assumed when neither the setting, the backend nor the table knows one.
DEFAULT_CONTEXT_TOKENS = 32_768
#: The reply gets at least this share of the window when ``max_tokens`` asks for more than fits.
ANSWER_SHARE = 4
#: Characters kept free for what a backend adds to the prompt (a schema instruction, chat template).
PROMPT_MARGIN_CHARS = 600

#: Context windows of well-known models by ``price_model`` glob (lower case); first match wins.
KNOWN_CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1*", 1_047_576),
    ("gpt-5*", 400_000),
    ("o1-mini*", 128_000),
    ("o1*", 200_000),
    ("o3*", 200_000),
    ("o4*", 200_000),
    ("gpt-4o*", 128_000),
    ("gpt-4-turbo*", 128_000),
    ("gpt-3.5*", 16_385),
    ("claude-*", 200_000),
    ("deepseek-*", 65_536),
    ("qwen*", 32_768),
    ("*smollm2*", 8_192),
    ("*llama-3*", 131_072),
)


def known_context_tokens(price_model: str | None) -> int | None:
    """The table's window for ``price_model``, or None when the table has no entry for it."""
    name = (price_model or "").lower()
    for pattern, tokens in KNOWN_CONTEXT_WINDOWS:
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name.rsplit("/", 1)[-1], pattern):
            return tokens
    return None


_WINDOW_PATTERNS = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context window of (\d+)", re.I),
    re.compile(r"\bn_ctx\"?\s*[:=]\s*(\d+)", re.I),
    re.compile(r"context size[^0-9]{0,40}(\d{3,})", re.I),
)


def window_from_error(text: str) -> int | None:
    """The context window a "prompt too long" error message names, if it names one."""
    for pattern in _WINDOW_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


@dataclass(frozen=True)
class PromptRoom:
    """What one call may send: ``prompt_chars`` for the prompt, ``answer_tokens`` for the reply."""

    context_tokens: int
    answer_tokens: int
    #: Characters per token: ``CHARS_PER_TOKEN``, or lower when the server's usage showed a denser text.
    chars_per_token: float = CHARS_PER_TOKEN

    @classmethod
    def of(cls, context_tokens: int, max_tokens: int | None,
           chars_per_token: float = CHARS_PER_TOKEN) -> PromptRoom:
        """The room in a window of ``context_tokens`` for a reply of up to ``max_tokens``: the reply
        keeps ``max_tokens`` when that leaves three quarters of the window to the prompt, else a
        quarter of the window."""
        share = context_tokens // ANSWER_SHARE
        return cls(context_tokens=context_tokens, answer_tokens=max(1, min(max_tokens or share, share)),
                   chars_per_token=chars_per_token)

    @property
    def prompt_chars(self) -> int:
        return max(0, int((self.context_tokens - self.answer_tokens) * self.chars_per_token)
                   - PROMPT_MARGIN_CHARS)

    def prompt_tokens(self, prompt_chars: int) -> int:
        """The tokens a prompt of ``prompt_chars`` characters is taken to use (rounded up)."""
        return math.ceil(prompt_chars / self.chars_per_token)

    def answer_cap(self, prompt_chars: int, max_tokens: int | None) -> int:
        """The reply cap for a prompt of ``prompt_chars``: ``max_tokens`` unless that would overflow
        the window, then what the window leaves (never below ``answer_tokens``)."""
        free = self.context_tokens - self.prompt_tokens(prompt_chars)
        cap = max_tokens if max_tokens is not None else self.answer_tokens
        return cap if cap <= free else max(self.answer_tokens, free)
