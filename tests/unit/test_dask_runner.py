"""``run.task_runner``: config checks, the missing-extra error, and the cluster-wide provider limiter."""

from __future__ import annotations

import builtins
import os
import time

import pytest

from skillopt.core.config import ProviderLimits, load_config
from skillopt.core.errors import ConfigError


def config(*overrides: str):
    return load_config("demo", overrides=list(overrides), env={}).config


def test_threads_is_the_default_and_dask_keys_need_the_dask_runner():
    assert config().run.task_runner == "threads"
    with pytest.raises(ConfigError, match=r"run.dask_address \(from -o run.dask_address\) needs "
                                          r"run.task_runner: dask"):
        config("run.dask_address=tcp://scheduler:8786")
    with pytest.raises(ConfigError) as info:
        config("run.dask_n_workers=2")
    assert str(info.value) == ("run.task_runner is threads (from built-in default): "
                               "run.dask_n_workers (from -o run.dask_n_workers) needs run.task_runner: dask")


def test_a_scheduler_address_and_a_local_cluster_size_exclude_each_other():
    assert (
        config(
            "run.task_runner=dask", "run.dask_n_workers=2", "run.dask_threads_per_worker=1"
        ).run.dask_n_workers
        == 2
    )
    with pytest.raises(ConfigError, match=r"^run.dask_address is set \(from -o run.dask_address\): "
                                          r"run.dask_threads_per_worker \(from -o "
                                          r"run.dask_threads_per_worker\) sizes a local cluster"):
        config(
            "run.task_runner=dask", "run.dask_address=tcp://scheduler:8786", "run.dask_threads_per_worker=4"
        )
    with pytest.raises(ConfigError, match=r"task_runner"):
        config("run.task_runner=ray")


def test_a_missing_extra_names_the_pip_command(monkeypatch):
    from skillopt.tasks.runners import TaskPools

    real_import = builtins.__import__

    def without_the_dask_extra(name, *args, **kwargs):
        if name in ("prefect_dask", "distributed"):
            raise ImportError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    # Both packages of the extra are hidden, so the test means the same with or without the extra installed.
    monkeypatch.setattr(builtins, "__import__", without_the_dask_extra)
    with pytest.raises(ConfigError, match=r"pip install 'skillopt\[dask\]'") as raised:
        TaskPools(config("run.task_runner=dask").run).__enter__()
    assert "distributed is not installed" in str(raised.value)


def test_threads_runs_get_a_fresh_bounded_thread_pool_per_stage():
    from prefect.task_runners import ThreadPoolTaskRunner

    from skillopt.tasks.runners import TaskPools

    with TaskPools(config().run) as pools:
        pool = pools.pool("rollouts", 3)
        assert isinstance(pool, ThreadPoolTaskRunner) and pool._max_workers == 3
        assert not pools.on_dask


# --------------------------------------------------------------------------------------------
# The limiter, on a real local cluster of two worker processes


def _hold(limits: ProviderLimits, seconds: float) -> tuple[float, float, int]:
    """One call under the limits, on a worker: the limiter is built there, as a worker's run builds it."""
    import os

    from skillopt.tasks.dask_limits import DaskRateLimiter

    with DaskRateLimiter({"api.example": limits}).acquire("api.example", tokens=1):
        start = time.time()
        time.sleep(seconds)
        end = time.time()
    return start, end, os.getpid()


def _rollout(size: int, seconds: float) -> tuple[float, float, int]:
    """One rollout's slot held on a worker, taken as a worker's run takes it (``Run.build`` with the worker's
    limiter)."""
    import os

    from skillopt.tasks.dask_limits import DaskRateLimiter

    slots = DaskRateLimiter({}).rollout_slots("test-run", size)
    slots.acquire()
    try:
        start = time.time()
        time.sleep(seconds)
        end = time.time()
    finally:
        slots.release()
    return start, end, os.getpid()


def _peak(spans: list[tuple[float, float, int]]) -> int:
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    return peak


