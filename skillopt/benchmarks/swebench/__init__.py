"""SWE-bench (``swebench``): fix a GitHub issue in a Python repository with a patch.

Items are SWE-bench rows (``instance_id, repo, base_commit, problem_statement, hints_text, patch,
test_patch, FAIL_TO_PASS, PASS_TO_PASS, …``) with ``id = instance_id`` and ``task_type = repo``. Ratio
mode splits them stratified by repository; split_dir mode reads ``items.json``.

:meth:`SwebenchBenchmark.run_episode` hands the instance to an agent runner (:mod:`.agents`), whose
model calls all go through the ``target`` role. :meth:`SwebenchBenchmark.score` runs the harness
(:mod:`.harness`) on the patch: hard = soft = resolved; an empty patch is ``wrong: empty patch``
with no harness call. ``agent_runner``/``harness: auto`` mean the fakes under the ``scripted``
target backend (settled by :meth:`SwebenchBenchmark.bind_target` before preflight), else
mini-swe-agent and the Docker harness.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, split_items
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.swebench.agents import (
    AgentRunner,
    FakeAgentRunner,
    MiniSweAgentRunner,
    extract_patch,
)
from skillopt.benchmarks.swebench.harness import (
    HARNESS_DATASETS,
    INSTALL_HINT,
    DockerHarness,
    FakeHarness,
    Harness,
    docker_problem,
    read_report,
    test_ids,
)
from skillopt.core.data import Item, SplitSpec, parse_split_ratio, read_records
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import Message, user
from skillopt.sandbox.confine import SandboxUnavailable, require_sandbox
from skillopt.sandbox.process_group import scratch_folder

BENCHMARK_ID = "swebench"
_REPO_NAME = re.compile(r"(?!\.+/)[\w.-]+/(?!\.+$)[\w.-]+")
DEFAULT_TASK_TYPE = "swebench"
#: The Hugging Face source of each ``benchmark.dataset``.
HF_DATASETS = {
    "lite": "princeton-nlp/SWE-bench_Lite",
    "verified": "princeton-nlp/SWE-bench_Verified",
    "full": "princeton-nlp/SWE-bench",
}
#: The item key holding the evaluation settings loading stamps on each item (never written to split files).
EVAL_KEY = "evaluation_settings"
REPOS_FOLDER = "repos"
EMPTY_PATCH = "wrong: empty patch"
SIMULATED_NOTE = (
    "the environment is simulated (benchmark.agent_runner: {runner}, benchmark.harness: {harness}): "
    "scores say nothing about the real benchmark"
)

_SYSTEM_INTRO = (
    "You are a software engineer fixing an issue in a Python repository. Find the root cause and make the "
    "smallest change to the source code that fixes it."
)
_FORMAT = (
    "Reply with the fix as one unified diff in git format (paths a/… and b/… from the repository root) "
    "inside a ```diff block. Change only source files: never tests, fixtures or configuration."
)


class SwebenchConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``swebench``: data source, agent runner, harness and limits."""

    #: ``lite`` | ``verified`` | ``full``: the harness ``--dataset_name`` (and the manifest's source name).
    dataset: Literal["lite", "verified", "full"] = "lite"
    #: The dataset split the harness evaluates against.
    hf_split: str = "test"
    #: ``auto``: ``fake`` when the target backend is ``scripted``, else ``minisweagent``.
    agent_runner: Literal["auto", "minisweagent", "fake"] = "auto"
    #: ``auto``: ``fake`` when the target backend is ``scripted``, else ``docker``.
    harness: Literal["auto", "docker", "fake"] = "auto"
    #: Parallel instances inside one harness run (``--max_workers``).
    eval_workers: int = Field(default=8, ge=1)
    #: The agent's model-call budget and cost budget (USD) per instance.
    step_limit: int = Field(default=50, ge=1)
    cost_limit: float = Field(default=3.0, gt=0)
    #: Seconds one instance's agent may run; the harness gets ``harness_timeout``.
    timeout_per_instance: float = Field(default=600, gt=0)
    harness_timeout: float = Field(default=7200, gt=0)
    #: Show ``hints_text`` to the agent.
    use_hints: bool = False
    #: The target's output cap per call (a per-call override of model.target.max_tokens); unset: the role's.
    max_tokens: int | None = Field(default=None, ge=1)


