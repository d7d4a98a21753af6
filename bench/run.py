"""Performance and fault-tolerance benchmarks of ``skillopt train`` against the latency world.

Every measurement runs the real command (``python -m skillopt.shell.cli train demo``) in a subprocess, with
target
and optimizer on the ``openai_compatible`` backend pointed at ``bench/latency_world.py`` and a ``prefect
server start`` on loopback (SQLite in a temporary ``PREFECT_HOME``). Reported (see ``bench/README.md`` for the
definitions):

- per step: wall time, wall time per stage, calls and tokens per stage, the critical-path bound
  ``sum over stages of ceil(calls / concurrency) * latency`` and actual / bound;
- Prefect: task runs created per step, overhead per task (the same run with latency 0) and the share
  of wall time that is not model latency (an upper bound of Prefect's share);
- the server's ingest rate (task runs per second) on SQLite (as skillopt starts the server, and Prefect's own
  `prefect server start`, `sqlite_deferred`) and on PostgreSQL (a temporary cluster);
- peak memory of the training process;
- scaling over batch sizes and concurrency;
- resume cost: kill -9 at seeded random points, run again, count completed calls made twice;
- fault soak: seeded 429 / 500 / timeouts / malformed bodies plus garbled optimizer JSON; the run must end
  with the same skill and scores as a fault-free run, with no lost rows.

``python bench/run.py --quick`` runs small sizes in a few minutes and prints the table; without ``--quick`` it
runs the full grid. Results go to ``bench/results/<mode>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.latency_world import Faults, LatencyWorld  # noqa: E402
from tests.fakes.demo_world_http import role_overrides  # noqa: E402

PROVIDER_KEY = "latency-world"
#: Stages of a step, in order, for the bound: (name in the report, ledger stage, rollout kind).
STEP_STAGES = ("rollout", "analyst", "merge", "ranking", "gate")


# --------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"prefect server did not become healthy; log {log}:\n{log.read_text()[-2000:]}"
            )
        time.sleep(0.5)


@contextlib.contextmanager
def prefect_server(workdir: Path, *, database_url: str | None = None,
                   server_module: str = "skillopt.shell.prefect_server") -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1 with its own PREFECT_HOME, as skillopt starts it (SQLite
    transactions begun IMMEDIATE; ``server_module="prefect"``: Prefect's own); yields the API URL."""
    home = workdir / "prefect-home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    log_path = workdir / f"prefect-server-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", server_module, "server", "start", "--host", "127.0.0.1", "--port",
             str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            _wait_healthy(url, process, log_path)
            yield url
        finally:
            _stop_group(process)


def client_env(api: str) -> dict[str, str]:
    """The environment of a process run against the bench's server ``api``: quiet, and this checkout's
    ``skillopt``, ``bench`` and ``tests`` importable."""
    return {**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}


