"""What a user feels: ``skillopt train`` from process start to exit, against the latency world.

Every row runs the real command (``python -m skillopt.shell.cli train demo``) in a subprocess with target and
optimizer on the ``openai_compatible`` backend pointed at ``bench/latency_world.py``, exactly as a user runs
it: no ``PREFECT_API_URL``, so the run finds the local server of ``skillopt server start`` in the bench's own
``PREFECT_HOME`` (rows "with server") or starts Prefect's temporary server (rows "without server", a
``PREFECT_HOME`` whose database already exists, as on a user's second run).

Per run (times from the world's clock, in seconds after the process started):

- **first call**: the first request reaching the world; **last call**: the last reply leaving it;
  **exit**: the process has ended; **exit after last call** = exit - last call;
- **model phase** = last call - first call, against its **critical path**: the sum over the run's
  dependent rounds of ``ceil(calls in the round / workers) x latency`` (rounds in order of the algorithm:
  baseline, then per step rollout, analysts, each merge level, ranking, gate; the epoch boundary's slow
  update and meta skill; the final check and the test evaluations); ratio = model phase / critical path;
- **end to end** = exit, against critical path + 3 s;
- **CPU** (rows with a running local server): the processor time the run's own process used (the preloaded
  process's forked child, or the command itself) and the time the Prefect server used from the run's start
  until ``CPU_SETTLE_S`` after its exit (the server still records the run's last events then); read from
  ``/proc``, so on Linux only.

``--compare 'CMD'`` runs any second command against the same world in the same bench run, interleaved with
skillopt's runs, and reports the ratio of the wall times (``{url}`` in CMD is replaced by the world's base
URL, which is also in ``LATENCY_WORLD_URL``). Kill trials (``--kill-trials N``) kill the run at a seeded
random moment *without holding replies back* (replies keep flowing until the kill), run the same command
again, and count the calls answered before the kill and requested again after it.

    python bench/e2e.py                      # the rows of bench/README.md (~5 minutes on 2 cores)
    python bench/e2e.py --repeat 1 --compare 'python my_optimizer.py --base-url {url}'
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.latency_world import LatencyWorld  # noqa: E402
from bench.run import initial_skill_sha, made_ahead, read_jsonl, train_overrides  # noqa: E402

#: The end-to-end target: wall time at most the critical path plus this.
E2E_SLACK_S = 3.0


@dataclass(frozen=True)
class Config:
    """One ``skillopt train demo`` configuration against the world."""

    label: str
    batch: int
    workers: int
    latency: float
    train: int
    val: int
    test: int
    epochs: int = 1
    seed: int = 42

    def overrides(self, url: str) -> list[str]:
        return train_overrides(url, workers=self.workers, batch=self.batch, train_size=self.train,
                               val_size=self.val, epochs=self.epochs, seed=self.seed,
                               eval_test=bool(self.test)) + [f"benchmark.test_size={self.test}"]


TINY = Config("tiny", batch=8, workers=8, latency=0.2, train=16, val=8, test=8)
BATCH10 = Config("batch10", batch=10, workers=10, latency=0.2, train=20, val=10, test=0)
BATCH40 = Config("batch40", batch=40, workers=16, latency=0.5, train=80, val=12, test=0)


@dataclass
class Timeline:
    label: str
    returncode: int
    first_call_s: float | None
    last_call_s: float | None
    exit_s: float
    calls: int
    critical_path_s: float | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    killed_at_s: float | None = None
    killed_at_wall: float | None = None
    run_cpu_s: float | None = None
    server_cpu_s: float | None = None

    @property
    def model_phase_s(self) -> float | None:
        if self.first_call_s is None or self.last_call_s is None:
            return None
        return self.last_call_s - self.first_call_s

    def row(self) -> dict[str, Any]:
        phase, path = self.model_phase_s, self.critical_path_s
        return {
            "label": self.label,
            "returncode": self.returncode,
            "calls": self.calls,
            "first_call_s": _r(self.first_call_s),
            "last_call_s": _r(self.last_call_s),
            "exit_s": _r(self.exit_s),
            "exit_after_last_call_s": _r(self.exit_s - self.last_call_s) if self.last_call_s else None,
            "model_phase_s": _r(phase),
            "critical_path_s": _r(path),
            "phase_ratio": _r(phase / path) if phase and path else None,
            "e2e_minus_critical_path_s": _r(self.exit_s - path) if path else None,
            "run_cpu_s": _r(self.run_cpu_s),
            "server_cpu_s": _r(self.server_cpu_s),
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# --------------------------------------------------------------------------------------------
# Running a command against the world


def skillopt_env(home: Path, *, temporary_server: bool = False) -> dict[str, str]:
    """A user's environment: no PREFECT_API_URL, the bench's own PREFECT_HOME; with ``temporary_server``
    each run starts Prefect's throwaway server (``SKILLOPT_PREFECT_SERVER=temporary``, as ``--ephemeral``)
    instead of the background server a run with no server starts and leaves up."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "SKILLOPT_PREFECT_SERVER")}
    if temporary_server:
        env["SKILLOPT_PREFECT_SERVER"] = "temporary"
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        # no empty entry: it would put each process's working directory on its path
        PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p),
    )
    return env