@pytest.fixture(scope="module")
def cluster_client():
    """Two worker processes (starting them takes ~10-20 s here, hence the slow mark on their tests)."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=3, processes=True, dashboard_address=None
        ) as cl,
        distributed.Client(cl) as client,
    ):
        yield client


@pytest.mark.slow
def test_max_concurrency_holds_across_worker_processes(cluster_client):
    futures = [
        cluster_client.submit(_hold, ProviderLimits(max_concurrency=2), 0.3, pure=False) for _ in range(6)
    ]
    spans = cluster_client.gather(futures)
    assert len({pid for _, _, pid in spans}) == 2, "the calls did not run in both worker processes"
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    assert peak == 2


@pytest.mark.slow
def test_benchmark_workers_bounds_the_rollouts_of_every_worker_process_together(cluster_client):
    # 6 worker threads in 2 processes, a run with benchmark.workers=2: at most 2 rollouts at once in all
    futures = [cluster_client.submit(_rollout, 2, 0.3, pure=False) for _ in range(8)]
    spans = cluster_client.gather(futures)
    assert len({pid for _, _, pid in spans}) == 2, "the rollouts did not run in both worker processes"
    assert _peak(spans) == 2


@pytest.mark.slow
def test_the_request_rate_holds_across_worker_processes(cluster_client):
    # One request per 0.2 s, for the whole cluster.
    futures = [cluster_client.submit(_hold, ProviderLimits(rpm=300), 0.0, pure=False) for _ in range(6)]
    spans = cluster_client.gather(futures)
    assert len({pid for _, _, pid in spans}) == 2
    starts = sorted(start for start, _, _ in spans)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # Unlimited, six threads would start within milliseconds; a start is measured after the lock's round trip.
    assert min(gaps) >= 0.15, gaps
    assert starts[-1] - starts[0] >= 5 * 0.2 - 0.05, gaps


@pytest.mark.slow
def test_a_429_pauses_every_process(cluster_client):
    from skillopt.tasks.dask_limits import DaskRateLimiter

    limits = {"api.example.paused": ProviderLimits(rpm=6000)}
    # the flow's process got a 429
    DaskRateLimiter(limits, client=cluster_client).pause("api.example.paused", 1.0)
    paused_at = time.time()

    def start_after_pause(limits):
        from skillopt.tasks.dask_limits import DaskRateLimiter

        with DaskRateLimiter(limits).acquire("api.example.paused", tokens=1):
            return time.time()

    starts = cluster_client.gather([cluster_client.submit(start_after_pause, limits, pure=False)
                                    for _ in range(4)])
    assert min(starts) >= paused_at + 1.0 - 0.05


# --------------------------------------------------------------------------------------------
# Runs travel as their spec


def test_a_run_pickles_as_its_spec_and_a_worker_joins_it_without_the_flow_s_lock(tmp_path):
    import pickle
    import subprocess
    import sys

    from skillopt.run.assembly import RunSpec
    from skillopt.tasks.run import limiter_for, start_run

    loaded = load_config(
        "demo", overrides=[f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'c'}"], env={}
    )
    run = start_run(RunSpec.create(loaded, run_name="travels"), loaded=loaded)
    payload = pickle.dumps(run)
    # The spec (a few KB of config), not the items, the clients and their locks.
    assert len(payload) < 8000 and all(
        item["question"].encode() not in payload for item in run.items.values()
    )
    assert pickle.loads(payload) is run  # in the flow's own process: the flow's run
    assert run.limiter_for is limiter_for

    # Another process (a worker) rebuilds it, while this process holds the run directory's lock.
    (tmp_path / "run.pickle").write_bytes(payload)
    worker = ("import os, pickle, sys; run = pickle.loads(open(sys.argv[1], 'rb').read()); "
              "print(len(run.split_ids['train']), run.dir.path, os.getpid())")
    done = subprocess.run([sys.executable, "-c", worker, str(tmp_path / "run.pickle")], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    train, path, pid = done.stdout.split()
    assert int(train) == len(run.split_ids["train"]) and path == str(run.dir.path) and int(pid) != os.getpid()


def test_a_dask_run_takes_its_rollout_slots_from_the_cluster_and_a_threads_run_from_its_process(tmp_path):
    pytest.importorskip("distributed")
    from skillopt.run.assembly import RunSpec
    from skillopt.run.rollouts import RolloutSlots
    from skillopt.tasks.dask_limits import DaskSlots
    from skillopt.tasks.run import start_run

    common = [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'c'}", "benchmark.workers=5"]
    for runner, kind in (("dask", DaskSlots), ("threads", RolloutSlots)):
        loaded = load_config("demo", overrides=[*common, f"run.task_runner={runner}"], env={})
        run = start_run(RunSpec.create(loaded, run_name=f"slots-{runner}"), loaded=loaded)
        assert isinstance(run.rollout_slots, kind) and run.rollout_slots.size == 5


# --------------------------------------------------------------------------------------------
# Waiting on the cluster with a bound


class _Wrapped:
    """A distributed future's face: ``done`` and ``result(timeout)``; it never finishes unless told to."""

    def __init__(self) -> None:
        self.value = None
        self.finished = False
        self.dropped = False

    def done(self) -> bool:
        return self.finished

    def cancelled(self) -> bool:
        return self.dropped

    def result(self, timeout=None):
        if not self.finished:
            time.sleep(min(timeout or 0.01, 0.01))
            raise TimeoutError
        return self.value


class _Future:
    def __init__(self) -> None:
        self.wrapped_future = _Wrapped()
        self.task_run_id = "run-1"

    def result(self, raise_on_failure=True):
        return self.wrapped_future.result()