# ----------------------------------------------------------------------------------------- loading


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SWE-bench item (idempotent): ``instance_id`` (or ``id``), ``repo`` and ``problem_statement``
    are required; ``FAIL_TO_PASS``/``PASS_TO_PASS`` must be (JSON-string) lists. Raises ``KeyError``
    or ``ValueError``; the loader names the file and the row."""
    instance_id = row.get("instance_id") or row.get("id")
    if not instance_id:
        raise KeyError("instance_id")
    for name in ("repo", "problem_statement"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise KeyError(name)
    if not _REPO_NAME.fullmatch(row["repo"].strip()):
        # The fake harness finds a repository snapshot by this name under the data root.
        raise ValueError("field 'repo' must be 'owner/name' (letters, digits, '.', '_', '-'), got "
                         f"{row['repo']!r}")
    item = {key: value for key, value in row.items() if key != EVAL_KEY}
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            test_ids(row.get(name) or "[]")
        except ValueError as exc:
            raise ValueError(f"field {name!r} is not a list of test ids: {exc}") from None
    for name in ("patch", "test_patch", "hints_text", "base_commit"):
        item.setdefault(name, "")
    item.update(id=str(instance_id), instance_id=str(row.get("instance_id") or instance_id),
                task_type=str(row["repo"]))
    return item


def stratified_partition(items: list[Item], spec: SplitSpec) -> dict[str, list[Item]]:
    """Repository-stratified splits: per repository (sorted), shuffle with ``Random(split_seed)``,
    ``n_train = round(n·w_train/W)``, ``n_val = round(n·w_val/W)``; n ≥ 3 gives every split ≥ 1, n = 2
    gives 1/0/1, n = 1 goes to test; val, then train, shrink until test ≥ 1. Each split is then
    shuffled with ``Random(split_seed + 1)``."""
    weights = parse_split_ratio(spec.split_ratio)
    total = sum(weights)
    by_repo: dict[str, list[Item]] = {}
    for item in sorted(items, key=lambda entry: entry.id):
        by_repo.setdefault(str(item.get("repo", "")), []).append(item)
    parts: dict[str, list[Item]] = {"train": [], "val": [], "test": []}
    for repo in sorted(by_repo):
        group = by_repo[repo]
        random.Random(spec.split_seed).shuffle(group)
        n = len(group)
        if n == 1:
            n_train, n_val = 0, 0
        elif n == 2:
            n_train, n_val = 1, 0
        else:
            n_train = max(1, round(n * weights[0] / total))
            n_val = max(1, round(n * weights[1] / total))
            while n - n_train - n_val < 1:
                if n_val > 1:
                    n_val -= 1
                elif n_train > 1:
                    n_train -= 1
                else:
                    break
        parts["train"] += group[:n_train]
        parts["val"] += group[n_train:n_train + n_val]
        parts["test"] += group[n_train + n_val:]
    for name in parts:
        random.Random(spec.split_seed + 1).shuffle(parts[name])
    return parts


# ------------------------------------------------------------------------------------------ plugin


class SwebenchBenchmark(Benchmark[SwebenchConfig]):
    """The ``swebench`` plug-in.

    ``agent_factory(config)`` and ``harness_factory(item)``, when given, replace the configured
    runner and harness (tests inject a harness with fixed ``resolved_ids`` this way).
    """

    id = BENCHMARK_ID
    extras = ("swebench",)
    GOLD_FIELDS = ("patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
    Config = SwebenchConfig
    default_split_mode = "ratio"
    default_task_type = DEFAULT_TASK_TYPE
    data_hint = (
        "pass --data DIR (a folder holding train/, val/ and test/ items.json) or set benchmark.split_dir"
    )

    def __init__(self, agent_factory: Any = None, harness_factory: Any = None) -> None:
        self.agent_factory = agent_factory
        self.harness_factory = harness_factory

    def normalise_row(self, row: Mapping[str, Any], cfg: SwebenchConfig) -> dict[str, Any]:
        return normalise_row(row)

    def load_split(self, cfg: SwebenchConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (ratio mode: repo-stratified), each stamped with the harness
        settings its scoring uses."""
        config = self.config(cfg)
        items = split_items(
            config,
            split,
            run_dir=run_dir,
            benchmark=BENCHMARK_ID,
            default_split_mode=self.default_split_mode,
            reader=read_records,
            normalise=normalise_row,
            default_task_type=DEFAULT_TASK_TYPE,
            partition=stratified_partition,
            manifest_extra={
                "dataset_name": HF_DATASETS[config.dataset],
                "hf_split": config.hf_split,
                "strategy": "stratified_by_repo",
            },
        )
        settings = {
            "harness": config.harness, "dataset": config.dataset, "hf_split": config.hf_split,
            "eval_workers": config.eval_workers, "harness_timeout": config.harness_timeout,
            "repos_root": str(Path(config.data_root) / REPOS_FOLDER) if config.data_root else None,
            "sandbox": config.sandbox,
        }
        return [Item({**item, EVAL_KEY: settings}) for item in items]

    def bind_target(
        self, cfg: SwebenchConfig, *, backend: str, kind: str
    ) -> tuple[SwebenchConfig, list[str]]:
        """Settle ``auto`` runners: the fakes under the ``scripted`` backend, else mini-swe-agent and
        Docker."""
        config = self.config(cfg)
        scripted = backend == "scripted"
        runner = (
            config.agent_runner if config.agent_runner != "auto" else ("fake" if scripted else "minisweagent")
        )
        harness = config.harness if config.harness != "auto" else ("fake" if scripted else "docker")
        bound = config.model_copy(update={"agent_runner": runner, "harness": harness})
        simulated = "fake" in (runner, harness)
        return bound, [SIMULATED_NOTE.format(runner=runner, harness=harness)] if simulated else []

    def build_messages(self, item: Item, skill: str, cfg: SwebenchConfig) -> list[Message]:
        """System: the engineer role, the skill, the diff format. User: the repository and the issue
        (``problem_statement`` only; ``hints_text`` only with ``use_hints``). Never reads gold."""
        return [self.system_message(_SYSTEM_INTRO, skill, _FORMAT),
                user(f"## Repository\n{item['repo']} at commit "
                     f"{str(item.get('base_commit', ''))[:12] or 'HEAD'}\n\n## "
                     f"Issue\n{task_text(item, self.config(cfg))}\n\nFix the issue; reply with the diff.")]

    def agent_runner(self, config: SwebenchConfig, ctx: EpisodeContext) -> AgentRunner:
        if self.agent_factory is not None:
            return self.agent_factory(config)
        if config.agent_runner == "fake":
            return FakeAgentRunner()
        role = getattr(ctx.target, "role", None)
        return MiniSweAgentRunner(step_limit=config.step_limit, cost_limit=config.cost_limit,
                                  model_name=str(getattr(role, "model", None) or "skillopt"))

    def harness(self, item: Item) -> Harness:
        if self.harness_factory is not None:
            return self.harness_factory(item)
        settings = item.get(EVAL_KEY) or {}
        if settings.get("harness") == "fake":
            root = settings.get("repos_root")
            return FakeHarness(
                repos_root=Path(root) if root else None, sandbox=settings.get("sandbox", "bwrap")
            )
        return DockerHarness(
            dataset=str(settings.get("dataset", "lite")),
            hf_split=str(settings.get("hf_split", "test")),
            eval_workers=int(settings.get("eval_workers", 8)),
            timeout_s=float(settings.get("harness_timeout", 7200)),
        )

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult:
        """The agent runner turns the instance into a patch within ``timeout_per_instance``; the episode's
        response is ``{"model_patch", "exit_status"}`` as JSON (what ``score`` reads)."""
        config = self.config(ctx.cfg)
        outcome = self.agent_runner(config, ctx).run(item, skill, ctx, task=task_text(item, config),
                                                     timeout_s=config.timeout_per_instance)
        record = {"model_patch": outcome.patch, "exit_status": outcome.exit_status}
        return EpisodeResult(json.dumps(record), n_turns=outcome.n_calls, answered=outcome.n_calls > 0)

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = soft = resolved by the harness. An empty patch → ``wrong: empty patch`` (no harness
        call); unresolved → ``wrong: unresolved (<agent exit status>)``. A missing or unreadable report
        raises ``HarnessError`` (an infrastructure error). Never calls the judge."""
        patch, exit_status = parse_response(response_text)
        extras: dict[str, Any] = {"exit_status": exit_status, "patch_chars": len(patch)}
        expected = (
            f"the FAIL_TO_PASS tests {item.get('FAIL_TO_PASS', '[]')} pass and PASS_TO_PASS keep passing"
        )
        if not patch.strip():
            return Score(hard=0.0, soft=0.0, fail_reason=EMPTY_PATCH, extras=extras, expected=expected,
                         detail="the agent submitted no diff; the harness was not run")
        with scratch_folder("skillopt-swebench-eval-") as work:
            run_id = f"skillopt_{time.strftime('%Y%m%d_%H%M%S')}"
            report, detail = self.harness(item).evaluate(item, patch, work, run_id)
            resolved = str(item["instance_id"]) in read_report(report)
        extras["resolved"] = resolved
        return Score(hard=float(resolved), soft=float(resolved), predicted_answer=patch[:4000],
                     fail_reason="" if resolved else f"wrong: unresolved ({exit_status})", extras=extras,
                     expected=expected, detail=detail)

    def preflight(self, cfg: SwebenchConfig) -> None:
        """The data source, and for the real runner and harness their packages and a Docker engine
        (skipped for the fakes). Each miss raises ``BenchmarkSetupError`` saying how to fix it."""
        config = self.config(cfg)
        mode = config.split_mode or self.default_split_mode
        if mode == "ratio" and not config.data_path:
            raise BenchmarkSetupError(
                "swebench: no instances: pass --data FILE (a JSON/JSONL export of "
                f"{HF_DATASETS[config.dataset]}, split test) or --data DIR with train/, val/ and test/ "
                "items.json; runs never download data. To export: python -c \"from datasets import "
                f"load_dataset; load_dataset('{HF_DATASETS[config.dataset]}', "
                f"split='{config.hf_split}').to_json('swebench.jsonl')\"")
        super().preflight(config)
        if config.agent_runner != "fake" and self.agent_factory is None:
            _require("minisweagent", "the mini-swe-agent runner (benchmark.agent_runner: minisweagent)")
        if config.harness != "fake" and self.harness_factory is None:
            _require("swebench", "the Docker harness (benchmark.harness: docker)")
            problem = docker_problem()
            if problem:
                raise BenchmarkSetupError(
                    f"swebench: the Docker harness needs a running Docker engine: {problem}; start Docker "
                    "(and pull the SWE-bench images), or set benchmark.harness: fake for the simulated "
                    "harness")
        if config.harness == "fake" and self.harness_factory is None and config.data_root and \
                (Path(config.data_root) / REPOS_FOLDER).is_dir():
            if shutil.which("git") is None:
                raise BenchmarkSetupError(
                    "swebench: the fake harness applies patches with git, which is not installed"
                )
            try:  # it runs the repository's tests, patched by the model
                require_sandbox(config.sandbox, what=f"{BENCHMARK_ID} (fake harness)")
            except SandboxUnavailable as exc:
                raise BenchmarkSetupError(str(exc)) from None


def task_text(item: Mapping[str, Any], config: SwebenchConfig) -> str:
    """What the agent is asked: the problem statement, plus the hints with ``use_hints``."""
    text = str(item["problem_statement"]).strip()
    hints = str(item.get("hints_text") or "").strip()
    return f"{text}\n\n## Hints\n{hints}" if config.use_hints and hints else text


def parse_response(response_text: str) -> tuple[str, str]:
    """``(patch, exit_status)`` from an episode's record; a plain reply is read as the diff it holds."""
    try:
        record = json.loads(response_text)
    except (json.JSONDecodeError, TypeError):
        record = None
    if isinstance(record, dict) and "model_patch" in record:
        return str(record.get("model_patch") or ""), str(record.get("exit_status") or "unknown")
    patch = extract_patch(response_text or "")
    return patch, "Submitted" if patch else "NoPatch"


def _require(module: str, what: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise BenchmarkSetupError(
            f"swebench: {what} needs the {module} package ({exc}); install it with {INSTALL_HINT}, "
            "or set benchmark.agent_runner: fake and benchmark.harness: fake for the simulated environment"
        ) from None


plugin = SwebenchBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "HARNESS_DATASETS",
    "SwebenchBenchmark",
    "SwebenchConfig",
    "normalise_row",
    "parse_response",
    "plugin",
    "stratified_partition",
    "task_text",
]