def train_argv(config: Config, world: LatencyWorld, run_name: str) -> list[str]:
    argv = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", run_name]
    for item in config.overrides(world.base_url):
        argv += ["-o", item]
    return argv


def timed(label: str, argv: list[str], *, world: LatencyWorld, latency: float, env: dict[str, str], cwd: Path,
          kill_after_answers: int | None = None, kill_delay_s: float = 0.0) -> Timeline:
    """Run ``argv`` against a reset world and read its timeline; optionally SIGKILL its process group once the
    world has answered ``kill_after_answers`` calls, ``kill_delay_s`` later (replies keep flowing
    meanwhile)."""
    world.reset(latency_s=latency)
    cwd.mkdir(parents=True, exist_ok=True)
    log = cwd / f"{label}-{int(time.time() * 1000)}.log"
    started = time.time()
    killed_at = None
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        if kill_after_answers is not None:
            while (
                process.poll() is None
                and sum(e.outcome == "answer" for e in world.events()) < kill_after_answers
            ):
                time.sleep(0.002)
            time.sleep(kill_delay_s)
            if process.poll() is None:
                killed_at = time.time()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        returncode = process.wait()
    ended = time.time()
    events = world.events()
    first = min((e.at for e in events), default=None)
    last = max((e.sent_at for e in events if e.outcome == "answer"), default=None)
    return Timeline(label, returncode, None if first is None else first - started,
                    None if last is None else last - started, ended - started,
                    calls=sum(e.outcome == "answer" for e in events),
                    killed_at_s=None if killed_at is None else killed_at - started, killed_at_wall=killed_at)


#: How long after a run's exit the server's processor time still counts as the run's.
CPU_SETTLE_S = 1.0


def cpu_seconds(pid: int, *, children: bool = False) -> float | None:
    """User plus system time of process ``pid`` (or of its children it has waited for), from ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    first = 13 if children else 11  # cutime, cstime / utime, stime (fields 16-17 / 14-15 of proc(5))
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The processor time of a run: its own process (the command, or the preloaded process's forked child
    that runs it) and the local server of ``home``; None where there is no running server."""

    def __init__(self, home: Path) -> None:
        from skillopt.shell import local_server, preload

        server = local_server.running(home)
        self.server = server.pid if server else None
        self.preload = preload.recorded_process(home)

    def read(self) -> tuple[float, float] | None:
        if self.server is None:
            return None
        server = cpu_seconds(self.server)
        if server is None:
            return None
        own = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = own.ru_utime + own.ru_stime
        forked = cpu_seconds(self.preload, children=True) if self.preload else None
        return run + (forked or 0.0), server

    def since(self, before: tuple[float, float] | None) -> tuple[float | None, float | None]:
        """(run, server) processor seconds since ``before``, after waiting ``CPU_SETTLE_S``."""
        if before is None:
            return None, None
        time.sleep(CPU_SETTLE_S)
        after = self.read()
        if after is None:
            return None, None
        return after[0] - before[0], after[1] - before[1]


# --------------------------------------------------------------------------------------------
# The critical path of a finished run