class _Scheduler:
    address = "tcp://127.0.0.1:1"

    def identity(self):
        return {"workers": {}}


class _Client:
    scheduler = _Scheduler()

    def sync(self, call, callback_timeout=None):
        return call()


def test_a_wait_on_a_cluster_that_finishes_nothing_stops_at_the_timeout_and_says_why(monkeypatch):
    from skillopt.shell.interrupt import InterruptGuard
    from skillopt.tasks import dask_wait

    monkeypatch.setattr(dask_wait, "SLICE_S", 0.01)
    now = [100.0]
    watch = dask_wait.ClusterWatch(_Client(), 30, clock=lambda: now[0])
    done, stuck = dask_wait.BoundedFuture(_Future(), watch), dask_wait.BoundedFuture(_Future(), watch)
    now[0] += 29
    done._future.wrapped_future.finished = True
    done._future.wrapped_future.value = "row"
    assert done.result() == "row"  # a finished task restarts the clock
    now[0] += 29
    stopped = []
    guard = InterruptGuard(err=None)  # type: ignore[arg-type]
    guard.stop_because = lambda reason, exit_code=1: stopped.append((reason, exit_code))
    monkeypatch.setattr(dask_wait, "active_guard", lambda: guard)
    now[0] += 1.5
    with pytest.raises(dask_wait.ClusterLost) as lost:
        stuck.result()
    message = str(lost.value)
    assert message == ("the Dask cluster finished no task for 30 s (run.dask_timeout_s): the scheduler at "
                       "tcp://127.0.0.1:1 has no workers left; re-run the same command to resume")
    assert stopped == [(message, 2)]
    with pytest.raises(dask_wait.ClusterLost):  # any later wait stops too, and the guard is told once
        dask_wait.BoundedFuture(_Future(), watch).result()
    assert len(stopped) == 1 and watch.lost


def test_the_clock_starts_with_the_first_outstanding_task_not_at_the_last_idle():
    from skillopt.tasks import dask_wait

    now = [0.0]
    watch = dask_wait.ClusterWatch(_Client(), 30, clock=lambda: now[0])
    now[0] += 3600  # an hour of optimizer calls with nothing on the cluster
    assert watch.stalled_for() == 0.0
    dask_wait.BoundedFuture(_Future(), watch)
    now[0] += 10
    assert watch.stalled_for() == 10.0
    watch.check()  # within the bound: no stop


def test_the_timeout_is_a_positive_run_setting():
    assert config().run.dask_timeout_s == 600
    assert config("run.task_runner=dask", "run.dask_timeout_s=30").run.dask_timeout_s == 30
    with pytest.raises(ConfigError, match=r"dask_timeout_s"):
        config("run.dask_timeout_s=0")


@pytest.mark.slow
def test_the_flow_s_limiter_gives_up_on_a_frozen_scheduler_within_its_timeout(tmp_path, monkeypatch):
    """An analyst's call in the flow's process waits on the scheduler for a lease: frozen (SIGSTOP), the
    scheduler would hold it for ever; the limiter stops the run after run.dask_timeout_s."""
    import json
    import signal
    import subprocess
    import sys

    distributed = pytest.importorskip("distributed")
    from skillopt.tasks import dask_wait
    from skillopt.tasks.dask_limits import DaskRateLimiter

    stops = []
    monkeypatch.setattr(dask_wait, "active_guard", lambda: type("G", (), {
        "stop_because": staticmethod(lambda reason, exit_code: stops.append(exit_code))})())
    file = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(file)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with distributed.Client(json.loads(file.read_text())["address"], timeout=30) as client:
            limiter = DaskRateLimiter({"api.example": ProviderLimits(max_concurrency=1)}, client=client,
                                      timeout_s=3)
            with limiter.acquire("api.example", tokens=1):
                pass  # answered while the scheduler runs
            os.kill(scheduler.pid, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(dask_wait.ClusterLost, match=r"within 3 s \(run.dask_timeout_s\)"), \
                    limiter.acquire("api.example", tokens=1):
                pass
            assert time.monotonic() - started < 15 and stops == [2]
            os.kill(scheduler.pid, signal.SIGKILL)
    finally:
        os.kill(scheduler.pid, signal.SIGKILL)
        scheduler.wait(timeout=30)


def test_a_task_the_scheduler_dropped_is_submitted_again():
    from skillopt.tasks import dask_wait

    watch = dask_wait.ClusterWatch(_Client(), 30)
    dropped = _Future()
    dropped.wrapped_future.finished = dropped.wrapped_future.dropped = True
    again = _Future()
    again.wrapped_future.finished, again.wrapped_future.value = True, "row"
    submitted = []

    def resubmit():
        submitted.append(1)
        return again

    assert dask_wait.BoundedFuture(dropped, watch, resubmit=resubmit).result() == "row"
    assert submitted == [1] and watch.stalled_for() == 0.0
