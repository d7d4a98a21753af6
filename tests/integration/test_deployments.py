"""`skillopt serve` against a real `prefect server start`, used the way a person would use it.

One `skillopt serve demo` process (in the background, its own working directory) serves the
`skill-train/demo` deployment for the whole module. Runs are triggered with `prefect deployment run`
and `prefect flow-run retry`, cancelled through the Prefect API, and checked through the API (states,
task runs, artifacts) and on disk (run directory, skill registry, usage ledger). One more test serves
`skill-train/babyvision` with its data and backend, as the self-hosting guide's offline recipe does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow

#: Small runs: one epoch of the demo (three steps) keeps each run to seconds.
SMALL = ["train.epochs=1"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


@dataclass
class Served:
    api: str
    workdir: Path
    env: dict[str, str]
    log: Path
    deployment: str = "skill-train/demo"

    def client(self) -> Any:
        from prefect.client.orchestration import get_client

        return get_client(sync_client=True)

    def settings(self) -> Any:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings(updates={PREFECT_API_URL: self.api})

    def prefect(self, *args: str) -> str:
        """Run the `prefect` command line against the test server; returns its output."""
        done = subprocess.run([sys.executable, "-m", "prefect", *args], env=self.env, cwd=self.workdir,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def trigger(self, parameters: dict[str, Any] | None = None) -> str:
        """``prefect deployment run <deployment>``, with ``--params`` only when ``parameters`` are given."""
        extra = ["--params", json.dumps(parameters)] if parameters is not None else []
        output = self.prefect("deployment", "run", self.deployment, *extra)
        match = re.search(r"UUID: ([0-9a-f-]{36})", output)
        assert match, output
        return match.group(1)

    def wait(self, flow_run_id: str, states: set[str] = FINAL, timeout: float = 240) -> Any:
        deadline = time.monotonic() + timeout
        with self.settings(), self.client() as client:
            while True:
                run = client.read_flow_run(flow_run_id)
                if run.state is not None and run.state.type.value in states:
                    return run
                assert time.monotonic() < deadline, (
                    f"flow run {flow_run_id} still {run.state.type.value if run.state else None}; "
                    f"serve log:\n{self.log.read_text()[-3000:]}")
                time.sleep(0.5)

    def run_dirs(self) -> set[Path]:
        runs = self.workdir / "runs"
        return set(runs.iterdir()) if runs.is_dir() else set()

    def task_runs(self, flow_run_id: str, settled: bool = True, expected: bool = False) -> list[Any]:
        """Task runs of the flow run and of its subflow runs (the epochs); with ``settled``, waits (up to a
        minute) until each is in a final state, as it is once the server has ingested its events. With
        ``expected``, an empty list is waited on too: on a busy machine the flow run can be final before
        the server has recorded any of its task runs."""
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterParentFlowRunId,
        )

        with self.settings(), self.client() as client:
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
            ids = [flow_run_id, *(str(child.id) for child in children)]
            deadline = time.monotonic() + 60
            while True:
                found: list[Any] = []
                while True:  # the API returns at most 200 per page
                    page = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
                                                 limit=200, offset=len(found))
                    found += page
                    if len(page) < 200:
                        break
                # The server records task runs from client events, ingested after the flow run's own
                # state (set through the API) is final: a task run may be listed before its first state,
                # or still show an earlier one, for a while on a busy machine.
                ingested = bool(found) or not expected
                if ingested and all(t.state is not None and (not settled or t.state.type.value in FINAL)
                                    for t in found) or time.monotonic() > deadline:
                    return found
                time.sleep(0.5)


@contextmanager
def serving(prefect_api: str, workdir: Path, benchmark: str, *options: str,
            env: dict[str, str] | None = None) -> Iterator[tuple[Served, Any, Any]]:
    """``skillopt serve <benchmark> <options>`` in ``workdir`` (``env`` added to the environment) until the
    block ends: the handle, the process and the deployment as registered. On the way out the process gets
    SIGTERM."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # Pick up scheduled runs (a retry) every 2 s instead of 10 s.
           "PREFECT_RUNNER_POLL_FREQUENCY": "2", **(env or {})}
    console_script = Path(sys.executable).with_name("skillopt")
    command = [str(console_script)] if console_script.exists() else [sys.executable, "-m",
                                                                     "skillopt.shell.cli"]
    log = workdir / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen([*command, "serve", benchmark, *options], cwd=workdir, env=env,
                                   stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    handle = Served(api=prefect_api, workdir=workdir, env=env, log=log, deployment=f"skill-train/{benchmark}")
    try:
        from prefect.exceptions import ObjectNotFound

        deadline = time.monotonic() + 120
        with handle.settings(), handle.client() as client:
            while True:
                assert process.poll() is None, f"skillopt serve exited:\n{log.read_text()[-3000:]}"
                try:
                    deployment = client.read_deployment_by_name(handle.deployment)
                    break
                except ObjectNotFound:
                    assert time.monotonic() < deadline, f"no deployment in 120 s:\n{log.read_text()[-3000:]}"
                    time.sleep(0.5)
        yield handle, process, deployment
    finally:
        with _suppress_missing():
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with _suppress_missing():
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def served(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(prefect_api, tmp_path_factory.mktemp("served"), "demo") as (handle, _, deployment):
        assert deployment.parameters == {"benchmark": "demo", "mode": "nightly"}
        assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
        assert deployment.global_concurrency_limit.limit == 1
        yield handle


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        return kind is ProcessLookupError


def test_nightly_run_promotes_and_an_identical_train_run_is_served_from_the_cache(served: Served):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    before = served.run_dirs()
    nightly_id = served.trigger({"overrides": SMALL})
    nightly = served.wait(nightly_id)
    assert nightly.state.type.value == "COMPLETED", nightly.state.message
    assert nightly.parameters["mode"] == "nightly"
    (run_dir,) = served.run_dirs() - before
    assert (run_dir / "best_skill.md").read_text().strip()

    # The promotion decision: in the run directory, in the registry history, and as an artifact.
    decision = json.loads((run_dir / "promotion.json").read_text())
    assert decision["action"] in ("promote", "keep")
    assert decision["candidate_score"] is not None and decision["incumbent_score"] is not None
    history = [
        json.loads(x) for x in (served.workdir / "skills" / "demo" / "history.jsonl").read_text().splitlines()
    ]
    assert history == [decision]
    if decision["action"] == "promote":
        assert decision["candidate_score"] > decision["incumbent_score"]
        assert (served.workdir / "skills" / "demo" / "current.md").read_text() == \
            (run_dir / "best_skill.md").read_text()
    with served.settings(), served.client() as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[nightly_id])))
    by_kind = {a.key.rsplit("-", 1)[-1]: a for a in artifacts if a.key}
    assert {"progress", "promotion"} <= set(by_kind), sorted(by_kind)
    assert f"{decision['candidate_score']:.4f}" in by_kind["promotion"].data

    # The same parameters in train mode: every task is served from the cache, no model is called.
    before = served.run_dirs()
    train_id = served.trigger({"overrides": SMALL, "mode": "train"})
    train = served.wait(train_id)
    assert train.state.type.value == "COMPLETED", train.state.message
    # (Prefect links each subflow run to a task run of its own, here skill-epoch-N: not a task of ours.)
    task_runs = [t for t in served.task_runs(train_id, expected=True) if not t.name.startswith("skill-epoch")]
    evaluations = [t for t in task_runs if t.name.startswith("evaluate_skill")]
    assert evaluations, [t.name for t in task_runs]
    assert {t.state.name for t in task_runs} == {"Cached"}, sorted(
        (t.name, t.state.name) for t in task_runs if t.state.name != "Cached"
    )
    (train_dir,) = served.run_dirs() - before
    usage = train_dir / "usage.jsonl"
    calls = [json.loads(line) for line in usage.read_text().splitlines()] if usage.exists() else []
    assert all(call["cache_hit"] for call in calls), "the cached re-run called a model"
    assert (train_dir / "best_skill.md").read_text() == (run_dir / "best_skill.md").read_text()


