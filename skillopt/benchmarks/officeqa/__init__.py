"""OfficeQA (``officeqa``): numeric and factual QA over US Treasury Bulletins with a local document
tool loop.

Items come from one CSV per split (``uid|id, question, ground_truth|answer, category|difficulty,
source_files, source_docs, split``) or ``items.json``, normalized to ``{id, uid, question,
ground_truth, answers, task_type, source_files, source_docs, split}``. The corpus is the
``treasury_bulletin_YYYY_MM.txt`` files under the document roots (:mod:`.documents`).

:meth:`OfficeQABenchmark.run_episode` runs the tool loop (:mod:`.tools`): each reply holds one
``<tool_call>`` or the final ``<answer>``, for at most ``max_tool_turns`` target calls. The answer
is scored by normalised exact match (hard) and token F1 (soft) after dropping commas, most
punctuation and the words million(s), billion(s), dollar(s) and nominal.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import last_tag, quote_answer, token_f1
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.officeqa.documents import MAX_CANDIDATES_SHOWN, Corpus, docs_roots, oracle_pages
from skillopt.benchmarks.officeqa.tools import PROTOCOL, DocumentTools, parse_tool_call
from skillopt.benchmarks.rows import first_text, hashed_id, read_table, required_text
from skillopt.core.data import Item, read_records
from skillopt.core.errors import BenchmarkSetupError, DataError
from skillopt.llm.chat import Message, assistant, user

BENCHMARK_ID = "officeqa"
DEFAULT_TASK_TYPE = "officeqa"
NATIVE_EXTENSIONS = (".csv",)
#: The item key holding what loading found in the corpus for this item (never written to split files).
DOCUMENTS_KEY = "documents"
NO_TAG = "no-answer: no tool call and no final answer"
NO_TAG_WITHOUT_TOOLS = "no-answer: no final answer"
EMPTY_ANSWER = "no-answer: empty <answer>"

_SYSTEM_INTRO = (
    "You are a financial analyst answering questions from local text files of U.S. Treasury Bulletins "
    "(1939 onward). Answers are usually a value read from a table, sometimes followed by arithmetic."
)
_TOOL_RULES = """\
Rules:
- Use only the tools below and the evidence in this task; never answer a value from memory.
- Locate the right file first, then search briefly and read small windows around the hits.
- Never invent a value. Compute only after you have extracted the exact operands.
- Call the tools directly; do not ask for permission.
- Finish with the final value inside <answer>…</answer>."""
_NO_TOOL_RULES = """\
Rules:
- Use only the parsed pages and hints in this task; never answer a value from memory.
- Never invent a value. Compute only after you have extracted the exact operands.
- Finish with the final value inside <answer>…</answer>."""
_ORACLE_LABEL = "Primary evidence: the parsed pages the question's sources point to."
_CLOSING_TOOLS = "Use the tools to find the evidence, then put the final value inside <answer>…</answer>."
_CLOSING_NO_TOOLS = "Answer from the evidence above; put the final value inside <answer>…</answer>."
# The evaluator keeps word characters, spaces, '.', '-' and '%'.
_DROP_PUNCTUATION = re.compile(r"[^\w\s.\-%]|_")
_DROP_WORDS = re.compile(r"\b(?:millions?|billions?|dollars?|nominal)\b")
_LIST_SPLIT = re.compile(r"\r\n|\r|\n")
_URL_SPLIT = re.compile(r"\s+|,\s*(?=https?://)")


class OfficeQAConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``officeqa``: the corpus, the tool loop and the oracle pages."""

    #: Folders holding the corpus; relative entries are looked up under ``data_root`` first.
    docs_dirs: list[str] | None = None
    #: Run the local tool loop (glob/read/grep); false makes one call with no tools.
    use_local_tools: bool = True
    #: Render the source URLs' pages from ``jsons/<stem>.json`` into the prompt.
    include_oracle_pages: bool = True
    #: The most target calls of one item's tool loop.
    max_tool_turns: int = Field(default=24, ge=1)
    max_tokens: int = Field(default=10000, ge=1)


# ----------------------------------------------------------------------------------------- loading


def parse_source_files(value: Any) -> list[str]:
    """``source_files`` as a list: a list, a JSON list, a newline list (CR/LF), a comma list or one name."""
    def split(text: str) -> list[str]:
        return _LIST_SPLIT.split(text) if _LIST_SPLIT.search(text) else text.split(",")

    return _parse_list(value, "source_files", split)


