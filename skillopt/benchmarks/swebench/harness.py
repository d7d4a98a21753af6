"""SWE-bench evaluation harnesses behind one interface.

A harness evaluates one prediction (``{instance_id: {model_patch, model_name_or_path}}``) in a work
folder and writes the report the official harness writes, ``<model_name_or_path "/"→"__">.<run_id>.json``
holding ``resolved_ids``; :func:`read_report` reads it back for either harness, and a missing or
unreadable report is a :class:`HarnessError` (an infrastructure error, never "nothing resolved").

- :class:`DockerHarness` runs ``python -m swebench.harness.run_evaluation`` (the ``swebench`` extra
  and a Docker engine with the SWE-bench images).
- :class:`FakeHarness` needs neither. With ``resolved_ids`` it resolves exactly those. With a repository
  snapshot (plain files under ``<repos_root>/<owner>__<name>/``) it copies the snapshot, runs ``git init``
  on the copy, applies the model patch and the instance's ``test_patch`` with ``git apply`` and runs the
  ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` tests in the sandbox; resolved = every one passes. With neither it
  resolves exactly the predictions equal to the gold ``patch`` (leading and trailing whitespace ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from skillopt.core.errors import SkillOptError
from skillopt.sandbox.confine import SandboxMode, run_sandboxed
from skillopt.sandbox.process_group import run_in_group, scratch_folder

MODEL_NAME = "skillopt"
#: The harness ``--dataset_name`` for each ``benchmark.dataset``.
HARNESS_DATASETS = {
    "lite": "SWE-bench/SWE-bench_Lite",
    "verified": "SWE-bench/SWE-bench_Verified",
    "full": "SWE-bench/SWE-bench",
}
TEST_RUNNER = "_skillopt_run_tests.py"
INSTALL_HINT = "pip install 'skillopt[swebench]'"
_GIT_IDENTITY = (
    "-c",
    "user.name=skillopt",
    "-c",
    "user.email=skillopt@localhost",
    "-c",
    "commit.gpgsign=false",
)


class HarnessError(SkillOptError):
    """The harness produced no readable report: an infrastructure problem, not an unresolved patch."""


class Harness(Protocol):
    """Evaluates ``patch`` for ``instance`` (a SWE-bench row) inside ``work_dir``; writes the report
    there and returns its path and a short detail for the analyst (test outcomes, harness exit).
    Raises ``HarnessError`` when it cannot run at all."""

    def evaluate(
        self, instance: Mapping[str, Any], patch: str, work_dir: Path, run_id: str
    ) -> tuple[Path, str]: ...


def report_path(work_dir: Path, run_id: str, model_name: str = MODEL_NAME) -> Path:
    return work_dir / f"{model_name.replace('/', '__')}.{run_id}.json"


def write_predictions(work_dir: Path, instance_id: str, patch: str, model_name: str = MODEL_NAME) -> Path:
    """``preds.json`` in the harness's input form."""
    path = work_dir / "preds.json"
    path.write_text(json.dumps({instance_id: {"instance_id": instance_id, "model_patch": patch,
                                              "model_name_or_path": model_name}}, indent=2), encoding="utf-8")
    return path


def read_report(path: Path) -> set[str]:
    """The ``resolved_ids`` of a harness report; a missing or unreadable report raises ``HarnessError``."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"swebench: the harness wrote no report at {path}") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"swebench: the harness report {path} is unreadable: {exc}") from None
    resolved = report.get("resolved_ids") if isinstance(report, dict) else None
    if not isinstance(resolved, list):
        raise HarnessError(f"swebench: the harness report {path} has no resolved_ids list")
    return {str(instance_id) for instance_id in resolved}


def test_ids(value: Any) -> list[str]:
    """``FAIL_TO_PASS`` / ``PASS_TO_PASS``: a JSON-string list or a list."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, list):
        raise ValueError(f"expected a list of test ids, got {type(value).__name__}")
    return [str(entry) for entry in value]


