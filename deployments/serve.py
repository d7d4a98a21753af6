"""Serve one ``skill-train`` deployment per benchmark, with its data and model choices as default parameters.

Each deployment is named ``skill-train/<benchmark>``, runs ``mode: nightly`` by default (warm start
from the promoted skill, promote only what beats it), has a nightly cron schedule (default
``0 3 * * *`` UTC) and a deployment concurrency limit of 1: a run triggered while another run of the
same benchmark is still going waits in line instead of training beside it. Runs execute in child
processes of the serving process, in its working directory, so ``runs/``, the cache and the skill
registry land there. ``skillopt serve`` runs this; ``python -m skillopt.deployments.serve`` does the same.

What ``skillopt serve`` was given (``--data``, ``--backend``/``--model``, ``-c``, ``-o``) becomes the
deployments' default parameters, so ``prefect deployment run skill-train/babyvision`` trains on that
data with those models as typed, and the UI's Run form shows each value to change. Every benchmark
is checked before anything is registered (config, data, the plug-in's preflight): a named one that
fails stops ``serve`` with the reason; with no names, the benchmarks that fail are skipped and listed.

    prefect deployment run skill-train/demo --param mode=train --param epochs=1
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from skillopt import __version__
from skillopt.benchmarks.base import ENTRY_POINT_GROUP
from skillopt.core.errors import ConfigError, SkillOptError

DEFAULT_CRON = "0 3 * * *"
DEFAULT_TIMEZONE = "UTC"
#: At most one run per benchmark at a time; later ones wait (Prefect's ENQUEUE collision strategy).
CONCURRENCY_PER_BENCHMARK = 1
#: What the description of a deployment says about its default mode.
NIGHTLY_NOTE = {"nightly": ": warm start from the promoted skill, promote the new best only if it beats "
                           "it on the selection split"}
#: Seconds Prefect's graceful stop may take before ``serve`` kills the runs in progress and exits.
STOP_GRACE_S = 10.0
#: Exit status of a forced stop.
EXIT_FORCED = 1


@dataclass(frozen=True)
class RunDefaults:
    """What every served deployment's runs get unless the trigger (UI form, ``--param``) changes it."""

    mode: str = "nightly"
    #: ``--data``: a split folder or data file, stored as an absolute path.
    data: str | None = None
    config_file: str | None = None
    overrides: tuple[str, ...] = ()
    #: ``--backend``/``--model`` and the per-role options, only the ones given (``CliRoleOptions`` fields).
    cli_roles: Mapping[str, Any] | None = None
    #: ``--skill``: the skill folder or markdown file to start from, stored as an absolute path.
    skill: str | None = None

    def input_parameters(self) -> dict[str, Any]:
        """The data, config file and overrides given to ``serve``, as every deployment takes them."""
        parameters: dict[str, Any] = {}
        if self.data:
            parameters["data"] = self.data
        if self.config_file:
            parameters["config_file"] = self.config_file
        if self.overrides:
            parameters["overrides"] = list(self.overrides)
        return parameters

    def parameters(self, benchmark: str) -> dict[str, Any]:
        """The deployment's default parameters: only what was given, so the UI form shows the rest empty."""
        parameters: dict[str, Any] = {"benchmark": benchmark, "mode": self.mode, **self.input_parameters()}
        roles = dict(self.cli_roles or {})
        # The role choices as the form's named fields (backend, target_model, ...); what has no field of its
        # own (reasoning effort) stays in cli_roles.
        for kind in ("backend", "model"):
            if roles.get(kind):
                parameters[kind] = roles.pop(kind)
            for role, value in (roles.pop(f"role_{kind}", None) or {}).items():
                parameters[f"{role}_{kind}"] = value
        roles = {key: value for key, value in roles.items() if value}
        if roles:
            parameters["cli_roles"] = roles
        if self.skill:
            parameters["skill"] = self.skill
        return parameters


@dataclass(frozen=True)
class Skipped:
    """A registered benchmark that ``serve`` with no names left out, and why (its first error line)."""

    benchmark: str
    reason: str


def registered_benchmarks() -> list[str]:
    """The benchmark plug-ins installed under the ``skillopt.benchmarks`` entry point group, sorted."""
    return sorted({entry.name for entry in entry_points(group=ENTRY_POINT_GROUP)})