def _stop_group(process: subprocess.Popen, timeout: float = 20) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: ``pg_config --bindir`` first, else PATH."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        bindir = Path(found.stdout.strip())
        if found.returncode == 0 and (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    for name in ("pg_ctl", "initdb"):
        located = shutil.which(name)
        if (
            located
            and (Path(located).parent / "pg_ctl").exists()
            and (Path(located).parent / "initdb").exists()
        ):
            return Path(located).parent
    raise RuntimeError("PostgreSQL not found: install postgresql (pg_config, initdb and pg_ctl)")


@contextlib.contextmanager
def postgres_cluster(workdir: Path) -> Iterator[str]:
    """A throw-away PostgreSQL cluster on 127.0.0.1 (trust auth, free port); yields an asyncpg URL."""
    import importlib.util

    if importlib.util.find_spec("asyncpg") is None:
        raise RuntimeError("asyncpg is not importable: pip install asyncpg (Prefect's PostgreSQL driver)")
    bindir = postgres_bindir()
    pgdir = Path(tempfile.mkdtemp(prefix="skillopt-pg-", dir=workdir))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: run the cluster as the postgres user
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError as error:
            raise RuntimeError("running as root and no 'postgres' user exists to own the cluster") from error
        os.chown(pgdir, owner.pw_uid, owner.pw_gid)
        os.chmod(workdir, 0o755)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = pgdir / "data", free_port()

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")

    run(str(bindir / "initdb"), "-D", str(data), "-U", "skillopt", "--auth=trust", "-E", "UTF8")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(pgdir / "postgres.log"), "-w", "-t", "60",
        "-o", f"-p {port} -k {pgdir} -c listen_addresses=127.0.0.1 -c max_connections=200", "start")
    try:
        run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "skillopt", "prefect")
        yield f"postgresql+asyncpg://skillopt@127.0.0.1:{port}/prefect"
    finally:
        with contextlib.suppress(RuntimeError):
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(pgdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Prefect API reads


def api_post(api: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def task_runs_since(api: str, since: datetime) -> list[dict[str, Any]]:
    """Every task run expected to start after ``since`` (UTC): name, expected start (epoch s), state type."""
    found, offset = [], 0
    while True:
        page = api_post(api, "/task_runs/filter", {
            "task_runs": {"expected_start_time": {"after_": since.isoformat()}},
            "sort": "EXPECTED_START_TIME_ASC", "limit": 200, "offset": offset,
        })
        found += [{"name": r["name"].rsplit("-", 1)[0], "at": _epoch(r["expected_start_time"]),
                   "state": r.get("state_type")} for r in page]
        if len(page) < 200:
            return found
        offset += 200


def settled_task_runs(api: str, since: datetime, *, at_least: int = 0, quiet_s: float = 3.0,
                      timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Task runs after ``since``, read once there are ``at_least`` and the count has stopped growing (the
    server ingests asynchronously, in batches: 400 task runs reached the database 13-15 s after the client had
    finished them, with pauses longer than ``quiet_s`` between batches)."""
    deadline = time.monotonic() + timeout_s
    runs = task_runs_since(api, since)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = task_runs_since(api, since)
        final = all(r["state"] not in (None, "PENDING", "RUNNING") for r in again)
        settled = len(again) == len(runs) and final
        if settled and len(again) >= at_least:
            return again
        runs = again
    return runs


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------------------------
# One training run


def world_roles(url: str) -> list[str]:
    """Overrides that put target and optimizer on the ``openai_compatible`` backend pointed at the latency
    world at ``url`` (the demo world fake's ``role_overrides``), in one provider bucket; no judge."""
    return [*role_overrides(url),
            *(f"model.{role}.rate_limit_key={PROVIDER_KEY}" for role in ("target", "optimizer"))]


def train_overrides(url: str, *, workers: int, batch: int, train_size: int, val_size: int, epochs: int,
                    seed: int, eval_test: bool) -> list[str]:
    """``world_roles`` plus the sizes of a demo run and ``workers`` calls, rollouts and analysts at a time."""
    return world_roles(url) + [
        f"model.providers.{PROVIDER_KEY}.max_concurrency={workers}",
        f"benchmark.workers={workers}", f"gradient.analyst_workers={workers}",
        f"train.batch_size={batch}", f"benchmark.train_size={train_size}", f"benchmark.val_size={val_size}",
        f"train.epochs={epochs}", f"train.seed={seed}",
        f"evaluation.eval_test={'true' if eval_test else 'false'}",
    ]


@dataclass(frozen=True)
class Spec:
    """One ``skillopt train demo`` run against the latency world."""

    label: str
    batch: int
    concurrency: int
    latency: float
    epochs: int = 1
    train_size: int = 0  # 0 = the batch size (one step per epoch)
    val_size: int = 12
    eval_test: bool = False
    fault_rate: float = 0.0
    seed: int = 42
    zero_latency: bool = True  # also run it at latency 0 (Prefect overhead per task)

    def overrides(self, url: str) -> list[str]:
        items = train_overrides(url, workers=self.concurrency, batch=self.batch,
                                train_size=self.train_size or self.batch, val_size=self.val_size,
                                epochs=self.epochs, seed=self.seed, eval_test=self.eval_test)
        if self.fault_rate:  # short timeouts and quick backoff so a soak does not spend minutes asleep
            items += [f"model.{role}.timeout_s=2" for role in ("target", "optimizer")]
            items += ["model.retry.base=0.2", "model.retry.cap=2"]
        return items


@dataclass
class Launch:
    returncode: int
    wall_s: float
    peak_rss_mb: float
    started: datetime
    started_epoch: float
    run_dir: Path
    log: Path


def launch(spec: Spec, *, world: LatencyWorld, api: str, cwd: Path, run_name: str = "bench",
           kill_when_held: float | None = None) -> Launch:
    """Run ``skillopt train demo`` for ``spec``; with ``kill_when_held`` the process group gets SIGKILL that
    many seconds after the world starts holding requests."""
    cwd.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", run_name]
    for item in spec.overrides(world.base_url):
        argv += ["-o", item]
    env = client_env(api)
    log = cwd / f"{run_name}-{int(time.time() * 1000)}.log"
    started, started_epoch, clock = datetime.now().astimezone(), time.time(), time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        reaped = None
        if kill_when_held is not None:
            while not world.held.wait(timeout=0.5):
                reaped = _reap(process.pid, block=False)
                if reaped is not None:
                    break
            if reaped is None:
                time.sleep(kill_when_held)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        returncode, usage = reaped or _reap(process.pid, block=True)  # type: ignore[misc]
        # reaped here (wait4 gives its peak memory); Popen must not wait again
        process.returncode = returncode
    wall = time.monotonic() - clock
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    rss_mb = usage.ru_maxrss / (1024 * 1024 if platform.system() == "Darwin" else 1024)
    return Launch(returncode, wall, rss_mb, started, started_epoch, cwd / "runs" / run_name, log)


def _reap(pid: int, *, block: bool) -> tuple[int, Any] | None:
    """Exit code and resource usage of the child ``pid`` once it has ended (None if still running)."""
    found, wait_status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
    if found == 0:
        return None
    return os.waitstatus_to_exitcode(wait_status), usage


def _failed(launch_: Launch) -> str:
    return (
        f"skillopt train exited {launch_.returncode}; log {launch_.log}:\n{launch_.log.read_text()[-3000:]}"
    )


# --------------------------------------------------------------------------------------------
# Reading a finished run


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def step_windows(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, start, end) in epoch seconds, from the skill snapshots written at the end of each step
    (``step_0000`` ends the baseline)."""
    snapshots = sorted((run_dir / "skills").glob("step_*.md"))
    ends = [(int(p.stem.split("_")[1]), p.stat().st_mtime) for p in snapshots]
    return [(step, ends[i - 1][1], end) for i, (step, end) in enumerate(ends) if i > 0]


def initial_skill_sha(usage: list[dict[str, Any]]) -> str | None:
    """The skill the run started from: that of its first rollout (the baseline's)."""
    return next((r.get("tags", {}).get("skill_sha") for r in usage if r["stage"] == "rollout"), None)


def made_ahead(record: dict[str, Any], initial_sha: str | None) -> bool:
    """Of a call answered before the baseline's snapshot: one of step 1's — an optimizer call, or a rollout of
    another skill than the initial one (step 1's candidate). The baseline's own calls and step 1's first batch
    (prefetched with it, ``skillopt.run.prefetch``) roll out the initial skill."""
    return record["stage"] != "rollout" or record.get("tags", {}).get("skill_sha") != initial_sha


def stage_of(record: dict[str, Any]) -> str:
    if record["stage"] == "rollout":
        return "rollout" if record.get("tags", {}).get("training") else "gate"
    return str(record["stage"])


def analyse(spec: Spec, launch_: Launch, *, api: str | None) -> dict[str, Any]:
    """Per-step and whole-run figures of a finished run."""
    run_dir = launch_.run_dir
    history = [r for r in read_jsonl(run_dir / "history.jsonl") if r.get("kind") == "step"]
    usage = [r for r in read_jsonl(run_dir / "usage.jsonl") if not r.get("cache_hit")]
    for record in usage:
        record["at"] = _epoch(record["ts"])
    # Each rollout call of the demo (one turn per item) was made by a rollout_item task run of its own.
    rollout_calls = sum(r["stage"] == "rollout" for r in usage)
    task_runs = settled_task_runs(api, launch_.started, at_least=rollout_calls) if api else []
    windows = step_windows(run_dir)
    initial = initial_skill_sha(usage)
    steps = []
    for step, start, end in windows:
        calls = [r for r in usage if start < r["at"] <= end]
        if step == windows[0][0]:  # step 1's calls made ahead of the flow came before the baseline's snapshot
            calls += [r for r in usage if r["at"] <= start and made_ahead(r, initial)]
        record = next((h for h in history if h["step"] == step), {})
        by_stage: dict[str, dict[str, int]] = {}
        for call in calls:
            row = by_stage.setdefault(stage_of(call), Counter())
            row["calls"] += 1
            row["attempts"] += call.get("attempts") or 1
            row["tokens"] += (call.get("prompt_tokens") or 0) + (call.get("completion_tokens") or 0)
        bound = sum(math.ceil(row["calls"] / spec.concurrency) * spec.latency for row in by_stage.values())
        runs = [t for t in task_runs if start < t["at"] <= end]
        wall = end - start
        steps.append({
            "step": step, "wall_s": round(wall, 3),
            "stage_wall_s": {k: round(v, 3) for k, v in (record.get("wall_s") or {}).items()},
            "calls": {k: dict(v) for k, v in sorted(by_stage.items())},
            "bound_s": round(bound, 3), "ratio": round(wall / bound, 3) if bound else None,
            "task_runs": len(runs), "task_runs_by_name": dict(Counter(t["name"] for t in runs)),
            "decision": record.get("decision"),
        })
    stages: dict[str, Counter] = {}
    for call in usage:
        row = stages.setdefault(stage_of(call), Counter())
        row["calls"] += 1
        row["attempts"] += call.get("attempts") or 1
        row["prompt_tokens"] += call.get("prompt_tokens") or 0
        row["completion_tokens"] += call.get("completion_tokens") or 0
    summary = (
        json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    )
    return {
        "spec": asdict(spec), "returncode": launch_.returncode, "wall_s": round(launch_.wall_s, 3),
        "peak_rss_mb": round(launch_.peak_rss_mb, 1), "steps": steps,
        "stages": {k: dict(v) for k, v in sorted(stages.items())},
        "task_runs_total": len(task_runs), "task_runs_by_name": dict(Counter(t["name"] for t in task_runs)),
        "scores": summary.get("scores"),
        "first_step_start_s": round(windows[0][1] - launch_.started_epoch, 3) if windows else None,
    }


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


# --------------------------------------------------------------------------------------------
# Measurements


def measure(spec: Spec, *, world: LatencyWorld, api: str, workdir: Path) -> dict[str, Any]:
    """One configuration at its latency and at latency 0: ratio, overhead per task, non-model share."""
    result: dict[str, Any] = {}
    for latency in (spec.latency, 0.0) if spec.zero_latency else (spec.latency,):
        run_spec = replace(spec, latency=latency)
        world.reset(latency_s=latency, faults=Faults())
        done = launch(run_spec, world=world, api=api, cwd=workdir / f"{spec.label}-lat{latency:g}")
        if done.returncode != 0:
            raise RuntimeError(_failed(done))
        result["measured" if latency else "zero_latency"] = {**analyse(run_spec, done, api=api),
                                                             "world": world.counts()}
    measured = later_steps(result["measured"])
    zero = later_steps(result["zero_latency"]) if "zero_latency" in result else []
    step_wall = mean([s["wall_s"] for s in measured])
    zero_wall = mean([s["wall_s"] for s in zero])
    runs = mean([s["task_runs"] for s in zero or measured])
    result["summary"] = {
        "batch": spec.batch, "concurrency": spec.concurrency, "latency_s": spec.latency,
        "steps_averaged": [s["step"] for s in measured],
        "first_step_s": result["measured"]["steps"][0]["wall_s"] if result["measured"]["steps"] else None,
        "first_step_ratio": result["measured"]["steps"][0]["ratio"] if result["measured"]["steps"] else None,
        "step_wall_s": step_wall, "bound_s": mean([s["bound_s"] for s in measured]),
        "ratio": mean([s["ratio"] for s in measured]),
        "task_runs_per_step": runs,
        "zero_latency_step_s": zero_wall,
        "overhead_per_task_ms": round(1000 * zero_wall / runs, 1) if zero_wall and runs else None,
        "non_model_share": round(zero_wall / step_wall, 3) if zero_wall and step_wall else None,
        "peak_rss_mb": result["measured"]["peak_rss_mb"], "run_wall_s": result["measured"]["wall_s"],
        "startup_s": result["measured"]["first_step_start_s"],
        "calls_per_step": mean([sum(row["calls"] for row in s["calls"].values()) for s in measured]),
    }
    return result


def library_call_ms(world: LatencyWorld, api: str, workdir: Path, n: int = 40) -> float:
    """Mean wall time of one demo rollout through skillopt's own code and the real HTTP client at latency 0,
    without Prefect (``run_item`` called directly, one thread): what a task costs before Prefect adds
    anything."""
    from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_LEVEL, temporary_settings

    from skillopt.benchmarks.runner import run_item
    from skillopt.core.config import load_config
    from skillopt.run.assembly import Run

    world.reset(latency_s=0.0, faults=Faults())
    spec = Spec("library", batch=n, concurrency=1, latency=0.0)
    cwd = workdir / "library"
    cwd.mkdir(parents=True, exist_ok=True)
    overrides = [
        *spec.overrides(world.base_url),
        f"run.runs_dir={cwd / 'runs'}",
        f"run.cache_dir={cwd / 'cache'}",
    ]
    # the run's own warnings (unpriced model, thinking) are not news here
    quiet = logging.getLogger("skillopt")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_LOGGING_LEVEL: "WARNING"}):
        ctx = Run.from_config(load_config("demo", overrides=overrides, env={}), env={}, run_name="library")
        items = [ctx.items[i] for i in ctx.split_ids["train"][:n]]
        run_item(
            ctx.benchmark, items[0], ctx.initial_skill, ctx.bench_cfg, target=ctx.clients.target, judge=None
        )
        started = time.perf_counter()
        for item in items:
            run_item(
                ctx.benchmark, item, ctx.initial_skill, ctx.bench_cfg, target=ctx.clients.target, judge=None
            )
    quiet.setLevel(level)
    return round(1000 * (time.perf_counter() - started) / len(items), 2)


def prefect_estimate(summary: dict[str, Any], calls_per_step: float | None, library_ms: float | None
                     ) -> dict[str, Any]:
    """Prefect's part of a latency-0 step: its wall time minus the calls' own cost (``library_ms`` each,
    counted as serial: two cores, one GIL), per task run and as a share of the step's wall time at its
    latency."""
    zero, runs, wall = (
        summary.get("zero_latency_step_s"),
        summary.get("task_runs_per_step"),
        summary.get("step_wall_s"),
    )
    if not (zero and runs and wall and calls_per_step and library_ms):
        return {}
    prefect_s = max(0.0, zero - calls_per_step * library_ms / 1000)
    return {"library_call_ms": library_ms, "calls_per_step": calls_per_step,
            "prefect_ms_per_task": round(1000 * prefect_s / runs, 1),
            "prefect_share": round(prefect_s / wall, 3)}


def later_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps to average: all but the first when there are several (the first also starts the epoch subflow
    and builds the optimizer's client)."""
    return run["steps"][1:] if len(run["steps"]) > 1 else run["steps"]


INGEST_FLOW = """
import sys, time
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

@task
def noop(i):
    return i

@flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
def ingest(n):
    return sum(f.result() for f in [noop.submit(i) for i in range(n)])

start = time.time()
ingest(int(sys.argv[1]))
print(f"CLIENT_DONE {start} {time.time()}")
"""


def ingest_rate(api: str, workdir: Path, n: int) -> dict[str, Any]:
    """Task runs per second the server takes: ``n`` no-op tasks in one flow, timed until the server has them
    all in a final state."""
    script = workdir / "ingest_flow.py"
    script.write_text(INGEST_FLOW)
    since = datetime.now().astimezone()
    done = subprocess.run([sys.executable, str(script), str(n)], env=client_env(api), capture_output=True,
                          text=True, timeout=900, check=False)
    marker = [line for line in done.stdout.splitlines() if line.startswith("CLIENT_DONE")]
    if done.returncode != 0 or not marker:
        raise RuntimeError(f"ingest flow failed:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    client_start, client_end = map(float, marker[0].split()[1:])
    deadline = time.monotonic() + 600
    while True:
        count = api_post(
            api,
            "/task_runs/count",
            {
                "task_runs": {
                    "expected_start_time": {"after_": since.isoformat()},
                    "state": {"type": {"any_": ["COMPLETED"]}},
                }
            },
        )
        if count >= n or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    settled = time.time()
    return {"tasks": n, "client_s": round(client_end - client_start, 2),
            "until_stored_s": round(settled - client_start, 2), "stored": count,
            "task_runs_per_s": round(count / (settled - client_start), 1)}


def ingest_both(workdir: Path, n: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with prefect_server(workdir / "ingest-sqlite") as api:
        results["sqlite"] = ingest_rate(api, workdir / "ingest-sqlite", n)
    with prefect_server(workdir / "ingest-sqlite-prefect", server_module="prefect") as api:
        results["sqlite_deferred"] = ingest_rate(api, workdir / "ingest-sqlite-prefect", n)
    try:
        with postgres_cluster(workdir) as database_url, \
                prefect_server(workdir / "ingest-postgres", database_url=database_url) as api:
            results["postgresql"] = ingest_rate(api, workdir / "ingest-postgres", n)
    except RuntimeError as error:
        results["postgresql"] = {"error": str(error)[:1500]}
    return results


def resume_trials(spec: Spec, *, world: LatencyWorld, api: str, workdir: Path, trials: int, seed: int
                  ) -> dict[str, Any]:
    """Kill -9 at seeded random points, run the same command again, count completed calls made twice."""
    world.reset(latency_s=spec.latency, faults=Faults())
    reference = launch(spec, world=world, api=api, cwd=workdir / "resume-reference")
    if reference.returncode != 0:
        raise RuntimeError(_failed(reference))
    reference_calls = world.answered_bodies()
    reference_skill = (reference.run_dir / "best_skill.md").read_text()
    rng = random.Random(seed)
    rows = []
    for trial in range(trials):
        world.reset(latency_s=spec.latency, faults=Faults())
        kill_at = rng.randint(max(1, len(reference_calls) // 10), max(2, 9 * len(reference_calls) // 10))
        world.hold_after(kill_at)
        cwd = workdir / f"resume-{trial}"
        killed = launch(spec, world=world, api=api, cwd=cwd, kill_when_held=1.5)
        if killed.returncode != -signal.SIGKILL:
            raise RuntimeError(f"trial {trial}: the run was not killed at answer {kill_at} "
                               f"({_failed(killed)})")
        before = set(world.answered_bodies())
        world.reset(latency_s=spec.latency, faults=Faults())
        again = launch(spec, world=world, api=api, cwd=cwd)
        if again.returncode != 0:
            raise RuntimeError(f"trial {trial}: the restarted run failed ({_failed(again)})")
        after = world.answered_bodies()
        repeated = len(before & set(after))
        rows.append({
            "trial": trial, "kill_after_answers": kill_at, "killed_returncode": killed.returncode,
            "completed_before_kill": len(before), "calls_after_restart": len(after), "repeated": repeated,
            "total_vs_reference": len(before) + len(after) - len(reference_calls),
            "resumed_ok": again.returncode == 0,
            "same_best_skill": again.returncode == 0 and (again.run_dir / "best_skill.md").read_text()
            == reference_skill,
        })
    return {"spec": asdict(spec), "reference_calls": len(reference_calls), "trials": rows,
            "repeated_total": sum(r["repeated"] for r in rows),
            "all_resumed": all(r["resumed_ok"] and r["same_best_skill"] for r in rows)}


def evaluation_rows(run_dir: Path) -> dict[str, dict[str, int]]:
    """Rows and error rows per evaluation file of a run."""
    found = {}
    for path in sorted((run_dir / "eval").glob("*.jsonl")):
        rows = read_jsonl(path)
        found[path.stem] = {"rows": len(rows), "errors": sum(r.get("status") == "error" for r in rows)}
    return found


def fault_soak(spec: Spec, *, world: LatencyWorld, api: str, workdir: Path, seed: int) -> dict[str, Any]:
    """The same run fault-free and at ``spec.fault_rate``: same final skill and scores, no lost rows."""
    outcome: dict[str, Any] = {"spec": asdict(spec)}
    runs = {}
    for name, rate in (("clean", 0.0), ("faulty", spec.fault_rate)):
        world.reset(latency_s=spec.latency,
                    faults=Faults.soak(rate, retry_after_s=0.5, hold_s=3.0) if rate else Faults())
        world.seed = seed
        done = launch(replace(spec, fault_rate=rate), world=world, api=api, cwd=workdir / f"soak-{name}")
        usage = read_jsonl(done.run_dir / "usage.jsonl")
        history = read_jsonl(done.run_dir / "history.jsonl")
        summary = json.loads((done.run_dir / "summary.json").read_text()) if done.returncode == 0 else {}
        runs[name] = done
        outcome[name] = {
            "returncode": done.returncode,
            "wall_s": round(done.wall_s, 2),
            "world": world.counts(),
            "calls": sum(not r.get("cache_hit") for r in usage),
            "retries": sum(max(0, (r.get("attempts") or 1) - 1) for r in usage),
            "failed_calls": sum(r.get("status") != "ok" for r in usage if not r.get("cache_hit")),
            "fallbacks": sum(len(h.get("warnings") or []) for h in history),
            "patches_unparsed": sum(
                h.get("patches_proposed", 0) - h.get("patches_parsed", 0) for h in history
            ),
            "scores": summary.get("scores"),
            "eval_rows": evaluation_rows(done.run_dir),
            "best_skill_sha": summary.get("best_skill_sha"),
        }
        if done.returncode != 0:
            outcome[name]["log_tail"] = done.log.read_text()[-2000:]
    clean, faulty = outcome["clean"], outcome["faulty"]
    same_skill = (
        (runs["clean"].run_dir / "best_skill.md").exists()
        and (runs["faulty"].run_dir / "best_skill.md").exists()
        and (runs["clean"].run_dir / "best_skill.md").read_text()
        == (runs["faulty"].run_dir / "best_skill.md").read_text()
    )
    lost = sum(
        max(0, clean["eval_rows"].get(k, {}).get("rows", 0) - faulty["eval_rows"].get(k, {}).get("rows", 0))
        for k in clean["eval_rows"]
    ) + sum(v["errors"] for v in faulty["eval_rows"].values())
    outcome["verdict"] = {
        "completed": faulty["returncode"] == 0, "same_best_skill": same_skill,
        "same_scores": clean["scores"] == faulty["scores"] and clean["scores"] is not None,
        "lost_results": lost,
        "faults_injected": sum(sum(s["faults"].values()) for s in faulty["world"].values()),
        "garbled_replies": sum(s["garbled"] for s in faulty["world"].values()),
        "retries": faulty["retries"], "reasks": sum(s["reasks"] for s in faulty["world"].values()),
        "fallbacks": faulty["fallbacks"], "patches_unparsed": faulty["patches_unparsed"],
    }
    return outcome


# --------------------------------------------------------------------------------------------
# Plans and the table


@dataclass
class Plan:
    mode: str
    headline: Spec
    grid: list[Spec]
    resume: Spec
    resume_trials: int
    soak: Spec
    ingest_tasks: int
    postgres: bool = True
    warm_up: bool = True
    notes: list[str] = field(default_factory=list)


def plan_for(mode: str) -> Plan:
    if mode == "smoke":
        tiny = Spec("smoke", batch=4, concurrency=4, latency=0.02, val_size=4, zero_latency=False)
        return Plan(mode, tiny, [], tiny, 1, replace(tiny, label="soak", fault_rate=0.2), 0, postgres=False,
                    warm_up=False)
    if mode == "quick":
        return Plan(
            mode,
            Spec("headline", batch=8, concurrency=4, latency=0.2, train_size=16, val_size=8),
            [Spec("grid", batch=8, concurrency=16, latency=0.2, train_size=16, val_size=8)],
            Spec("resume", batch=8, concurrency=4, latency=0.05, train_size=16, val_size=8),
            2,
            Spec("soak", batch=8, concurrency=4, latency=0.05, train_size=16, val_size=8, fault_rate=0.2),
            100,
        )
    headline = Spec("headline", batch=40, concurrency=16, latency=0.5, epochs=2, train_size=80)
    # Latency-0 runs (overhead per task) only in the concurrency-16 column, to keep the full run near 15
    # minutes.
    grid = [Spec(f"b{b}-c{c}", batch=b, concurrency=c, latency=0.5, train_size=2 * b, zero_latency=c == 16)
            for b in (8, 40, 200) for c in (4, 16, 64)]
    return Plan(
        mode,
        headline,
        grid,
        Spec("resume", batch=8, concurrency=8, latency=0.05, train_size=16, val_size=8),
        10,
        Spec("soak", batch=8, concurrency=8, latency=0.1, train_size=24, epochs=2, fault_rate=0.2),
        400,
    )


def run_plan(
    plan: Plan, workdir: Path, *, seed: int, api: str | None = None, log: Any = print
) -> dict[str, Any]:
    """Run every measurement of ``plan``; against ``api`` if given, else a Prefect server started here.

    A section that fails is recorded as ``{"error": ...}`` (listed under ``errors``) and the others still run.
    """
    results: dict[str, Any] = {
        "mode": plan.mode,
        "started": datetime.now().astimezone().isoformat(),
        "load_before": _loadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "errors": [],
    }

    def section(name: str, job: Any) -> Any:
        try:
            return job()
        except Exception as error:  # noqa: BLE001 - recorded and reported; the other sections still run
            log(f"{name} failed: {str(error)[:3000]}")
            results["errors"].append(name)
            return {"error": str(error)[:3000]}

    with contextlib.ExitStack() as stack:
        api = api or stack.enter_context(prefect_server(workdir / "prefect"))
        world = stack.enter_context(LatencyWorld(seed=seed))
        log(f"prefect server {api}; latency world {world.base_url}")
        if plan.warm_up:
            # A first run on a new server pays one-off costs (flow and task registration, a cold database):
            # keep them out of the measurements.
            warm = Spec("warm-up", batch=4, concurrency=4, latency=0.0, val_size=4)
            section("warm-up", lambda: launch(warm, world=world, api=api, cwd=workdir / "warm-up"))
        results["library_call_ms"] = section("library", lambda: library_call_ms(world, api, workdir))
        head = plan.headline
        log(f"headline: batch {head.batch}, concurrency {head.concurrency}, latency {head.latency:g} s")
        results["headline"] = section(
            "headline", lambda: measure(head, world=world, api=api, workdir=workdir)
        )
        if "summary" in results["headline"] and isinstance(results["library_call_ms"], float):
            summary = results["headline"]["summary"]
            summary.update(prefect_estimate(summary, summary["calls_per_step"], results["library_call_ms"]))
        results["grid"] = []
        for spec in plan.grid:
            log(f"grid: batch {spec.batch}, concurrency {spec.concurrency}")
            row = section(f"grid {spec.label}", lambda spec=spec: measure(spec, world=world, api=api,
                                                                          workdir=workdir))
            if "summary" in row and isinstance(results["library_call_ms"], float):
                row["summary"].update(prefect_estimate(row["summary"], row["summary"]["calls_per_step"],
                                                       results["library_call_ms"]))
            results["grid"].append(
                row.get("summary", {"batch": spec.batch, "concurrency": spec.concurrency, **row})
            )
        log(f"resume: {plan.resume_trials} kill -9 trials")
        results["resume"] = section("resume", lambda: resume_trials(
            plan.resume, world=world, api=api, workdir=workdir, trials=plan.resume_trials, seed=seed))
        log(f"fault soak at {plan.soak.fault_rate:.0%}")
        results["soak"] = section("soak", lambda: fault_soak(plan.soak, world=world, api=api, workdir=workdir,
                                                             seed=seed))
    if plan.ingest_tasks:
        log(f"ingest: {plan.ingest_tasks} task runs on SQLite" + (" and PostgreSQL" if plan.postgres else ""))
        results["ingest"] = section("ingest", lambda: ingest_both(workdir, plan.ingest_tasks) if plan.postgres
                                    else {"sqlite": _sqlite_only(workdir, plan.ingest_tasks)})
    results["load_after"] = _loadavg()
    results["finished"] = datetime.now().astimezone().isoformat()
    return results


def _sqlite_only(workdir: Path, n: int) -> dict[str, Any]:
    with prefect_server(workdir / "ingest-sqlite") as api:
        return ingest_rate(api, workdir / "ingest-sqlite", n)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}{suffix}"
    return f"{value}{suffix}"


def _error_line(what: str, section: Any) -> str | None:
    if isinstance(section, dict) and "error" in section:
        return f"| {what} | failed: {section['error'].splitlines()[0][:200]} | |"
    return None


def table(results: dict[str, Any]) -> str:
    """The short markdown table of a run's results."""
    lines = [
        f"mode {results['mode']}, {results['cpus']} CPUs, load average before {results['load_before']}, "
        f"after {results.get('load_after')}",
        "",
        "| measure | value | target |",
        "|---|---|---|",
    ]
    headline = results.get("headline") or {}
    failed = _error_line("headline run", headline)
    if failed:
        lines.append(failed)
    else:
        head = headline["summary"]
        share = None if head["non_model_share"] is None else 100 * head["non_model_share"]
        lines += [
            f"| actual / bound, steps {head['steps_averaged']} (batch {head['batch']}, concurrency "
            f"{head['concurrency']}, latency {head['latency_s']:g} s) | {_fmt(head['ratio'])} (step "
            f"{_fmt(head['step_wall_s'], ' s')} vs bound {_fmt(head['bound_s'], ' s')}) | <= 1.25 |",
            "| actual / bound, first step of the run (starts the epoch subflow) | "
            f"{_fmt(head['first_step_ratio'])} ({_fmt(head['first_step_s'], ' s')}) | |",
            "| Prefect overhead per task (latency 0, upper bound) | "
            f"{_fmt(head['overhead_per_task_ms'], ' ms')} | < 50 ms |",
            f"| non-model share of step wall time (upper bound of Prefect's share) | {_fmt(share, ' %')} | < "
            "10 % |",
            f"| Prefect alone, estimate (latency-0 step minus {_fmt(head.get('calls_per_step'))} calls x "
            f"{_fmt(head.get('library_call_ms'), ' ms')} without Prefect) | "
            f"{_fmt(head.get('prefect_ms_per_task'), ' ms')} per task, "
            f"{_fmt(None if head.get('prefect_share') is None else 100 * head['prefect_share'], ' %')} of "
            "the step | < 50 ms, < 10 % |",
            f"| task runs per step | {_fmt(head['task_runs_per_step'])} | |",
            f"| peak memory of the training process | {_fmt(head['peak_rss_mb'], ' MB')} | |",
        ]
    ingest = results.get("ingest") or {}
    lines.append(_error_line("server ingest", ingest) or "")
    for name in ("sqlite", "sqlite_deferred", "postgresql"):
        row = ingest.get(name) if isinstance(ingest, dict) else None
        if row:
            value = (
                row["error"].splitlines()[0][:200]
                if "error" in row
                else f"{row['task_runs_per_s']} task runs/s ({row['tasks']} tasks stored in "
                     f"{row['until_stored_s']} s)"
            )
            lines.append(f"| server ingest, {name} | {value} | |")
    resume = results.get("resume") or {}
    lines.append(_error_line("resume", resume) or (
        f"| resume: completed calls repeated over {len(resume['trials'])} kill -9 trials | "
        f"{resume['repeated_total']} (all resumed to the reference skill: {resume['all_resumed']}) | 0 |"))
    soak = results.get("soak") or {}
    if _error_line("fault soak", soak):
        lines.append(_error_line("fault soak", soak) or "")
    else:
        verdict = soak["verdict"]
        lines.append(
            f"| fault soak at {soak['spec']['fault_rate']:.0%} | completed {verdict['completed']}, same "
            f"skill {verdict['same_best_skill']}, same scores {verdict['same_scores']}, lost results "
            f"{verdict['lost_results']}; {verdict['faults_injected']} faults + {verdict['garbled_replies']} "
            f"garbled replies -> {verdict['retries']} retries, {verdict['reasks']} re-asks, "
            f"{verdict['fallbacks']} fallbacks | same skill, 0 lost |")
    lines = [line for line in lines if line]
    if results.get("grid"):
        lines += ["", "| batch | concurrency | step s | bound s | ratio | task runs/step | latency-0 step s "
                      "| overhead/task ms | non-model share | Prefect ms/task (est.) | Prefect share (est.) "
                      "|",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in results["grid"]:
            if "error" in row:
                lines.append(f"| {row['batch']} | {row['concurrency']} | failed: "
                             f"{row['error'].splitlines()[0][:120]} | | | | | | | | |")
                continue
            lines.append(f"| {row['batch']} | {row['concurrency']} | {_fmt(row['step_wall_s'])} | "
                         f"{_fmt(row['bound_s'])} | {_fmt(row['ratio'])} | {_fmt(row['task_runs_per_step'])} "
                         f"| {_fmt(row['zero_latency_step_s'])} | {_fmt(row['overhead_per_task_ms'])} | "
                         f"{_fmt(row['non_model_share'])} | {_fmt(row.get('prefect_ms_per_task'))} | "
                         f"{_fmt(row.get('prefect_share'))} |")
    if results.get("errors"):
        lines += ["", f"failed sections: {', '.join(results['errors'])}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="skillopt performance and fault-tolerance benchmarks")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, no ingest (the CI smoke test)")
    parser.add_argument("--out", type=Path, help="results JSON (default bench/results/<mode>.json)")
    parser.add_argument("--workdir", type=Path, help="keep run folders here (default: a temporary folder)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--api", help="use this running Prefect API instead of starting a server")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = args.out or BENCH / "results" / f"{mode}.json"

    def log(message: str) -> None:
        print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="skillopt-bench-"))
        )
        workdir.mkdir(parents=True, exist_ok=True)
        results = run_plan(plan_for(mode), workdir.resolve(), seed=args.seed, api=args.api, log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(results))
    print(f"\nresults: {out}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