def _write_report(work_dir: Path, run_id: str, instance_id: str, resolved: bool) -> Path:
    path = report_path(work_dir, run_id)
    path.write_text(json.dumps({
        "total_instances": 1, "submitted_instances": 1, "completed_instances": 1,
        "resolved_instances": int(resolved), "unresolved_instances": int(not resolved),
        "resolved_ids": [instance_id] if resolved else [],
        "unresolved_ids": [] if resolved else [instance_id],
    }, indent=2), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- docker


class DockerHarness:
    """The official harness through its command line (``swebench`` is imported only by that process)."""

    def __init__(self, *, dataset: str, hf_split: str, eval_workers: int, timeout_s: float) -> None:
        self.dataset_name = HARNESS_DATASETS[dataset]
        self.hf_split = hf_split
        self.eval_workers = eval_workers
        self.timeout_s = timeout_s

    def command(self, predictions: Path, run_id: str, instance_id: str) -> list[str]:
        return [sys.executable, "-m", "swebench.harness.run_evaluation", "--dataset_name", self.dataset_name,
                "--split", self.hf_split, "--predictions_path", str(predictions), "--max_workers",
                str(self.eval_workers), "--run_id", run_id, "--instance_ids", instance_id]

    def evaluate(
        self, instance: Mapping[str, Any], patch: str, work_dir: Path, run_id: str
    ) -> tuple[Path, str]:
        instance_id = str(instance["instance_id"])
        predictions = write_predictions(work_dir, instance_id, patch)
        try:
            # The harness starts Docker clients and workers: a timeout stops all of them, not just the
            # harness.
            run = run_in_group(self.command(predictions, run_id, instance_id), cwd=work_dir,
                               timeout_s=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"swebench: the harness did not finish within {self.timeout_s:.0f}s") from None
        except OSError as exc:
            raise HarnessError(f"swebench: cannot start the harness: {exc}") from None
        tail = (run.stderr or run.stdout or "").strip()[-500:]
        return report_path(work_dir, run_id), f"harness exit {run.returncode}" + (f": {tail}" if tail else "")


def docker_problem() -> str | None:
    """Why the Docker harness cannot run here (no CLI, or no engine answering), or None."""
    docker = shutil.which("docker")
    if docker is None:
        return "the docker command is not installed"
    try:
        probe = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if probe.returncode != 0:
        return "no Docker engine is running (docker info: " + (probe.stderr.strip() or "failed")[:200] + ")"
    return None


# ----------------------------------------------------------------------------------------------- fake

_RUNNER_SOURCE = '''\
"""Run test functions named path::function and print one JSON line of outcomes (skillopt's fake harness)."""
import importlib.util
import json
import sys
import traceback

sys.path.insert(0, ".")
outcomes = {}
for test_id in sys.argv[1:]:
    path, _, name = test_id.partition("::")
    try:
        spec = importlib.util.spec_from_file_location("t_" + str(abs(hash(path))), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        getattr(module, name)()
        outcomes[test_id] = "PASSED"
    except Exception:
        outcomes[test_id] = "FAILED: " + traceback.format_exc(limit=1).strip().splitlines()[-1][:200]
print(json.dumps(outcomes))
'''


class FakeHarness:
    """The offline harness (see the module docstring for the three ways it decides)."""

    def __init__(self, *, repos_root: Path | None = None, resolved_ids: Sequence[str] | None = None,
                 test_timeout_s: float = 60.0, sandbox: SandboxMode = "bwrap") -> None:
        self.repos_root = repos_root
        self.sandbox = sandbox
        self.resolved_ids = None if resolved_ids is None else {str(i) for i in resolved_ids}
        self.test_timeout_s = test_timeout_s

    def snapshot(self, instance: Mapping[str, Any]) -> Path | None:
        if self.repos_root is None:
            return None
        folder = self.repos_root / str(instance.get("repo", "")).replace("/", "__")
        return folder if folder.is_dir() else None

    def evaluate(
        self, instance: Mapping[str, Any], patch: str, work_dir: Path, run_id: str
    ) -> tuple[Path, str]:
        instance_id = str(instance["instance_id"])
        write_predictions(work_dir, instance_id, patch)
        snapshot = self.snapshot(instance)
        if self.resolved_ids is not None:
            resolved, detail = instance_id in self.resolved_ids, "fake harness: fixed resolved ids"
        elif snapshot is not None:
            resolved, detail = self._run_tests(instance, patch, snapshot)
        else:
            resolved = patch.strip() == str(instance.get("patch", "")).strip()
            detail = "fake harness: " + (
                "the patch equals the gold patch" if resolved else "the patch differs from the gold patch"
            )
        return _write_report(work_dir, run_id, instance_id, resolved), detail

    def _run_tests(self, instance: Mapping[str, Any], patch: str, snapshot: Path) -> tuple[bool, str]:
        with scratch_folder("skillopt-swebench-") as scratch:
            repo = scratch / "repo"
            shutil.copytree(snapshot, repo)
            _git(repo, "init", "-q")
            _git(repo, "add", "-A")
            _git(repo, *_GIT_IDENTITY, "commit", "-q", "-m", "base")
            applied = _git(repo, "apply", "--whitespace=nowarn", "-", stdin=patch, check=False)
            if applied.returncode != 0:
                return False, "fake harness: the patch does not apply: " + applied.stderr.strip()[:300]
            if str(instance.get("test_patch", "")).strip():
                tests = _git(
                    repo, "apply", "--whitespace=nowarn", "-", stdin=str(instance["test_patch"]), check=False
                )
                if tests.returncode != 0:
                    return False, "fake harness: the test patch no longer applies: " + tests.stderr.strip()[
                        :300
                    ]
            shutil.rmtree(repo / ".git")
            (repo / TEST_RUNNER).write_text(_RUNNER_SOURCE, encoding="utf-8")
            wanted = [
                *test_ids(instance.get("FAIL_TO_PASS", "[]")),
                *test_ids(instance.get("PASS_TO_PASS", "[]")),
            ]
            run = run_sandboxed(
                [TEST_RUNNER, *wanted], cwd=repo, timeout_s=self.test_timeout_s, mode=self.sandbox
            )
        if not run.ok:
            return (
                False,
                f"fake harness: the tests did not run ({'timed out' if run.timed_out else run.exit_code}): "
                + run.stderr.strip()[-300:],
            )
        try:
            outcomes = json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return False, "fake harness: the test runner printed no outcome"
        failed = {test: outcome for test, outcome in outcomes.items() if outcome != "PASSED"}
        lines = [f"{test}: {outcomes.get(test, 'not run')}" for test in wanted]
        return not failed and len(outcomes) == len(wanted), "fake harness tests:\n" + "\n".join(lines)


def _git(
    repo: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "LANG": "C.UTF-8",
    }
    run = subprocess.run(
        ["git", *args],
        cwd=repo,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if check and run.returncode != 0:
        raise HarnessError(f"swebench: git {' '.join(args[:1])} failed in the fake harness: "
                           f"{run.stderr.strip()[:300]}")
    return run