def rounds_of(run_dir: Path) -> list[tuple[str, int]]:
    """The run's dependent rounds in order, each with its number of calls, from ``usage.jsonl``.

    A round is a set of calls that could all be in flight at once: the calls of one stage of one step (a
    merge per level), of the baseline, of the epoch boundary's stages, of the final check and of the test
    evaluations. Steps are told apart by the skill snapshots' times; cache hits cost no round. Step 1's calls
    made ahead of the flow (its optimizer calls, and its candidate's rollouts: a skill other than the initial
    one) come before the baseline's snapshot and still belong to step 1, as do its first batch's rollouts
    (training rollouts), which start with the baseline's and may be answered on either side of its snapshot.
    """
    usage = [
        r for r in read_jsonl(run_dir / "usage.jsonl") if not r.get("cache_hit") and r.get("status") == "ok"
    ]
    snapshots = sorted((run_dir / "skills").glob("step_*.md"))
    ends = [p.stat().st_mtime for p in snapshots]
    rounds: Counter[tuple[int, int, str]] = Counter()
    initial = initial_skill_sha(usage)
    order = {"rollout": 0, "analyst": 1, "merge": 2, "ranking": 3, "lr": 3, "rewrite": 3, "deep_probe": 1,
             "gate": 4, "slow_update": 5, "meta_skill": 6, "final": 7, "test": 8}
    for record in usage:
        at = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
        # 0 = baseline, k = step k, len(ends) = after the last step
        window = sum(1 for end in ends if end < at)
        stage, tags = record["stage"], record.get("tags") or {}
        if window == 0 and len(ends) > 1 and (made_ahead(record, initial) or tags.get("training")):
            window = 1  # step 1: ahead of the flow, or its first batch
        if stage == "rollout":
            stage = "rollout" if tags.get("training") else ("gate" if 0 < window < len(ends) else "eval")
        level = int(tags.get("level") or 0) if stage == "merge" else 0
        rounds[(window, order.get(stage, 9) * 100 + level, stage)] += 1
    return [(f"{'baseline' if w == 0 else 'final' if w >= len(ends) else f'step {w}'} {stage}", n)
            for (w, _, stage), n in sorted(rounds.items())]


def critical_path(rounds: list[tuple[str, int]], workers: int, latency: float) -> float:
    return sum(math.ceil(n / workers) * latency for _, n in rounds)


def with_path(timeline: Timeline, run_dir: Path, config: Config) -> Timeline:
    rounds = rounds_of(run_dir)
    timeline.rounds = [{"round": name, "calls": n} for name, n in rounds]
    timeline.critical_path_s = critical_path(rounds, config.workers, config.latency)
    return timeline


# --------------------------------------------------------------------------------------------
# Sections


def local_server(home: Path) -> Any:
    """``skillopt server start`` in ``home``; returns a callable that stops it."""
    env = skillopt_env(home)
    started = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "server", "start"], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    if started.returncode != 0:
        raise RuntimeError(f"skillopt server start failed:\n{started.stdout}\n{started.stderr}")

    def stop() -> None:
        subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "server", "stop"], env=env,
                       capture_output=True,
                       timeout=120, check=False)
    return stop


def end_to_end(config: Config, world: LatencyWorld, workdir: Path, *, home: Path, label: str, repeat: int,
               compare: str | None = None, temporary_server: bool = False) -> dict[str, Any]:
    """``repeat`` runs of ``config`` (a fresh run folder each, so no call is cached), interleaved with
    ``compare`` when given; the median of each figure."""
    env = skillopt_env(home, temporary_server=temporary_server)
    meter = CpuMeter(home)
    ours, theirs = [], []
    for index in range(repeat):
        cwd = workdir / f"{label}-{index}"
        before = meter.read()
        timeline = timed(
            label, train_argv(config, world, "e2e"), world=world, latency=config.latency, env=env, cwd=cwd
        )
        timeline.run_cpu_s, timeline.server_cpu_s = meter.since(before)
        if timeline.returncode != 0:
            raise RuntimeError(f"{label}: skillopt exited {timeline.returncode}; see {cwd}")
        ours.append(with_path(timeline, cwd / "runs" / "e2e", config).row())
        if compare:
            command = compare.replace("{url}", world.base_url)
            other_env = {**os.environ, "LATENCY_WORLD_URL": world.base_url}
            theirs.append(timed(f"compare-{label}", shlex.split(command), world=world, latency=config.latency,
                                env=other_env, cwd=workdir / f"compare-{label}-{index}").row())
    result: dict[str, Any] = {"config": asdict(config), "runs": ours, "median": _median(ours)}
    if ours and ours[0].get("critical_path_s"):
        result["rounds"] = with_path(
            Timeline(label, 0, None, None, 0.0, 0), workdir / f"{label}-0" / "runs" / "e2e", config
        ).rounds
    if compare:
        result["compare"] = {
            "command": compare,
            "runs": theirs,
            "median": _median(theirs),
            "wall_ratio_skillopt_over_other": _r(_median(ours)["exit_s"] / _median(theirs)["exit_s"])
            if _median(theirs).get("exit_s")
            else None,
        }
    return result


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [
        k for k in (rows[0] if rows else {}) if isinstance(rows[0][k], (int, float)) and k != "returncode"
    ]
    return {k: _r(statistics.median(r[k] for r in rows if r[k] is not None))
            for k in keys if any(r[k] is not None for r in rows)}