def test_named_parameters_set_from_the_command_line_and_shown_in_the_ui_form(served: Served):
    """`prefect deployment run skill-train/demo --param epochs=1` runs one epoch; the UI's run form names each
    parameter with its description; a deployment run checks its input before any rollout."""
    from tests.browser import chromium, screenshot

    before = served.run_dirs()
    output = served.prefect("deployment", "run", served.deployment, "--param", "epochs=1",
                            "--param", "mode=train")
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", output).group(1)  # type: ignore[union-attr]
    run = served.wait(run_id)
    assert run.state.type.value == "COMPLETED", run.state.message
    (run_dir,) = served.run_dirs() - before
    steps = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert {step["epoch"] for step in steps if step["kind"] == "step"} == {1}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["total"]["n"] == 3  # the demo has 3 steps per epoch

    # A missing credential stops the run at its start, before any rollout, naming the parameter to set.
    failed = served.wait(served.trigger({"backend": "openai", "epochs": 1}))
    assert failed.state.type.value == "FAILED"
    assert "no credential: export OPENAI_API_KEY" in failed.state.message, failed.state.message
    assert not [t for t in served.task_runs(str(failed.id)) if t.name.startswith(("rollout", "evaluate"))]

    with served.settings(), served.client() as client:
        deployment = client.read_deployment_by_name(served.deployment)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.goto(f"{served.api.removesuffix('/api')}/deployments/deployment/{deployment.id}/run")
        page.get_by_text("Passes over the training split").first.wait_for(timeout=60_000)
        text = page.inner_text("body")
        for words in ("At most this many edits to the skill per step", "Training items per step",
                      "Backend of the target model", "Model of the optimizer", "Any other setting"):
            assert words in text, f"{words!r} is not in the run form"
        assert "§" not in text
        screenshot(page, "prefect-ui-deployment-run-form")


