"""SpreadsheetBench (``spreadsheetbench``): write Python that transforms an ``.xlsx`` workbook per an
instruction, graded cell by cell on every test case.

Items are ``{id, instruction, spreadsheet_path, instruction_type, answer_position, answer_sheet}``
(``items.json`` per split); ``spreadsheet_path`` is a task folder holding the test-case pairs (see
:func:`~skillopt.benchmarks.spreadsheetbench.cells.find_test_cases`), resolved against
``data_root``. The target sees only case 1's input, as a preview, and replies with one fenced
python block; the harness runs it through :func:`skillopt.sandbox.confine.run_sandboxed` with
``INPUT_PATH``/``OUTPUT_PATH`` defined. ``score`` re-runs the final script on every case:
**hard = all cases pass, soft = passed / cases**.

``mode: multi`` (the default) gives the target up to ``max_turns`` rounds: no code → ask again; an
exec error → the traceback tail; on train rollouts only (``training`` tag), the wrong cells of case
1 with the target's own values, never the expected ones.
"""

from __future__ import annotations

import ast
import re
import shutil
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, skill_section
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.rows import confined_path, roots_of
from skillopt.benchmarks.spreadsheetbench.cells import (
    CaseOutcome,
    compare_workbooks,
    find_test_cases,
    sheet_preview,
    split_ranges,
    verification_table,
)
from skillopt.core.data import Item
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import Message, assistant, system, user
from skillopt.sandbox.confine import (
    SandboxMode,
    SandboxResult,
    SandboxUnavailable,
    require_sandbox,
    run_sandboxed,
)
from skillopt.sandbox.process_group import scratch_folder

BENCHMARK_ID = "spreadsheetbench"
TASK_TYPES = {"Cell-Level Manipulation": "cell_level", "Sheet-Level Manipulation": "sheet_level"}
DEFAULT_TASK_TYPES = ["cell_level", "sheet_level"]
INPUT_NAME, OUTPUT_NAME, SCRIPT_NAME = "input.xlsx", "output.xlsx", "solution.py"
TRACEBACK_CHARS = 3000
PREDICTION_CHARS = 4000
NO_CODE = "no-answer: no code in the reply"
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)

_SYSTEM_INTRO = (
    "You are an expert Python spreadsheet programmer. You write one Python script that reads the workbook "
    "at INPUT_PATH, applies the instruction, and saves the result to OUTPUT_PATH. INPUT_PATH and OUTPUT_PATH "
    "are already defined when your script runs: use them, never hard-code paths. Use only the standard "
    "library, openpyxl and pandas. Never call input(). The script runs offline with a time and memory limit."
)
_REPLY_FORMAT = (
    "Reply with exactly one fenced ```python code block holding the complete script, and nothing else."
)
_TASK = (
    "# Task\nWrite the complete Python script that applies the instruction to the workbook at INPUT_PATH and "
    "saves it to OUTPUT_PATH. Leave every other cell untouched. Loop over the real rows and columns of the "
    "data instead of fixed counts: the script is run on other workbooks of the same layout. Reply with only "
    "the ```python block."
)
_ASK_AGAIN = "Your reply had no Python code. Reply with the complete script in one ```python block."
_FIX_ERROR = (
    "Your script failed when run on the input workbook. The end of its error output:\n```\n{tail}\n```\n"
    "Fix it and reply with the complete corrected script in one ```python block."
)
_NO_OUTPUT = (
    "Your script ran but wrote no workbook at OUTPUT_PATH. Save the result with "
    "`workbook.save(OUTPUT_PATH)` and reply with the complete corrected script in one ```python block."
)
_WRONG_CELLS = "Your script ran, but these graded cells are wrong (shown with YOUR values):\n{cells}\n" \
               "Re-read the instruction and the data, then reply with the complete corrected script in one " \
               "```python block."


class SpreadsheetBenchConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``spreadsheetbench``."""

    #: ``single``: one call; ``multi``: up to ``max_turns`` repair rounds (exec errors, train-only cell
    # feedback).
    mode: Literal["single", "multi"] = "multi"
    #: Seconds one sandboxed run of the script may take (also bounded by the item's deadline).
    code_timeout: float = Field(default=120, gt=0)
    #: The sandbox's address-space limit in MiB.
    sandbox_mem_mb: int = Field(default=2048, ge=64)
    max_tokens: int = Field(default=16384, ge=1)


# ----------------------------------------------------------------------------------------- loading


def normalise_row(row: Mapping[str, Any], roots: Sequence[str | Path | None] = ()) -> dict[str, Any]:
    """A SpreadsheetBench item (idempotent): ``id``, ``instruction`` and ``answer_position`` are required;
    ``spreadsheet_path`` defaults to ``spreadsheet/<id>``; ``task_type`` comes from ``instruction_type``.
    A ``spreadsheet_path`` that resolves outside ``roots`` raises ``ValueError``."""
    for name in ("id", "instruction", "answer_position"):
        if row.get(name) in (None, ""):
            raise KeyError(name)
    if not isinstance(row["instruction"], str) or not isinstance(row["answer_position"], str):
        raise ValueError("fields 'instruction' and 'answer_position' must be strings")
    item_id = str(row["id"])
    instruction_type = str(row.get("instruction_type") or "")
    item = {
        "id": item_id,
        "instruction": row["instruction"],
        "spreadsheet_path": str(row.get("spreadsheet_path") or f"spreadsheet/{item_id}"),
        "instruction_type": instruction_type,
        "answer_position": row["answer_position"],
        "answer_sheet": row.get("answer_sheet") or None,
        "task_type": TASK_TYPES.get(instruction_type) or row.get("task_type") or "other",
    }
    resolve_task_dir(str(item["spreadsheet_path"]), roots)  # a folder leaving the data roots is a bad row
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def resolve_task_dir(spreadsheet_path: str, roots: Sequence[str | Path | None]) -> Path:
    """The item's task folder, confined to ``roots`` (a path resolving outside them raises
    ``ValueError``): the first root that holds it, else the first root's (missing) folder, so the
    error names the expected place."""
    folders = roots_of(*roots)
    found = confined_path(spreadsheet_path, folders, field="spreadsheet_path")
    if found is not None:
        return found
    path = Path(spreadsheet_path)
    return (folders[0] / path).resolve() if folders and not path.is_absolute() else path


# -------------------------------------------------------------------------------------- execution


def extract_code(text: str) -> str:
    """The first fenced block (any language tag), else the whole reply; stripped."""
    match = _FENCE.search(text)
    return (match.group(2) if match else text).strip()


def prepare_script(code: str) -> str:
    """``code`` with the harness's ``INPUT_PATH``/``OUTPUT_PATH`` defined first and the target's own
    top-level assignments to them removed (code that does not parse is left as is; it fails when run)."""
    lines = code.splitlines()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    for node in tree.body if tree else []:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names = {getattr(t, "id", None) for t in targets}
        if names & {"INPUT_PATH", "OUTPUT_PATH"} and node.end_lineno is not None:
            for index in range(node.lineno - 1, node.end_lineno):
                lines[index] = ""
            lines[node.lineno - 1] = "pass  # INPUT_PATH/OUTPUT_PATH are set by the harness"
    header = f"INPUT_PATH = {INPUT_NAME!r}\nOUTPUT_PATH = {OUTPUT_NAME!r}\n"
    return header + "\n".join(lines) + "\n"


def execute(code: str, input_path: Path, *, timeout_s: float, mem_mb: int,
            deny_read: Sequence[str], sandbox: SandboxMode = "bwrap") -> SandboxResult:
    """Run the target's ``code`` on a temp copy of ``input_path`` through the sandbox.

    The copy's folder is removed when skillopt exits while the code runs (Ctrl-C, SIGTERM, an error), like
    an exec target's workspace."""
    with scratch_folder("skillopt-sheet-") as workspace:
        shutil.copyfile(input_path, workspace / INPUT_NAME)
        (workspace / SCRIPT_NAME).write_text(prepare_script(code), encoding="utf-8")
        return run_sandboxed([SCRIPT_NAME], workspace, timeout_s, mem_mb, collect=[OUTPUT_NAME],
                             deny_read=deny_read, mode=sandbox)


def exec_failure(run: SandboxResult) -> str:
    """The case's fail_reason for a run that produced no usable output, or ""."""
    if not run.ok:
        return f"error: exec {run.reason}"[:500]
    if OUTPUT_NAME not in run.outputs:
        return "error: output not found"
    return ""


# ------------------------------------------------------------------------------------------ plugin