def kill_trials(config: Config, world: LatencyWorld, workdir: Path, *, home: Path, trials: int, seed: int
                ) -> dict[str, Any]:
    """Kill -9 at seeded random moments without holding replies, re-run in the same folder, count repeats.

    A repeated call is a request body the world answered before the kill and was asked again after the
    restart. Of those, "in flight" ones had their reply leave the world less than ``IN_FLIGHT_S`` before the
    kill (the client may not have read it yet); the others are completed calls paid twice.
    """
    env = skillopt_env(home)

    def train(label: str, cwd: Path, kill_after_answers: int | None = None, kill_delay_s: float = 0.0
              ) -> Timeline:
        """One ``skillopt train`` of the "kill" run in ``cwd``, killed as :func:`timed` says."""
        return timed(label, train_argv(config, world, "kill"), world=world, latency=config.latency, env=env,
                     cwd=cwd, kill_after_answers=kill_after_answers, kill_delay_s=kill_delay_s)

    reference_dir = workdir / "kill-reference"
    reference = train("kill-reference", reference_dir)
    if reference.returncode != 0:
        raise RuntimeError(f"reference run exited {reference.returncode}; see {reference_dir}")
    total = reference.calls
    rng = random.Random(seed)
    rows = []
    for trial in range(trials):
        cwd = workdir / f"kill-{trial}"
        after = rng.randint(1, max(1, total - 1))
        delay = rng.uniform(0, config.latency)
        killed = train(f"kill-{trial}", cwd, kill_after_answers=after, kill_delay_s=delay)
        answered = {e.key: e for e in world.events() if e.outcome == "answer"}
        killed_wall = killed.killed_at_wall
        resumed = train(f"resume-{trial}", cwd)
        asked_again = {e.key for e in world.events()}
        repeated = [answered[key] for key in answered if key in asked_again]
        in_flight = [e for e in repeated if killed_wall is not None and killed_wall - e.sent_at < IN_FLIGHT_S]
        rows.append(
            {
                "trial": trial,
                "kill_after_answers": after,
                "kill_delay_s": round(delay, 3),
                "killed": killed.killed_at_s is not None,
                "answered_before_kill": len(answered),
                "resumed_returncode": resumed.returncode,
                "calls_after_restart": resumed.calls,
                "repeated": len(repeated),
                "repeated_in_flight": len(in_flight),
                "repeated_completed": len(repeated) - len(in_flight),
                "unsaved_window_s": _r(max((killed_wall - e.sent_at for e in repeated), default=0.0))
                if killed_wall
                else None,
                "killed_at_s": _r(killed.killed_at_s),
            }
        )
    return {"config": asdict(config), "reference_calls": total, "trials": rows,
            "repeated_completed_total": sum(r["repeated_completed"] for r in rows),
            "repeated_in_flight_total": sum(r["repeated_in_flight"] for r in rows),
            "all_resumed": all(r["resumed_returncode"] == 0 for r in rows)}


