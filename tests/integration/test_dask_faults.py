"""A Dask run when the cluster fails under it: a worker killed mid-run (with or without a nanny), a scheduler
frozen (SIGSTOP) or killed, a SIGTERM while the run waits on a frozen cluster.

The cluster is real and in processes of its own (``dask scheduler`` and ``dask worker`` command lines), so
that the test can stop or kill each of them; the run is the real command against it, with its target an
OpenAI-compatible loopback peer that answers as the fixture's scripted target after a short latency, so a
kill lands while rollouts are in flight. The reference is the same training on the thread pool
(tests/integration/test_dask_training.py).
"""

# The fixtures imported from test_dask_training are used by name as test parameters (F811).
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_dask_training import (  # noqa: F401 - data and reference: fixtures
    data,
    fixture_target_server,
    outcome,
    paid_calls,
    reference,
    rollout_pids,
    run_dir,
    start,
)

pytestmark = pytest.mark.slow

#: The bound the stall tests set; the run must stop within it (plus the time to notice and exit).
TIMEOUT_S = 60
LATENCY_S = 0.3


class Cluster:
    """A scheduler and workers, each its own process group."""

    def __init__(self, folder: Path, *, workers: int = 2, nanny: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / "scheduler.json"
        self.scheduler = self._spawn(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(self.file)], folder / "s.log")
        deadline = time.monotonic() + 120
        while not self.file.exists() or not self.file.read_text().strip():
            assert self.scheduler.poll() is None and time.monotonic() < deadline, "no scheduler"
            time.sleep(0.2)
        self.address = json.loads(self.file.read_text())["address"]
        self.workers = [
            self._spawn([sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
                         "--no-dashboard", "--nanny" if nanny else "--no-nanny"], folder / f"w{n}.log")
            for n in range(workers)
        ]
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)

    @staticmethod
    def _spawn(command: list[str], log: Path) -> subprocess.Popen:
        return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def close(self) -> None:
        for process in [self.scheduler, *self.workers]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.fixture
def target() -> Iterator:
    from tests.fakes.http_fakes import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        fixture_target_server(server)
        answer = server.handler

        def slow(request):
            time.sleep(LATENCY_S)
            return answer(request)

        server.handler = slow
        yield server


def start_on(cwd: Path, api: str, data: Path, address: str, server, *overrides: str) -> subprocess.Popen:
    return start(cwd, api, data, "-o", "run.task_runner=dask", "-o", f"run.dask_address={address}",
                 "-o", "model.target.backend=openai_compatible",
                 "-o", f"model.target.base_url={server.openai_base_url}",
                 "-o", "model.target.model=fixture-model", *overrides)


def after_calls(server, process: subprocess.Popen, calls: int) -> None:
    deadline = time.monotonic() + 600
    while server.calls("/v1/chat/completions") < calls:
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the run made too few calls"
        time.sleep(0.05)


def ended_within(process: subprocess.Popen, seconds: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        output, _ = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the run did not end within {seconds} s:\n{output[-3000:]}")
    return process.returncode, output, time.monotonic() - started


def rerun_finishes(cwd: Path, api: str, data: Path, server, folder: Path) -> None:
    """The same command on a fresh cluster resumes and ends with the reference's result."""
    cluster = Cluster(folder, workers=2)
    try:
        code, output, _ = ended_within(start_on(cwd, api, data, cluster.address, server), 1500)
        assert code == 0, output[-4000:]
    finally:
        cluster.close()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from ``/proc``."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *descendants(child)]
    return found


@pytest.mark.parametrize("nanny", [False, True], ids=["no-nanny", "nanny"])
def test_a_worker_killed_mid_run_costs_only_its_in_flight_calls(
        prefect_api, data, reference, target, tmp_path, nanny):
    """Without a nanny the worker is gone for good; with one, the nanny starts a new worker in its place."""
    pytest.importorskip("prefect_dask")
    cluster = Cluster(tmp_path / "cluster", nanny=nanny)
    try:
        process = start_on(tmp_path / "run", prefect_api, data, cluster.address, target,
                           "-o", f"run.dask_timeout_s={TIMEOUT_S * 6}")
        after_calls(target, process, 12)
        # the worker process itself: under a nanny, the nanny's child (and what that started)
        victims = descendants(cluster.workers[0].pid) if nanny else [cluster.workers[0].pid]
        assert victims, "the nanny has no worker process"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        code, output, _ = ended_within(process, 1500)
        assert code == 0, output[-4000:]
    finally:
        cluster.close()
    folder = run_dir(tmp_path / "run")
    assert outcome(folder) == outcome(reference)
    paid = Counter(paid_calls(folder))
    assert [call for call, n in paid.items() if n > 1] == [], "a completed call was paid twice"
    assert set(victims) & set(rollout_pids(folder)), "the killed worker never ran a rollout"


@pytest.mark.parametrize("fault", ["freeze", "kill"])
def test_a_scheduler_that_stops_answering_stops_the_run_with_exit_2_and_the_rerun_finishes(
        prefect_api, data, reference, target, tmp_path, fault):
    pytest.importorskip("prefect_dask")
    cluster = Cluster(tmp_path / "cluster")
    try:
        process = start_on(tmp_path / "run", prefect_api, data, cluster.address, target,
                           "-o", f"run.dask_timeout_s={TIMEOUT_S}")
        after_calls(target, process, 10)
        os.killpg(cluster.scheduler.pid, signal.SIGSTOP if fault == "freeze" else signal.SIGKILL)
        code, output, elapsed = ended_within(process, TIMEOUT_S + 60)
    finally:
        cluster.close()
    assert code == 2, output[-4000:]
    lines = [line for line in output.splitlines() if "run.dask_timeout_s" in line]
    assert len(lines) == 1 and f"finished no task for {TIMEOUT_S} s" in lines[0], output[-4000:]
    assert "re-run the same command to resume" in lines[0]
    assert "Traceback" not in output, output[-4000:]
    assert elapsed < TIMEOUT_S + 45, elapsed
    rerun_finishes(tmp_path / "run", prefect_api, data, target, tmp_path / "cluster2")
    assert outcome(run_dir(tmp_path / "run")) == outcome(reference)


def test_sigterm_ends_a_run_waiting_on_a_frozen_scheduler_promptly(prefect_api, data, target, tmp_path):
    pytest.importorskip("prefect_dask")
    cluster = Cluster(tmp_path / "cluster")
    try:
        # the default bound, 600 s: only the SIGTERM can end the wait within the test
        process = start_on(tmp_path / "run", prefect_api, data, cluster.address, target)
        after_calls(target, process, 10)
        os.killpg(cluster.scheduler.pid, signal.SIGSTOP)
        time.sleep(3)  # the run is now waiting on the frozen cluster
        process.send_signal(signal.SIGTERM)
        code, output, elapsed = ended_within(process, 60)
    finally:
        cluster.close()
    assert code == 143, output[-4000:]
    assert "re-run the same command to resume" in output and elapsed < 30