class SpreadsheetBenchBenchmark(Benchmark[SpreadsheetBenchConfig]):
    """The ``spreadsheetbench`` plug-in.

    Gold lives in the golden workbooks, never in item fields, so ``GOLD_FIELDS`` is empty; loaded
    items carry their resolved ``task_dir`` and sandbox settings (``score`` gets no config).
    """

    id = BENCHMARK_ID
    Config = SpreadsheetBenchConfig
    default_task_type = "other"
    #: openpyxl and pandas come with ``pip install 'skillopt[spreadsheetbench]'``.
    extras = ("spreadsheetbench",)
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/ items.json and the "
                 "spreadsheet/ tree) or set benchmark.split_dir")

    def normalise_row(self, row: Mapping[str, Any], cfg: SpreadsheetBenchConfig) -> dict[str, Any]:
        return normalise_row(row, self.data_roots(cfg))

    def load_split(self, cfg: SpreadsheetBenchConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``."""
        config = self.config(cfg)
        deny = tuple(str(Path(root).resolve()) for root in (config.data_root, config.split_dir) if root)
        roots = self.data_roots(config)
        return [
            Item(
                {
                    **item,
                    "task_dir": str(resolve_task_dir(item["spreadsheet_path"], roots)),
                    "deny_read": deny,
                    "code_timeout": config.code_timeout,
                    "sandbox_mem_mb": config.sandbox_mem_mb,
                    "sandbox": config.sandbox,
                }
            )
            for item in super().load_split(config, split, run_dir=run_dir)
        ]

    def build_messages(self, item: Item, skill: str, cfg: SpreadsheetBenchConfig) -> list[Message]:
        """System: role, paths, libraries, reply format, then ``## Skill`` at the end. User: instruction,
        type, answer position and the preview of case 1's input; then ``# Task``. Never opens a golden
        file."""
        sheet = f" (sheet {item['answer_sheet']})" if item.get("answer_sheet") else ""
        sections = [
            f"# Instruction\n{item['instruction']}",
            f"Instruction type: {item.get('instruction_type') or 'unspecified'}",
            f"Expected answer position: {item['answer_position']}{sheet}",
            f"# Input spreadsheet preview\n{self.preview(item)}",
            _TASK,
        ]
        return [system(f"{_SYSTEM_INTRO}\n\n{_REPLY_FORMAT}\n\n{skill_section(skill)}".rstrip()),
                user("\n\n".join(sections))]

    def preview(self, item: Item) -> str:
        """The preview of case 1's input (the only workbook the target ever sees)."""
        cases = find_test_cases(Path(item.get("task_dir") or item["spreadsheet_path"]))
        return sheet_preview(cases[0].input_path) if cases else "(no input workbook found)"

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult:
        """``single``: one call. ``multi``: up to ``max_turns`` rounds; each script is run on case 1 and
        exec errors go back as feedback; on train rollouts (``training`` tag) the wrong cells go back with
        the target's own values. Stops when case 1 passes, on val/test after a clean run, when the target
        repeats its last script, or at ``ctx.deadline``."""
        config = self.config(ctx.cfg)
        rounds = 1 if config.mode == "single" else config.max_turns
        training = bool(ctx.tags.get("training"))
        cases = find_test_cases(Path(item["task_dir"]))
        messages = list(ctx.messages)
        final, previous, turn = "", None, 0
        for turn in range(1, rounds + 1):
            text = ctx.ask(messages, turn=turn, max_tokens=config.max_tokens)
            code = extract_code(text)
            final = text if code or not final else final
            if turn == rounds or not cases or (code and code == previous):
                break
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 1:
                break
            feedback = self._feedback(item, code, cases, config, training, timeout_s=remaining)
            if feedback is None:
                break
            previous = code or previous
            ctx.record({"type": "feedback", "role": "user", "turn": turn, "content": feedback})
            messages = [*messages, assistant(text), user(feedback)]
        return EpisodeResult(final, n_turns=turn, answered=turn > 0)

    def _feedback(self, item: Item, code: str, cases: Sequence[Any], config: SpreadsheetBenchConfig,
                  training: bool, *, timeout_s: float) -> str | None:
        """The next round's feedback, or None to stop (case 1 passed, or no cell feedback off train)."""
        if not code:
            return _ASK_AGAIN
        run = execute(
            code,
            cases[0].input_path,
            timeout_s=min(config.code_timeout, timeout_s),
            mem_mb=config.sandbox_mem_mb,
            deny_read=item.get("deny_read", ()),
            sandbox=config.sandbox,
        )
        if not run.ok:
            tail = (run.stderr.strip() or run.reason)[-TRACEBACK_CHARS:]
            if run.kill is not None and run.stderr.strip():  # say which limit stopped it, then the output
                tail = f"{run.reason}\n{tail}"
            return _FIX_ERROR.format(tail=tail)
        if OUTPUT_NAME not in run.outputs:
            return _NO_OUTPUT
        if not training:
            return None
        outcome = compare_workbooks(1, run.outputs[OUTPUT_NAME], cases[0].golden_path, _ranges(item))
        if outcome.passed:
            return None
        return _WRONG_CELLS.format(cells=_own_values(outcome))

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Re-run the final script on every test case and compare the graded cells.

        hard = every case passes, soft = passed / cases. fail_reason is the first failing case's:
        ``error: exec …``, ``error: output not found`` or ``wrong: value@Sheet!C5 gt=… pred=…``.
        The detail is the analyst-only verification table.
        """
        code = extract_code(response_text)
        cases = find_test_cases(Path(item["task_dir"]))
        extras: dict[str, Any] = {"cases": len(cases)}
        if not cases:
            return Score(hard=0.0, soft=0.0, predicted_answer=code[:PREDICTION_CHARS],
                         fail_reason="error: no test cases", extras=extras,
                         detail=f"no test-case pair in {item['task_dir']}")
        if not code:
            return Score(hard=0.0, soft=0.0, fail_reason=NO_CODE, extras=extras)
        ranges = _ranges(item)
        outcomes = []
        kills: list[str] = []
        for case in cases:
            run = execute(code, case.input_path, timeout_s=float(item.get("code_timeout", 120)),
                          mem_mb=int(item.get("sandbox_mem_mb", 2048)), deny_read=item.get("deny_read", ()),
                          sandbox=item.get("sandbox", "bwrap"))
            failure = exec_failure(run)
            if run.kill is not None:
                kills.append(run.kill.kind)
            outcomes.append(
                CaseOutcome(case.number, failure)
                if failure
                else compare_workbooks(case.number, run.outputs[OUTPUT_NAME], case.golden_path, ranges)
            )
        passed = sum(outcome.passed for outcome in outcomes)
        extras.update(passed=passed, case_results=[o.fail_reason or "passed" for o in outcomes])
        if kills:
            extras["kills"] = dict(Counter(kills))
        expected = "; ".join(f"{c.where}={c.expected!r}" for c in outcomes[0].cells[:20])
        first_failure = next((o.fail_reason for o in outcomes if not o.passed), "")
        return Score(
            hard=float(passed == len(outcomes)),
            soft=passed / len(outcomes),
            predicted_answer=code[:PREDICTION_CHARS],
            fail_reason=first_failure,
            extras=extras,
            expected=expected,
            detail=verification_table(outcomes),
        )

    def extract_answer(self, response_text: str) -> str | None:
        """The script the reply holds, or None."""
        return extract_code(response_text) or None

    def task_types(self, items: Sequence[Item]) -> list[str]:
        return sorted({item.task_type for item in items}) or list(DEFAULT_TASK_TYPES)

    def preflight(self, cfg: SpreadsheetBenchConfig) -> None:
        """An OS sandbox for the target's code (or ``benchmark.sandbox: none``); openpyxl and pandas
        importable; the split folder and the data root exist."""
        config = self.config(cfg)
        try:
            require_sandbox(config.sandbox, what=BENCHMARK_ID)
        except SandboxUnavailable as exc:
            raise BenchmarkSetupError(str(exc)) from None
        try:
            import openpyxl  # noqa: F401
            import pandas  # noqa: F401
        except ImportError as exc:
            raise BenchmarkSetupError(
                f"spreadsheetbench needs openpyxl and pandas ({exc}); install them with "
                "pip install 'skillopt[spreadsheetbench]'") from None
        super().preflight(config)
        if config.data_root and not Path(config.data_root).is_dir():
            raise BenchmarkSetupError(
                f"spreadsheetbench: no data root at {config.data_root}; extract "
                "spreadsheetbench_verified_400.tar.gz there or set benchmark.data_root")


def _ranges(item: Item) -> list[tuple[str | None, str]]:
    return split_ranges(str(item["answer_position"]), item.get("answer_sheet"))


def _own_values(outcome: CaseOutcome) -> str:
    """The wrong cells with the target's own values only (never the expected ones)."""
    lines = []
    if outcome.fail_reason.startswith("wrong: sheet"):
        lines.append(f"- {outcome.fail_reason.removeprefix('wrong: ')}")
    for check in outcome.cells:
        if not check.ok:
            note = (
                " (a formula: openpyxl reads it back as empty; write the literal value)"
                if check.formula
                else ""
            )
            lines.append(f"- {check.where}: your value {check.got!r}{note}")
    return "\n".join(lines[:40]) + (f"\n- ... ({len(lines) - 40} more)" if len(lines) > 40 else "")


plugin = SpreadsheetBenchBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "SpreadsheetBenchBenchmark",
    "SpreadsheetBenchConfig",
    "execute",
    "extract_code",
    "normalise_row",
    "plugin",
    "prepare_script",
    "resolve_task_dir",
]