def run_defaults(*, mode: str = "nightly", data: str | None = None, config_file: str | None = None,
                 overrides: Sequence[str] = (), cli_roles: Mapping[str, Any] | None = None,
                 skill: str | None = None) -> RunDefaults:
    """``RunDefaults`` from command-line values: paths made absolute (a person reading the UI form cannot
    know the serving process's working directory), empty role options dropped."""
    roles = {key: value for key, value in (cli_roles or {}).items() if value}
    return RunDefaults(mode=mode, data=str(Path(data).absolute()) if data else None,
                       config_file=str(Path(config_file).absolute()) if config_file else None,
                       overrides=tuple(overrides), cli_roles=roles or None,
                       skill=str(Path(skill).absolute()) if skill else None)


def check_benchmark(benchmark: str, defaults: RunDefaults, env: Mapping[str, str]) -> None:
    """Raise the ``SkillOptError`` a run of ``benchmark`` with ``defaults`` would stop on before its first
    model call: the config, the data (``--data`` resolved as training does), the plug-in's preflight."""
    from skillopt.benchmarks.resolve import resolve_benchmark
    from skillopt.core.config import load_config
    from skillopt.core.data import SplitSpec, data_overrides
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.roles import CliRoleOptions

    skill = [f"train.skill_init={defaults.skill}"] if defaults.skill else []
    loaded = load_config(benchmark, config_file=defaults.config_file,
                         overrides=[*data_overrides(defaults.data), *skill, *defaults.overrides], env=env)
    if defaults.skill:  # a bad skill folder: one line now, not at 3 a.m.
        from skillopt.benchmarks.base import load_benchmark
        from skillopt.benchmarks.resolve import initial_skill

        plugin = load_benchmark(benchmark)
        initial_skill(loaded.config, plugin.prompts_dir, plugin.id)
    roles = CliRoleOptions(**(defaults.cli_roles or {}))
    plugin, bench_cfg, _ = resolve_benchmark(loaded, cli=roles, env=env, registry=BackendRegistry.default(),
                                             command=f"skillopt serve {benchmark}")
    _check_data_source(benchmark, SplitSpec.from_benchmark_config(bench_cfg,
                                                                  default_split_mode=plugin.default_split_mode))


def settle_abandoned_runs(benchmarks: Sequence[str], defaults: RunDefaults) -> list[str]:
    """Set *Crashed* the served benchmarks' flow runs left unfinished by a process that is gone (their run
    directories, under each benchmark's ``run.runs_dir``, are not locked), so a deployment's slot held by
    such a run comes back; one line per run settled. Best effort: a server that cannot be asked is left
    as it is (with a line saying so)."""
    from skillopt.core.config import load_config
    from skillopt.core.data import data_overrides
    from skillopt.tasks.stale_runs import settle_abandoned_flow_runs

    runs_dirs: set[Path] = set()
    for benchmark in benchmarks:
        loaded = load_config(benchmark, config_file=defaults.config_file,
                             overrides=[*data_overrides(defaults.data), *defaults.overrides])
        runs_dirs.add(Path(loaded.config.run.runs_dir).absolute())
    try:
        return settle_abandoned_flow_runs(sorted(runs_dirs))
    except Exception as error:  # noqa: BLE001 - serving goes on either way
        return [f"note: could not check for runs left unfinished by a stopped process: {error}"]


def memory_leases_note() -> str | None:
    """A note when the Prefect server keeps concurrency leases in memory (Prefect's default; skillopt's own
    servers keep them on disk): a restart of that server would leave a run in progress holding its
    deployment's slot. None otherwise, or when the server does not say (Prefect Cloud, an older server)."""
    from prefect.client.orchestration import get_client

    from skillopt.shell.prefect_server import LEASE_STORAGE

    try:
        with get_client(sync_client=True) as client:
            response = client.request("GET", "/admin/settings")
            response.raise_for_status()
            storage = response.json()["server"]["concurrency"]["lease_storage"]
    except Exception:  # noqa: BLE001 - only a note
        return None
    if not str(storage).endswith(".memory"):
        return None
    return ("note: this Prefect server keeps concurrency leases in memory: if it restarts while a run is in "
            "progress, that run is stopped at its next lease renewal or, if its process is gone too, keeps "
            "its deployment's slot until `skillopt serve` starts again here. Start the server with "
            f"PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE={LEASE_STORAGE} (skillopt's servers do)")