#: A reply that left the world less than this before the kill counts as in flight (loopback delivery and the
#: client's parsing take milliseconds; 50 ms is generous).
IN_FLIGHT_S = 0.05


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="skillopt end to end: start, first call, last call, exit")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (medians are reported)")
    parser.add_argument("--compare", metavar="CMD", help="a second command run against the same world, "
                        "interleaved with the tiny row; {url} is the world's base URL")
    parser.add_argument("--kill-trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--only", choices=["tiny", "phase", "kill"], action="append",
                        help="run only these sections (repeatable)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "e2e.json")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    sections = set(args.only or ["tiny", "phase", "kill"])

    def log(message: str) -> None:
        print(f"[{datetime.now():%H:%M:%S}] {message}", flush=True)

    results: dict[str, Any] = {"started": datetime.now().astimezone().isoformat(), "cpus": os.cpu_count(),
                               "load_before": list(os.getloadavg())}
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="skillopt-e2e-"))
        )
        workdir = workdir.resolve()
        world = stack.enter_context(LatencyWorld(seed=args.seed))
        served, bare = workdir / "home-with-server", workdir / "home-without-server"
        log("skillopt server start (the rows 'with server')")
        stack.callback(local_server(served))
        log("warm-up runs (a first run on a new database creates it: keep that out of the figures)")
        for home in (served, bare):
            timed(
                "warm-up",
                train_argv(replace_config(TINY, test=0, val=4, train=8), world, "warm"),
                world=world,
                latency=0.0,
                env=skillopt_env(home, temporary_server=home == bare),
                cwd=workdir / f"warm-{home.name}",
            )
        if "tiny" in sections:
            log(
                f"tiny end to end, with server, {args.repeat} runs"
                + (" interleaved with --compare" if args.compare else "")
            )
            results["tiny_with_server"] = end_to_end(TINY, world, workdir, home=served, label="tiny-served",
                                                     repeat=args.repeat, compare=args.compare)
            log("tiny end to end, without server (temporary server)")
            results["tiny_without_server"] = end_to_end(TINY, world, workdir, home=bare, label="tiny-bare",
                                                        repeat=args.repeat, temporary_server=True)
        if "phase" in sections:
            for config in (BATCH10, BATCH40):
                log(f"model phase: batch {config.batch}, {config.workers} workers, {config.latency} s")
                results[config.label] = end_to_end(config, world, workdir, home=served, label=config.label,
                                                   repeat=args.repeat)
        if "kill" in sections and args.kill_trials:
            log(f"{args.kill_trials} kill -9 trials without held replies")
            results["kill"] = kill_trials(replace_config(TINY, latency=0.1), world, workdir, home=served,
                                          trials=args.kill_trials, seed=args.seed)
    results["load_after"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(results))
    print(f"\nresults: {args.out}")
    return 0


def replace_config(config: Config, **changes: Any) -> Config:
    from dataclasses import replace

    return replace(config, **changes)


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['cpus']} CPUs, load average before {[round(x, 2) for x in results['load_before']]}, "
        f"after {[round(x, 2) for x in results.get('load_after', [])]}",
        "",
        "| row | first call s | last call s | exit s | exit after last call s | model phase s | "
        "critical path s | phase / path | exit - path s | calls | run CPU s | server CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in ("tiny_with_server", "tiny_without_server", "batch10", "batch40"):
        section = results.get(key)
        if not section:
            continue
        m = section["median"]
        lines.append(f"| {key} | {m.get('first_call_s')} | {m.get('last_call_s')} | {m.get('exit_s')} | "
                     f"{m.get('exit_after_last_call_s')} | {m.get('model_phase_s')} | "
                     f"{m.get('critical_path_s')} | {m.get('phase_ratio')} | "
                     f"{m.get('e2e_minus_critical_path_s')} | {m.get('calls')} | {m.get('run_cpu_s')} | "
                     f"{m.get('server_cpu_s')} |")
        compare = section.get("compare")
        if compare:
            c = compare["median"]
            lines.append(f"| compare: `{compare['command']}` | {c.get('first_call_s')} | "
                         f"{c.get('last_call_s')} | {c.get('exit_s')} | {c.get('exit_after_last_call_s')} | "
                         f"{c.get('model_phase_s')} | | | | {c.get('calls')} | | |")
            lines.append(f"| wall ratio skillopt / compared | {compare['wall_ratio_skillopt_over_other']} | "
                         "| | | | | | | | | |")
    kill = results.get("kill")
    if kill:
        lines += ["", f"kill -9 trials without held replies: {len(kill['trials'])}; completed calls repeated "
                      f"{kill['repeated_completed_total']}, in-flight replies repeated "
                      f"{kill['repeated_in_flight_total']}, all resumed {kill['all_resumed']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
