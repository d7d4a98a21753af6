"""The OfficeQA local document tools and their text protocol.

A target reply holds either one ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` or the
final ``<answer>``; the harness answers a call with ``<tool_result>…</tool_result>``. The tools —
``glob(pattern)``, ``read(path, start=1, limit=80)`` and ``grep(pattern, path)`` — see only the
item's candidate files: every path is resolved to its real path (symlinks followed) and anything
else, a ``..`` escape or a symlink leaving the roots included, gets ``error: path not allowed``.
A tool never raises for a bad call; the error is the observation.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillopt.benchmarks.officeqa.documents import inside

TOOL_NAMES = ("glob", "read", "grep")
NOT_ALLOWED = "error: path not allowed"
GLOB_MAX = 50
READ_DEFAULT_LIMIT = 80
READ_MAX_CHARS = 4000
GREP_MAX_HITS = 20
GREP_LINE_CHARS = 300
TRUNCATED = "...[truncated]"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.IGNORECASE | re.DOTALL)

PROTOCOL = """\
## Tools
You can call one tool per reply. Write exactly one block of this form and nothing after it:
<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>
The harness runs it and replies with <tool_result>…</tool_result>. Tools:
- glob(pattern): the candidate files whose path or name matches a shell pattern such as "*1950*" (at most 50).
- read(path, start=1, limit=80): numbered lines of one file from line `start` (at most 4000 characters).
- grep(pattern, path): case-insensitive literal search in one file; at most 20 "lineno: line" hits.
Only the candidate files listed in the task can be opened. When you are done, reply with the final
value inside <answer>…</answer> instead of a tool call."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed ``<tool_call>``: ``error`` is set (and name may be ``invalid``) when it is malformed."""

    name: str
    arguments: Mapping[str, Any]
    command: str
    error: str = ""


def parse_tool_call(text: str) -> ToolCall | None:
    """The first ``<tool_call>`` of a reply, or None when it has none.

    Malformed JSON, a non-object, a missing name or non-object arguments give a ``ToolCall`` with
    ``error`` set, so the harness can answer it with an error observation.
    """
    found = _TOOL_CALL.search(text or "")
    if found is None:
        return None
    command = found.group(1).strip()
    try:
        payload = json.loads(command)
    except json.JSONDecodeError as exc:
        return ToolCall(
            "invalid", {}, command, f"error: malformed tool call JSON ({exc.msg} at char {exc.pos})"
        )
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall(
            "invalid", {}, command, 'error: a tool call must be {"name": str, "arguments": {...}}'
        )
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return ToolCall(payload["name"], {}, command, "error: tool call arguments must be a JSON object")
    return ToolCall(payload["name"], arguments, command)


class DocumentTools:
    """``glob``/``read``/``grep`` over one item's candidate files inside the corpus roots."""

    def __init__(self, candidate_files: Sequence[str | Path], roots: Sequence[str | Path]) -> None:
        self.roots = [Path(root).resolve() for root in roots]
        # Shown path -> real path; a candidate whose real path leaves every root is never exposed.
        self.files: dict[str, Path] = {}
        for candidate in candidate_files:
            real = Path(candidate).resolve()
            if real.is_file() and inside(real, self.roots):
                self.files[str(candidate)] = real
        self._allowed = set(self.files.values())
        self._by_name: dict[str, Path] = {}
        for shown, real in self.files.items():
            self._by_name.setdefault(Path(shown).name, real)

    def run(self, call: ToolCall) -> str:
        """The observation for one call: the tool's output or an ``error: …`` line; never raises."""
        if call.error:
            return call.error
        try:
            if call.name == "glob":
                return self.glob(_text_arg(call.arguments, "pattern"))
            if call.name == "read":
                return self.read(
                    _text_arg(call.arguments, "path"),
                    start=_int_arg(call.arguments, "start", 1),
                    limit=_int_arg(call.arguments, "limit", READ_DEFAULT_LIMIT),
                )
            if call.name == "grep":
                return self.grep(_text_arg(call.arguments, "pattern"), _text_arg(call.arguments, "path"))
        except _BadArgument as exc:
            return f"error: {call.name}: {exc}"
        return f"error: unknown tool {call.name!r}; the tools are {', '.join(TOOL_NAMES)}"

    def resolve(self, path: str) -> Path | None:
        """The allowed real path ``path`` names, or None. A bare file name names a candidate; any
        other path is resolved (``..`` and symlinks included) and must be a candidate file."""
        if not path.strip():
            return None
        if "/" not in path and "\\" not in path and path in self._by_name:
            return self._by_name[path]
        try:
            real = Path(path).expanduser().resolve()
        except (OSError, RuntimeError):
            return None
        return real if real in self._allowed else None

    def glob(self, pattern: str) -> str:
        matches = [
            shown for shown in sorted(self.files)
            if fnmatch.fnmatch(shown, pattern) or fnmatch.fnmatch(Path(shown).name, pattern)
        ]
        if not matches:
            return "no matching files"
        more = f"\n... ({len(matches) - GLOB_MAX} more)" if len(matches) > GLOB_MAX else ""
        return "\n".join(matches[:GLOB_MAX]) + more

    def read(self, path: str, *, start: int = 1, limit: int = READ_DEFAULT_LIMIT) -> str:
        real = self.resolve(path)
        if real is None:
            return NOT_ALLOWED
        if start < 1 or limit < 1:
            return "error: read: start and limit must be >= 1"
        lines = _lines(real)
        if lines is None:
            return "error: read: the file cannot be read"
        if start > len(lines):
            return f"error: read: start {start} is past the end of the file ({len(lines)} lines)"
        text = "\n".join(
            f"{number}: {line}" for number, line in enumerate(lines[start - 1 : start - 1 + limit], start)
        )
        if len(text) > READ_MAX_CHARS:
            text = text[: READ_MAX_CHARS - len(TRUNCATED)] + TRUNCATED
        return text

    def grep(self, pattern: str, path: str) -> str:
        real = self.resolve(path)
        if real is None:
            return NOT_ALLOWED
        if not pattern:
            return "error: grep: empty pattern"
        lines = _lines(real)
        if lines is None:
            return "error: grep: the file cannot be read"
        needle = pattern.casefold()
        hits = [(number, line) for number, line in enumerate(lines, 1) if needle in line.casefold()]
        if not hits:
            return "no matches"
        shown = [f"{number}: {line.strip()[:GREP_LINE_CHARS]}" for number, line in hits[:GREP_MAX_HITS]]
        if len(hits) > GREP_MAX_HITS:
            shown.append(f"... ({len(hits) - GREP_MAX_HITS} more matches)")
        return "\n".join(shown)


class _BadArgument(ValueError):
    pass


def _text_arg(arguments: Mapping[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise _BadArgument(f"argument {name!r} must be a string")
    return value


def _int_arg(arguments: Mapping[str, Any], name: str, default: int) -> int:
    value = arguments.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | str)
        or not str(value).strip().lstrip("-").isdigit()
    ):
        raise _BadArgument(f"argument {name!r} must be an integer")
    return int(value)


def _lines(path: Path) -> list[str] | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