def _check_data_source(benchmark: str, spec: Any) -> None:
    """The configured data exists (a plug-in's preflight need not check it): the ``data_path`` of ratio mode,
    the ``train/ val/ test/`` folders of split_dir mode; generated data always does."""
    from skillopt.core.data import SPLIT_NAMES
    from skillopt.core.errors import DataError

    if spec.split_mode == "ratio" and not (spec.data_path and Path(spec.data_path).exists()):
        where = f" at {spec.data_path}" if spec.data_path else ""
        raise DataError(f"{benchmark}: no data{where}: pass --data FILE or set benchmark.data_path")
    if spec.split_mode == "split_dir" and not (
            spec.split_dir and all((Path(spec.split_dir) / split).is_dir() for split in SPLIT_NAMES)):
        where = f" at {spec.split_dir}" if spec.split_dir else ""
        raise DataError(f"{benchmark}: no train/, val/ and test/ folders{where}: pass --data DIR or set "
                        "benchmark.split_dir")


def servable_benchmarks(names: Sequence[str], defaults: RunDefaults,
                        env: Mapping[str, str] = os.environ) -> tuple[list[str], list[Skipped]]:
    """The benchmarks to serve and the ones skipped.

    Named benchmarks must all be registered and pass ``check_benchmark`` (else ``ConfigError`` naming
    the benchmark). With no names, every registered benchmark that passes is served and the others are
    returned as skipped with their reason. ``--data`` is one benchmark's data, so it needs exactly one name.
    """
    registered = registered_benchmarks()
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise ConfigError(f"skillopt serve: unknown benchmark {', '.join(map(repr, unknown))}; "
                          f"registered benchmarks: {', '.join(registered) or 'none'}")
    chosen = list(dict.fromkeys(names))
    if defaults.data and len(chosen) != 1:
        raise ConfigError("skillopt serve: --data is one benchmark's data: name exactly that benchmark "
                          "(serve others with their own data from their configs or another `skillopt serve`)")
    if chosen:
        for benchmark in chosen:
            try:
                check_benchmark(benchmark, defaults, env)
            except SkillOptError as error:
                raise ConfigError(f"skillopt serve {benchmark}: {error}") from None
        return chosen, []
    served, skipped = [], []
    for benchmark in registered:
        try:
            check_benchmark(benchmark, defaults, env)
        except SkillOptError as error:
            skipped.append(Skipped(benchmark, str(error).strip().splitlines()[0]))
        else:
            served.append(benchmark)
    return served, skipped


