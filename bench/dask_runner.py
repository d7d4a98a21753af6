"""What prefect-dask costs and buys: the per-task cost of the Dask runner against the thread pool, and the
speed-up of CPU-bound rollouts on 2 worker processes.

Every figure comes from a flow run in a fresh subprocess against a ``prefect server start`` on loopback
(SQLite, temporary ``PREFECT_HOME``), the way a team's runs talk to their server:

- **per-task cost**: ``--tasks`` no-op tasks submitted at once and waited for, on ``ThreadPoolTaskRunner(8)``
  and on a ``DaskTaskRunner`` over a local cluster of 2 worker processes x 4 threads; the wall time from the
  first submit to the last result, divided by the number of tasks. The cluster's start-up is timed apart.
  Also one task at a time (submit, wait, next): the latency a single task pays;
- **rollouts that travel**: the demo benchmark's real ``rollout_item`` tasks (scripted target, no model
  latency) for ``--items`` items through the flow's rollout pool, ``run.task_runner: threads`` against
  ``dask`` — the per-item cost of shipping the run spec and rebuilding the run on the workers included;
- **CPU-bound speed-up**: ``--cpu-tasks`` tasks that each burn about ``--cpu-seconds`` of pure-Python CPU
  (what an in-process simulator or scorer does), on 2 threads against 2 single-threaded worker processes.
  Threads share one interpreter lock; processes do not. On a machine with fewer than 2 free cores the
  speed-up is bounded by what is free (the load average is recorded).

``python bench/dask_runner.py`` prints the table and writes ``bench/results/dask.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import client_env, prefect_server  # noqa: E402

#: The measuring flows, run in a subprocess (Dask's worker processes need a main module they can import).
FLOWS = r'''
import json, os, sys, time
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner


@task
def noop(i):
    return os.getpid()


@task
def burn(seconds):
    """Pure-Python CPU work for about ``seconds`` on an idle core (calibrated below)."""
    n, total = int(seconds * LOOPS_PER_S), 0
    for i in range(n):
        total += i * i % 7
    return os.getpid()


def calibrate():
    start, n, total = time.perf_counter(), 2_000_000, 0
    for i in range(n):
        total += i * i % 7
    return n / (time.perf_counter() - start)


def runner(kind, workers, threads):
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=workers * threads)
    from prefect_dask import DaskTaskRunner
    cluster = {"n_workers": workers, "threads_per_worker": threads, "processes": True}
    return DaskTaskRunner(cluster_kwargs=cluster)


def timed(kind, workers, threads, job):
    started = time.perf_counter()
    result = {}

    @flow(task_runner=runner(kind, workers, threads))
    def measure():
        result["ready_s"] = time.perf_counter() - started   # the runner (and its cluster) has started
        job(result)

    measure()
    result["total_s"] = time.perf_counter() - started
    return result


def burst(n):
    def job(result):
        noop.submit(-1).result()  # warm: the first task also imports and connects
        start = time.perf_counter()
        pids = [f.result() for f in [noop.submit(i) for i in range(n)]]
        result["wall_s"] = time.perf_counter() - start
        result["per_task_ms"] = result["wall_s"] / n * 1000
        result["pids"] = len(set(pids))
        start = time.perf_counter()
        for i in range(min(n, 20)):
            noop.submit(i).result()
        result["one_at_a_time_ms"] = (time.perf_counter() - start) / min(n, 20) * 1000
    return job


def cpu(n, seconds):
    def job(result):
        burn.submit(0.01).result()
        start = time.perf_counter()
        pids = [f.result() for f in [burn.submit(seconds) for _ in range(n)]]
        result["wall_s"] = time.perf_counter() - start
        result["pids"] = len(set(pids))
    return job


if __name__ == "__main__":
    what, kind = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3])
    LOOPS_PER_S = calibrate()
    if what == "burst":
        out = timed(kind, 2, 4, burst(args["tasks"]))
    else:
        out = timed(kind, 2, 1, cpu(args["tasks"], args["seconds"]))
    print("RESULT " + json.dumps(out))
'''

ROLLOUTS = r'''
import json, os, sys, time

from prefect import flow

from skillopt.run.assembly import RunSpec
from skillopt.core.config import load_config
from skillopt.tasks.rollout import run_rollouts
from skillopt.tasks.run import started_run


@flow
def rollouts(task_runner, items):
    loaded = load_config("demo", overrides=[
        "model.target.backend=scripted", "model.optimizer.backend=scripted", "model.judge.backend=scripted",
        f"run.task_runner={task_runner}",
        *(["run.dask_n_workers=2", "run.dask_threads_per_worker=4"] if task_runner == "dask" else []),
        "benchmark.workers=8", "run.refresh_cache=true",
    ], env=os.environ)
    started = time.perf_counter()
    with started_run(RunSpec.create(loaded, run_name=f"bench-{task_runner}"), loaded=loaded) as run:
        ready = time.perf_counter()
        ids = (run.split_ids["train"] * items)[:items]
        run_rollouts(run, run.initial_skill, "train", ids[:2], training=False)  # warm: workers build the run
        start = time.perf_counter()
        rows = run_rollouts(run, run.initial_skill, "train", ids, training=True).rows
        wall = time.perf_counter() - start
    return {"ready_s": ready - started, "wall_s": wall, "per_item_ms": wall / len(ids) * 1000,
            "worker_pids": len({row.worker_pid for row in rows} - {os.getpid()})}


if __name__ == "__main__":
    print("RESULT " + json.dumps(rollouts(sys.argv[1], int(sys.argv[2]))))
'''


def run_script(source: str, argv: list[str], *, api: str, cwd: Path, timeout: float = 900) -> dict[str, Any]:
    script = cwd / "bench_flow.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script), *argv],
        env=client_env(api),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{argv} failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load_before": list(os.getloadavg())}}
    with prefect_server(workdir) as api:
        for kind in ("threads", "dask"):
            results[f"burst_{kind}"] = run_script(FLOWS, ["burst", kind, json.dumps({"tasks": args.tasks})],
                                                  api=api, cwd=workdir)
            results[f"cpu_{kind}"] = run_script(
                FLOWS, ["cpu", kind, json.dumps({"tasks": args.cpu_tasks, "seconds": args.cpu_seconds})],
                api=api, cwd=workdir)
            if args.items:
                results[f"rollouts_{kind}"] = run_script(
                    ROLLOUTS, [kind, str(args.items)], api=api, cwd=workdir
                )
    results["machine"]["load_after"] = list(os.getloadavg())
    results["cpu_speedup"] = results["cpu_threads"]["wall_s"] / results["cpu_dask"]["wall_s"]
    return results


def table(r: dict[str, Any]) -> str:
    def ms(value: float) -> str:
        return f"{value:.1f} ms"

    lines = [
        f"{r['machine']['cpus']} CPUs, load average before "
        f"{[round(x, 2) for x in r['machine']['load_before']]}, after "
        f"{[round(x, 2) for x in r['machine']['load_after']]}",
        "| measure | threads | dask (local cluster, 2 processes) |",
        "|---|---|---|",
        f"| runner start (cluster start-up for dask) | {r['burst_threads']['ready_s']:.2f} s | "
        f"{r['burst_dask']['ready_s']:.2f} s |",
        f"| per task, {r['args']['tasks']} no-op tasks submitted at once | "
        f"{ms(r['burst_threads']['per_task_ms'])} | {ms(r['burst_dask']['per_task_ms'])} |",
        f"| per task, one at a time (submit, wait) | {ms(r['burst_threads']['one_at_a_time_ms'])} | "
        f"{ms(r['burst_dask']['one_at_a_time_ms'])} |",
        f"| {r['args']['cpu_tasks']} CPU-bound tasks of ~{r['args']['cpu_seconds']} s, 2 threads vs 2 "
        f"processes | {r['cpu_threads']['wall_s']:.2f} s | {r['cpu_dask']['wall_s']:.2f} s (speed-up "
        f"{r['cpu_speedup']:.2f}x, {r['cpu_dask']['pids']} worker pids) |",
    ]
    if "rollouts_threads" in r:
        lines.append(
            f"| demo rollout_item tasks (scripted), {r['args']['items']} items, per item | "
            f"{ms(r['rollouts_threads']['per_item_ms'])} | {ms(r['rollouts_dask']['per_item_ms'])} "
            f"({r['rollouts_dask']['worker_pids']} worker pids) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="no-op tasks per burst")
    parser.add_argument("--cpu-tasks", type=int, default=8, help="CPU-bound tasks")
    parser.add_argument("--cpu-seconds", type=float, default=1.0, help="CPU seconds per CPU-bound task")
    parser.add_argument("--items", type=int, default=40, help="demo items rolled out per runner (0: skip)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "dask.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="skillopt-bench-dask-") as tmp:
        results = measure(args, Path(tmp))
    results["args"] = {**vars(args), "out": os.path.relpath(args.out, ROOT)}  # no machine paths in results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