def test_skillopt_runs_names_a_late_run_that_nothing_serves_and_how_to_serve_it(prefect_api, tmp_path):
    """A deployment registered while no process serves it (serve stopped, or never started): `prefect
    deployment run` still creates the run, which turns Late; `skillopt runs` says so and gives the command."""
    from skillopt.deployments.serve import build_deployments, run_defaults

    data = str(FIXTURES / "qa")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    handle = Served(api=prefect_api, workdir=tmp_path, log=tmp_path / "none.log", deployment="skill-train/qa",
                    env=env)
    with handle.settings():
        (deployment,) = build_deployments(["qa"], run_defaults(data=data, cli_roles={"backend": "scripted"}),
                                          cron=None)
        deployment.apply()
    run_id = handle.trigger({"epochs": 1})
    late = handle.wait(run_id, states={"SCHEDULED"})
    deadline = time.monotonic() + 120
    while late.state.name != "Late":  # the server's late-runs service marks it after ~15 s
        assert time.monotonic() < deadline, late.state
        time.sleep(2)
        late = handle.wait(run_id, states={"SCHEDULED"})
    listing = subprocess.run([str(Path(sys.executable).with_name("skillopt")), "runs"], env=handle.env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    (row,) = [line for line in lines if f"/runs/flow-run/{run_id}" in line]
    assert row.startswith("Late") and late.name in row and "nothing serves it" in row, row
    assert (f"Late: {late.name} of skill-train/qa will wait until a process serves the deployment"
            in listing.stdout), listing.stdout
    assert f"run: skillopt serve qa --data {data} --backend scripted" in listing.stdout, listing.stdout


def result_key(state: Any) -> str | None:
    """Where a task run's persisted result is filed: its cache key (the storage key of the state's result
    record), the same for the run that computed it and a later run served from it."""
    data = state.data
    key = getattr(data, "storage_key", None) or (data.get("storage_key") if isinstance(data, dict) else None)
    return Path(str(key)).name if key else None


def test_a_cancelled_run_retried_from_the_cli_reuses_every_finished_task(served: Served):
    from prefect.states import Cancelling

    world = DemoWorldServer()
    with world.server:
        # one step, a short test split
        overrides = [*SMALL, "benchmark.train_size=8", "benchmark.test_size=8",
                     *role_overrides(world.server.openai_base_url)]
        parameters = {"overrides": overrides, "mode": "train"}
        world.hold_from = 6  # half of the baseline's selection items answer, then every call hangs
        run_id = served.trigger(parameters)
        assert world.held.wait(timeout=180), (
            f"the run never reached the hold:\n{served.log.read_text()[-3000:]}"
        )
        # The answered calls' task runs finish and report their states, recorded by the server in batches.
        # A task's result is filed under its cache key: the state's result record names it.
        deadline = time.monotonic() + 60
        while True:
            finished = {result_key(t.state) for t in served.task_runs(run_id, settled=False)
                        if t.state and t.state.name == "Completed"}
            if finished or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert finished, "no task had finished before the cancel"
        assert None not in finished, "a finished task has no cache key"

        with served.settings(), served.client() as client:
            client.set_flow_run_state(run_id, Cancelling(message="cancelled by the test"))
        cancelled = served.wait(run_id, states={"CANCELLED", "COMPLETED", "FAILED", "CRASHED"})
        cancelled_at = time.time()
        assert cancelled.state.type.value == "CANCELLED", cancelled.state.message
        answered_before = set(world.answered)
        world.hold_from = None
        world.release.set()
        world.answered.clear()

        served.prefect("flow-run", "retry", run_id)
        retried = served.wait(run_id, states={"COMPLETED", "FAILED", "CRASHED"})
        assert retried.state.type.value == "COMPLETED", retried.state.message
        answered_after = set(world.answered)

    assert answered_before & answered_after == set(), "a call answered before the cancel was made again"
    # Every task that had finished comes back in the retry without a new model call (asserted above): served
    # from Prefect's cache, or, when it finished inside an evaluation the cancel cut short (Prefect commits
    # a nested task's result with its enclosing task's transaction), run again and answered from the reply
    # store.
    deadline = time.monotonic() + 60
    while True:
        retried_keys = {result_key(t.state) for t in served.task_runs(run_id, settled=False)
                        if t.state and t.state.name in ("Cached", "Completed") and t.start_time
                        and t.start_time.timestamp() > cancelled_at}
        if finished <= retried_keys or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert finished <= retried_keys, f"{len(finished - retried_keys)} finished tasks did not come back"



def test_a_deployment_served_with_data_and_a_backend_runs_as_typed_and_tells_its_story(prefect_api, tmp_path):
    """The self-hosting guide's offline recipe as a person types it, then the run's page in the Prefect UI."""
    from tests.browser import chromium, screenshot

    shutil.copytree(FIXTURES / "babyvision", tmp_path / "tests" / "fixtures" / "babyvision")
    # Prefect's own default level (the tests run it at WARNING): task-run lines would be logged at INFO.
    with serving(
        prefect_api,
        tmp_path,
        "babyvision",
        "--data",
        "tests/fixtures/babyvision",
        "--backend",
        "scripted",
        env={"PREFECT_LOGGING_LEVEL": "INFO"},
    ) as (served, process, deployment):
        assert deployment.parameters == {"benchmark": "babyvision", "mode": "nightly",
                                         "data": str(tmp_path / "tests" / "fixtures" / "babyvision"),
                                         "backend": "scripted"}
        run_id = served.trigger()  # prefect deployment run skill-train/babyvision, nothing else
        run = served.wait(run_id, timeout=600)
        assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{served.log.read_text()[-3000:]}"
        run_dir = tmp_path / "runs" / run.name  # the flow run is named after its run directory
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["counts"]["total"]["accepts"] >= 1, summary["counts"]
        scores = summary["scores"]
        assert scores["best"]["selection"]["hard"] > scores["baseline"]["selection"]["hard"]

        # The run's logs, as `prefect flow-run logs` shows them: the story, not a line per task run.
        logs = served.prefect("flow-run", "logs", run_id)
        for line in (
            f"run directory: runs/{run.name}",
            "baseline on the selection split: 0.600 (10 items)",
            "epoch 1 step 1/4 (budget 4): 6/10 failed, 1 edits proposed, 1 selected -> "
            "accept_new_best: candidate 1.000 > current 0.600",
            "-> reject: candidate 1.000 <= current 1.000",
            "epoch 2 boundary: slow update",
            "epoch 4/4 done: current 1.000, best 1.000",
            f"finished {run.name}: best selection hard 1.000",
            "promotion: ",
        ):
            assert line in logs, f"{line!r} is not in the run's logs:\n{logs}"
        assert logs.count("Finished in state Completed()") == 1, logs  # the flow run's own line only

        # The same story on the run's page in the Prefect UI.
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(f"{prefect_api.removesuffix('/api')}/runs/flow-run/{run_id}")
            page.get_by_text("baseline on the selection split: 0.600").first.wait_for(timeout=60_000)
            assert page.get_by_text(run.name).count() >= 1
            assert page.get_by_text("-> accept_new_best: candidate 1.000 > current 0.600").count() == 1
            screenshot(page, "prefect-ui-deployment-run-logs")

        # serve said where to watch the run: its UI page and the command that follows its log.
        log = served.log.read_text()
        link = f"{prefect_api.removesuffix('/api')}/runs/flow-run/{run_id}"
        assert f"run {run.name} started: {link}" in log, log
        assert f"follow its log: skillopt runs logs {run_id} --follow" in log, log
        story = subprocess.run([str(Path(sys.executable).with_name("skillopt")), "runs", "logs", run_id,
                                "--follow"], env=served.env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
        assert story.returncode == 0, story.stderr
        assert "baseline on the selection split: 0.600 (10 items)" in story.stdout
        assert story.stdout.rstrip().endswith("(run Completed)"), story.stdout[-500:]
        by_name = subprocess.run([str(Path(sys.executable).with_name("skillopt")), "runs", "logs", run.name],
                                 env=served.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert by_name.returncode == 0 and by_name.stdout == story.stdout, by_name.stderr  # the run's name

        # A bad parameter from the UI form: the run says which parameter to set, never a command-line option.
        failed = served.wait(served.trigger({"data": "nowhere"}))
        assert failed.state.type.value == "FAILED"
        assert "deployment parameter data: nothing at nowhere" in failed.state.message, failed.state.message
        assert "--data" not in failed.state.message

        # Stopping serve: it ends by itself and leaves the deployment as it was (not paused).
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, served.log.read_text()[-3000:]
        with served.settings(), served.client() as client:
            assert client.read_deployment_by_name(served.deployment).paused is False