def build_deployments(benchmarks: Sequence[str], defaults: RunDefaults, *, cron: str | None = DEFAULT_CRON,
                      timezone: str = DEFAULT_TIMEZONE) -> list[Any]:
    """One ``RunnerDeployment`` of ``skill-train`` per benchmark; ``cron`` None or "": unscheduled."""
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from skillopt.flows.train import skill_train

    try:
        ZoneInfo(timezone)
        schedules = [Cron(cron, timezone=timezone)] if cron else None
    except (ValueError, ZoneInfoNotFoundError) as error:
        raise ConfigError(f"skillopt serve: not a valid schedule: cron {cron!r} in time zone {timezone!r} "
                          f"(expected five fields such as '{DEFAULT_CRON}' and an IANA zone such as UTC): "
                          f"{str(error).splitlines()[-1]}") from None
    return [
        skill_train.to_deployment(
            name=benchmark,
            schedules=schedules,
            concurrency_limit=CONCURRENCY_PER_BENCHMARK,
            parameters=defaults.parameters(benchmark),
            description=f"Train the {benchmark} skill "
                        f"({defaults.mode} by default{NIGHTLY_NOTE.get(defaults.mode, '')}).",
            tags=["skillopt", f"benchmark:{benchmark}"],
            version=__version__,
            # Load the flow by module, so an installed package (a container, a work-pool host) finds it.
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for benchmark in benchmarks
    ]


def evaluation_deployments(benchmarks: Sequence[str], defaults: RunDefaults, *,
                           cron: str | None = DEFAULT_CRON, timezone: str = DEFAULT_TIMEZONE) -> list[Any]:
    """``skill-eval/<b>``, ``skill-compare/<b>`` and ``skill-transfer/matrix`` (on the schedule) for the
    served benchmarks (``skillopt.deployments.decisions``)."""
    from prefect.schedules import Cron

    from skillopt.deployments.decisions import decision_deployments

    schedules = [Cron(cron, timezone=timezone)] if cron else None
    return decision_deployments(benchmarks, defaults, schedules=schedules,
                                concurrency_limit=CONCURRENCY_PER_BENCHMARK)


def serve_benchmarks(benchmarks: Sequence[str], defaults: RunDefaults, *, cron: str | None = DEFAULT_CRON,
                     timezone: str = DEFAULT_TIMEZONE, grace_s: float = STOP_GRACE_S,
                     registered: Callable[[], None] | None = None,
                     announce: Callable[[str], None] | None = None) -> int:
    """Register the deployments with the Prefect server (then call ``registered``) and execute their runs
    until SIGTERM or SIGINT. ``announce`` is given, for each run that starts, its UI link and the command
    that follows its log.

    Stopping leaves the deployments and their schedules as they are (Prefect's default would pause every
    one of them): the next ``skillopt serve`` picks the schedules up again. Returns 0 after a clean stop
    (runs in progress cancelled through the API); the process exits with ``EXIT_FORCED`` when the stop
    was forced (see ``_PromptRunner``)."""
    from prefect.runner import Runner

    class _PromptRunner(Runner):
        """Prefect's runner, stopping promptly in every state. The first SIGTERM or SIGINT starts Prefect's
        graceful stop (runs in progress are cancelled through the API, their processes ended); if that has not
        finished after ``grace_s`` seconds (the API server is gone and every call retries) or another signal
        comes, the runs' processes are killed and the process exits at once."""

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            _arm_forced_stop(grace_s)
            super().handle_sigterm(*args, **kwargs)

    runner = _PromptRunner(pause_on_shutdown=False)
    for deployment in build_deployments(benchmarks, defaults, cron=cron, timezone=timezone):
        runner.add_deployment(deployment)
    for deployment in evaluation_deployments(benchmarks, defaults, cron=cron, timezone=timezone):
        runner.add_deployment(deployment)
    if registered is not None:
        registered()
    stop_watching = threading.Event()
    if announce is not None:
        from skillopt.shell.prefect_runs import PickedUpRuns

        watcher = PickedUpRuns(list(benchmarks), announce)
        # In this context's copy: the Prefect settings in use (the local server's API when PREFECT_API_URL is
        # unset) are a context variable, and a new thread starts without them: its client would start
        # Prefect's temporary server, a second server process on the same database.
        threading.Thread(target=contextvars.copy_context().run, args=(watcher.watch, stop_watching),
                         name="skillopt-serve-runs", daemon=True).start()
    # Ctrl-C takes the same way out as SIGTERM; asyncio.run then leaves SIGINT to this handler.
    signal.signal(signal.SIGINT, runner.handle_sigterm)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(runner.start())
    finally:
        stop_watching.set()
    return 0

_forced_stop_armed = threading.Event()


def _arm_forced_stop(grace_s: float) -> None:
    """First call: force the stop in ``grace_s`` seconds unless the process has ended by then. Later calls
    (another signal): force it now."""
    if _forced_stop_armed.is_set():
        _force_stop("a second signal")
        return
    _forced_stop_armed.set()
    timer = threading.Timer(grace_s, _force_stop, args=(f"the clean stop took more than {grace_s:g} s",))
    timer.daemon = True
    timer.start()


def _force_stop(why: str) -> None:
    """Kill this process's children (the flow runs in progress) and exit now, saying so."""
    children = _child_processes()
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    killed = f"; killed {len(children)} flow-run process(es) still running" if children else ""
    message = f"skillopt serve: stopped at once ({why}: is the Prefect server gone?){killed}\n"
    with contextlib.suppress(OSError):  # to the descriptor: sys.stderr may be closing with the interpreter
        os.write(2, message.encode())
    os._exit(EXIT_FORCED)


def _child_processes() -> list[int]:
    """Ids of this process's children, from ``/proc`` (where there is none, nothing is found)."""
    found: list[int] = []
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(pid) for pid in children.read_text().split()]
    return sorted(set(found))


if __name__ == "__main__":  # pragma: no cover - the CLI is the documented entry point
    from skillopt.shell.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