def parse_source_docs(value: Any) -> list[str]:
    """``source_docs`` as a list of URLs: a list, a JSON list, or URLs split by whitespace or commas."""
    return _parse_list(value, "source_docs", _URL_SPLIT.split)


def _parse_list(value: Any, field: str, split: Callable[[str], list[str]]) -> list[str]:
    """A list field given as a list, a JSON list, or text that ``split`` cuts into entries."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("["):
            return [part.strip() for part in split(text) if part and part.strip()]
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"field {field!r} is not a JSON list: {quote_answer(text)}") from None
    if not isinstance(value, list | tuple):
        raise ValueError(f"field {field!r} must be a list or a string, got {type(value).__name__}")
    return [str(entry).strip() for entry in value if entry is not None and str(entry).strip()]


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An OfficeQA item (idempotent): ``question`` and ``ground_truth|answer`` are required.

    The id is ``uid|id``, else ``"officeqa-" + sha1(question)[:12]``; ``task_type`` is the
    category (``category|difficulty``). Raises ``KeyError(field)`` for a missing field and
    ``ValueError`` for a bad one; the loader names the file and the row.
    """
    question = required_text(row, "question")
    gold = required_text(row, "ground_truth", "answer")
    uid = first_text(row, "uid", "id") or hashed_id("officeqa-", question)
    item = {
        "id": uid,
        "uid": uid,
        "question": question,
        "ground_truth": gold,
        "answers": [gold],
        "task_type": first_text(row, "category", "difficulty", "task_type") or DEFAULT_TASK_TYPE,
        "source_files": parse_source_files(row.get("source_files")),
        "source_docs": parse_source_docs(row.get("source_docs")),
        "split": first_text(row, "split"),
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def item_documents(item: Mapping[str, Any], config: OfficeQAConfig, corpus: Corpus) -> dict[str, Any]:
    """What the corpus holds for ``item``: the roots, the candidate files (absolute paths), the
    rendered oracle pages and the loop settings that ``score`` reports. JSON-serialisable."""
    candidates = corpus.candidates(item.get("source_files") or [])
    pages, included = ("", 0)
    if config.include_oracle_pages:
        pages, included = oracle_pages(corpus, item.get("source_files") or [], item.get("source_docs") or [])
    return {
        "roots": [str(root) for root in corpus.roots],
        "candidate_files": [str(path) for path in candidates],
        "oracle_pages": pages,
        "oracle_pages_included": included,
        "use_local_tools": config.use_local_tools,
        "max_tool_turns": config.max_tool_turns,
    }


# ----------------------------------------------------------------------------------------- scoring


def normalise_answer(text: str) -> str:
    """The evaluator's normalisation: lowercase; drop commas; strip punctuation except ``.``, ``-``
    and ``%``; delete million(s), billion(s), dollar(s) and nominal; collapse spaces.
    ``"$255,724 million"`` → ``"255724"``."""
    text = str(text).lower().replace(",", "")
    text = _DROP_PUNCTUATION.sub("", text)
    return " ".join(_DROP_WORDS.sub(" ", text).split())


def answer_f1(prediction: str, gold: str) -> float:
    """Token F1 of the officeqa-normalised strings: 1 when both are empty, 0 when only one is."""
    return token_f1(prediction, gold, normalise=normalise_answer)


# ------------------------------------------------------------------------------------------ plugin


class OfficeQABenchmark(Benchmark[OfficeQAConfig]):
    """The ``officeqa`` plug-in.

    ``env`` supplies ``$OFFICEQA_DOCS_DIR`` (the process environment by default; tests pass a dict).
    """

    id = BENCHMARK_ID
    GOLD_FIELDS = ("ground_truth", "answers")
    Config = OfficeQAConfig
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/, each with officeqa CSV "
                 "or items.json, and the corpus) or set benchmark.split_dir")

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env: Mapping[str, str] = env if env is not None else os.environ

    def read_rows(self, path: Path, cfg: OfficeQAConfig) -> list[dict[str, Any]]:
        return read_table(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: OfficeQAConfig) -> dict[str, Any]:
        return normalise_row(row)

    def corpus(self, cfg: OfficeQAConfig) -> Corpus:
        """The indexed corpus under the configured roots (empty when no root exists)."""
        config = self.config(cfg)
        return Corpus.index(docs_roots(config.docs_dirs, config.data_root, self.env))

    def load_split(self, cfg: OfficeQAConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias), each carrying its
        ``documents`` (found in the corpus at load, never written to split files)."""
        config = self.config(cfg)
        items = super().load_split(config, split, run_dir=run_dir)
        corpus = self.corpus(config)
        return [Item({**item, DOCUMENTS_KEY: item_documents(item, config, corpus)}) for item in items]

    def _documents(self, item: Item, config: OfficeQAConfig) -> dict[str, Any]:
        found = item.get(DOCUMENTS_KEY)
        return found if isinstance(found, dict) else item_documents(item, config, self.corpus(config))

    def max_target_calls(self, cfg: OfficeQAConfig) -> int:
        """The tool loop's calls (one without local tools; an item may turn them off, so this is the most)."""
        return cfg.max_tool_turns if cfg.use_local_tools else 1

    def build_messages(self, item: Item, skill: str, cfg: OfficeQAConfig) -> list[Message]:
        """System: the analyst role, the skill, the rules and (with tools) the tool protocol.
        User: ``## Question``, ``## Oracle Parsed Pages``, ``## Candidate Files`` (tools only, ≤ 20)
        and ``## Source Hints``; empty sections are left out. Never reads gold."""
        config = self.config(cfg)
        docs = self._documents(item, config)
        tools = bool(docs["use_local_tools"])
        sections = [f"## Question\n{item['question']}"]
        if docs["oracle_pages"]:
            sections.append(f"## Oracle Parsed Pages\n{_ORACLE_LABEL}\n\n{docs['oracle_pages']}")
        files = docs["candidate_files"]
        if tools and files:
            shown = [f"- {path}" for path in files[:MAX_CANDIDATES_SHOWN]]
            if len(files) > MAX_CANDIDATES_SHOWN:
                shown.append(f"({len(files) - MAX_CANDIDATES_SHOWN} more; use glob)")
            sections.append("## Candidate Files\n" + "\n".join(shown))
        if item.get("source_docs"):
            sections.append("## Source Hints\n" + "\n".join(f"- {url}" for url in item["source_docs"]))
        sections.append(_CLOSING_TOOLS if tools else _CLOSING_NO_TOOLS)
        rules = f"{_TOOL_RULES}\n\n{PROTOCOL}" if tools else _NO_TOOL_RULES
        return [self.system_message(_SYSTEM_INTRO, skill, rules), user("\n\n".join(sections))]

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult:
        """The tool loop: up to ``max_tool_turns`` target calls. A reply with ``<answer>`` ends it; a
        ``<tool_call>`` is run (an error string for a bad call or path), logged as a ``tool_call``
        event and answered with ``<tool_result>…</tool_result>``; a reply with neither ends it.
        With ``use_local_tools: false`` it is one call. Past ``ctx.deadline`` no call starts; a
        target error propagates. ``skill`` is already in ``ctx.messages``."""
        config = self.config(ctx.cfg)
        docs = self._documents(item, config)
        budget = config.max_tool_turns if docs["use_local_tools"] else 1
        tools = DocumentTools(docs["candidate_files"], docs["roots"])
        messages = list(ctx.messages)
        text, calls = "", 0
        while calls < budget and time.monotonic() < ctx.deadline:
            calls += 1
            text = ctx.ask(messages, turn=calls, max_tokens=config.max_tokens)
            call = parse_tool_call(text) if docs["use_local_tools"] else None
            if last_tag(text, "answer") is not None or call is None:
                break
            observation = tools.run(call)
            ctx.record({"type": "tool_call", "turn": calls, "name": call.name, "command": call.command,
                        "observation": observation})
            messages = [*messages, assistant(text), user(f"<tool_result>\n{observation}\n</tool_result>")]
        return EpisodeResult(text, n_turns=calls, answered=calls > 0)

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = normalised exact match with the gold, soft = token F1 of the last ``<answer>``.

        No tag: ``no-answer`` (the tool budget when the last reply was still a tool call). Never
        calls the judge."""
        docs = item.get(DOCUMENTS_KEY) or {}
        golds = [str(gold) for gold in item["answers"]]
        extras: dict[str, Any] = {
            "resolved_source_paths": list(docs.get("candidate_files", []))
            if item.get("source_files")
            else [],
            "oracle_pages_included": int(docs.get("oracle_pages_included", 0)),
            "oracle_pages_chars": len(docs.get("oracle_pages", "")),
            "use_local_tools": bool(docs.get("use_local_tools", True)),
        }
        answer = last_tag(response_text, "answer")
        if not answer:
            reason = EMPTY_ANSWER if answer is not None else self._missing_reason(response_text, docs)
            return Score(hard=0.0, soft=0.0, fail_reason=reason, extras=extras, expected=golds[0],
                         detail="no answer to score")
        predicted = normalise_answer(answer)
        em = any(predicted == normalise_answer(gold) for gold in golds)
        f1 = 1.0 if em else max(answer_f1(answer, gold) for gold in golds)
        fail = "" if em else (
            f"wrong: predicted '{quote_answer(answer)}' (normalised '{quote_answer(predicted)}'), "
            f"expected '{quote_answer(golds[0])}'"
        )
        return Score(
            hard=float(em), soft=f1, predicted_answer=answer, fail_reason=fail,
            extras={**extras, "em": float(em), "f1": round(f1, 4)},
            expected=golds[0] if len(golds) == 1 else str(golds),
            detail=f"normalised: predicted '{quote_answer(predicted)}' vs gold "
                   f"'{quote_answer(normalise_answer(golds[0]))}'; EM={int(em)} F1={f1:.2f}",
        )

    @staticmethod
    def _missing_reason(response_text: str, docs: Mapping[str, Any]) -> str:
        if not docs.get("use_local_tools", True):
            return NO_TAG_WITHOUT_TOOLS
        if parse_tool_call(response_text) is not None:
            return f"no-answer: tool-turn budget exhausted ({docs.get('max_tool_turns', '?')})"
        return NO_TAG

    def extract_answer(self, response_text: str) -> str | None:
        """The last ``<answer>`` tag under the evaluator's normalisation, or None."""
        answer = last_tag(response_text, "answer")
        return None if answer is None else normalise_answer(answer)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """The distinct categories (``easy``, ``hard``), sorted."""
        return sorted({item.task_type for item in items}) or ["easy", "hard"]

    def preflight(self, cfg: OfficeQAConfig) -> None:
        """The split folder, at least one document root, and every item's ``source_files`` under a
        root; each miss raises ``BenchmarkSetupError`` saying how to fix it."""
        config = self.config(cfg)
        super().preflight(config)
        roots = docs_roots(config.docs_dirs, config.data_root, self.env)
        if not roots:
            looked = [*(config.docs_dirs or []), *([config.data_root] if config.data_root else [])]
            raise BenchmarkSetupError(
                f"officeqa: no document root exists (looked at {looked or 'nothing'} and "
                "$OFFICEQA_DOCS_DIR); set benchmark.docs_dirs to the folder holding "
                "treasury_bulletin_*.txt, or set $OFFICEQA_DOCS_DIR"
            )
        corpus = Corpus.index(roots)
        missing = sorted(
            {
                name
                for row in _source_rows(config, config.split_mode or self.default_split_mode)
                for name in corpus.missing(row)
            }
        )
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise BenchmarkSetupError(
                f"officeqa: {len(missing)} document(s) named in source_files are under no root "
                f"({', '.join(str(root) for root in roots)}): {shown}; download the corpus into a docs_dirs "
                "folder"
            )


def _source_rows(config: OfficeQAConfig, split_mode: str) -> list[list[str]]:
    """The ``source_files`` of every readable row (bad rows are the loader's to report)."""
    paths: list[Path] = []
    if split_mode == "split_dir" and config.split_dir:
        for split in ("train", "val", "test"):
            folder = Path(config.split_dir) / split
            items = folder / "items.json"
            found = [items] if items.is_file() else sorted(folder.glob("*.csv"))[:1]
            paths += found
    elif split_mode == "ratio" and config.data_path:
        paths.append(Path(config.data_path))
    rows: list[list[str]] = []
    for path in paths:
        try:
            raw = read_records(path) if path.name == "items.json" else read_table(path)
        except (DataError, OSError):
            continue
        for row in raw:
            try:
                rows.append(parse_source_files(row.get("source_files")))
            except ValueError:
                continue
    return rows


plugin = OfficeQABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "DOCUMENTS_KEY",
    "OfficeQABenchmark",
    "OfficeQAConfig",
    "answer_f1",
    "item_documents",
    "normalise_answer",
    "normalise_row",
    "parse_source_docs",
    "parse_source_files",
    "plugin",
]
