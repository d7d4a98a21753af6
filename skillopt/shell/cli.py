"""The ``skillopt`` command.

Every sub-command prints through a ``Redactor``, so no secret loaded in the process reaches the
terminal; user errors (``SkillOptError``) print one clear message and exit 2, without a traceback.
Heavy imports (Prefect, SDKs) stay inside the commands that need them, so ``skillopt --help`` and
``skillopt config show`` start fast.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import yaml

from skillopt import __version__
from skillopt.core.errors import SkillOptError
from skillopt.core.redact import Redactor
from skillopt.sandbox.process_group import end_leftovers
from skillopt.shell.interrupt import EXIT_INTERRUPTED, INTERRUPTED_MESSAGE, RESUME_HINT, InterruptGuard

if TYPE_CHECKING:
    from pathlib import Path

    from skillopt.core.config import LoadedConfig

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: The commands that run a flow: Ctrl-C stops them through an ``InterruptGuard``.
_RUN_COMMANDS = frozenset({("train", None), ("demo", None), ("eval", None), ("compare", None),
                           ("transfer", None)})


class _Output:
    """stdout and stderr, both redacted."""

    def __init__(self, redactor: Redactor, out: TextIO, err: TextIO) -> None:
        self.redactor = redactor
        self.out = out
        self.err = err
        #: Ctrl-C handling of a run command (None for the others), handed to the flow runner.
        self.guard: InterruptGuard | None = None

    def print(self, text: str = "") -> None:
        self.out.write(self.redactor(text) + "\n")

    def error(self, text: str) -> None:
        self.err.write(self.redactor(f"error: {text}") + "\n")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line, as every other bad input is reported (its subcommands'
    parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="skillopt",
        description="Train an agent's skill document (SKILL.md) like a neural network, as Prefect flows.",
    )
    parser.add_argument("--version", action="version", version=f"skillopt {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    config = commands.add_parser("config", help="show or validate configuration")
    config_commands = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = config_commands.add_parser(
        "show",
        help="print the resolved config of a benchmark and where each value came from",
        description="Print the resolved config of BENCHMARK as YAML, then the source of every value.",
    )
    show.add_argument("benchmark", metavar="BENCHMARK", help="benchmark name, e.g. searchqa")
    _add_config_options(show)
    show.add_argument(
        "--no-sources", action="store_true", help="print only the YAML, without the table of sources"
    )
    validate = config_commands.add_parser(
        "validate", help="check a config file", description="Check a config file (and its _base_ chain)."
    )
    validate.add_argument("file", metavar="FILE", help="a YAML config file")
    validate.add_argument(
        "-o", "--override", action="append", default=[], metavar="KEY=VALUE",
        help="override one value, e.g. -o optimizer.learning_rate=8 (repeatable)",
    )

    train = commands.add_parser(
        "train", help="train a skill on a benchmark",
        description="Train a skill: baseline, epochs of rollout -> reflect -> update -> gate, final test "
                    "evaluation.",
    )
    train.add_argument("benchmark", metavar="BENCHMARK")
    _add_run_options(train)
    _add_skill_option(train)
    train.add_argument("--dry-run", action="store_true",
                       help="print the model calls, tokens and USD the config implies, per stage; call no "
                            "model")

    demo = commands.add_parser(
        "demo", help="run the whole pipeline offline on the built-in demo (a simulation, no key needed)",
        description="Train on the built-in demo benchmark with the deterministic scripted backend, offline.",
    )
    _add_run_options(demo, data=False)
    _add_skill_option(demo)

    evaluate = commands.add_parser("eval", help="score a skill file on a split",
                                   description="Evaluate a skill file on a benchmark split.")
    evaluate.add_argument("benchmark", metavar="BENCHMARK")
    evaluate.add_argument("--skill", required=True, metavar="SKILL",
                          help="the skill: a .md file, a folder with SKILL.md, a run directory, 'initial' or "
                               "registry:<bench>[@<version>]")
    evaluate.add_argument("--split", default="test", help="train, val (selection) or test (default)")
    _add_run_options(evaluate, cache=False)

    commands.add_parser("benchmarks", help="list the installed benchmark plug-ins",
                        description="List the benchmark plug-ins registered under skillopt.benchmarks.")

    backends = commands.add_parser(
        "backends",
        help="list the model backends and how each role resolves",
        description="List the registered backends, then each role's resolved backend, model and credential "
                    "state.",
    )
    _add_role_options(backends)
    backend_commands = backends.add_subparsers(dest="backends_command", metavar="SUBCOMMAND")
    check = backend_commands.add_parser(
        "check",
        help="check each role: credential, endpoint, and one tiny real call",
        description="Preflight before a long job: for each role (or --role), check the credential, reach the "
        "endpoint and make one counted one-token call; print the served model, latency and tokens.",
    )
    check.add_argument("--role", choices=["target", "optimizer", "judge"], help="check only this role")
    check.add_argument("--no-call", action="store_true", help="skip the model call (checks only)")
    _add_role_options(check)

    schedule = commands.add_parser(
        "schedule",
        help="print the edit budget (learning rate) of every step",
        description="Print the edit budget of every step, one line 'step <s>: <budget>' each, then a "
                    "summary.",
    )
    schedule.add_argument("--kind", choices=["constant", "linear", "cosine"], default="cosine")
    schedule.add_argument(
        "--max", dest="max_budget", type=int, default=4, help="L_max (optimizer.learning_rate)"
    )
    schedule.add_argument(
        "--min", dest="min_budget", type=int, default=2, help="L_min (optimizer.min_learning_rate)"
    )
    schedule.add_argument("--steps", type=int, required=True, help="total steps T = epochs * steps per epoch")
    _add_serve_and_skills(commands)
    _add_report_commands(commands)
    _add_server_commands(commands)
    return parser


def _add_server_commands(commands: argparse._SubParsersAction) -> None:
    server = commands.add_parser(
        "server", help="a local Prefect server that stays up, so runs start without waiting for one",
        description="Start, stop or show the local Prefect server (127.0.0.1, database under PREFECT_HOME). "
                    "train, eval, demo and serve use it when PREFECT_API_URL is unset, and start it in the "
                    "background when none runs (--ephemeral: a temporary one for that run instead).",
    )
    server_commands = server.add_subparsers(dest="server_command", metavar="SUBCOMMAND")
    start = server_commands.add_parser("start", help="start it in the background (or find the running one)")
    start.add_argument(
        "--port", type=_port, help="port on 127.0.0.1 (default 4200, or a free one if 4200 is taken)"
    )
    server_commands.add_parser("stop", help="stop it")
    status = server_commands.add_parser("status",
                                        help="say whether it runs and where (exit 1 if it does not)")
    status.add_argument("--api-url", action="store_true",
                        help="print only its API address, e.g. for the prefect command: export "
                             "PREFECT_API_URL=$(skillopt server status --api-url)")


def _add_report_commands(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report", help="write the HTML report of a run (plots, skill diffs, summary)",
        description="Render one self-contained HTML file (inline SVG plots, no network needed) from a run "
                    "directory.",
    )
    report.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/demo-20261130-041210-3fa9c1"
    )
    report.add_argument("--out", metavar="FILE", help="where to write it (default RUN_DIR/report.html)")
    compare = commands.add_parser(
        "compare", help="compare two skills on one benchmark (paired test), or put runs side by side",
        usage="skillopt compare SKILL_A SKILL_B BENCHMARK [options]\n       skillopt compare --runs RUN_DIR "
              "[RUN_DIR ...] [--out FILE]",
        description="SKILL_A SKILL_B BENCHMARK: score both skills on the same items of a split (through the "
                    "cache) and compare them item by item: the difference B - A with its 95% interval, the "
                    "p-value of a paired sign test (0/1 scores) or bootstrap, the items that flipped, tokens "
                    "and cost per item; writes compare.json and compare.html in a run directory. A skill is "
                    "a .md file, a folder with SKILL.md, a run directory (its best_skill.md), 'initial' "
                    "(the benchmark's starting skill) or registry:<bench>[@<version>]. --runs RUN_DIR...: "
                    "score curves, final scores and cost of several runs in one HTML file (also what "
                    "RUN_DIR arguments without a benchmark name at the end do).",
    )
    compare.add_argument("items", nargs="*", metavar="SKILL_A SKILL_B BENCHMARK")
    compare.add_argument("--runs", nargs="+", metavar="RUN_DIR", help="put these runs side by side instead")
    compare.add_argument("--out", metavar="FILE", default=None,
                         help="where to write the page as well (with --runs: instead of compare.html)")
    compare.add_argument("--split", default=None, help="train, val (selection) or test (default)")
    compare.add_argument("--target", metavar="NAME",
                         help="evaluate with the named target model model.targets.NAME")
    _add_run_options(compare, cache=False)

    transfer = commands.add_parser(
        "transfer", help="a transfer matrix: skills x target models x benchmarks",
        description="Evaluate every skill with every named target model (model.targets.NAME) on every "
                    "benchmark, each cell one cached evaluation; the difference of each to the initial skill "
                    "on the same target and benchmark with its 95% interval, and the cost per item. Writes "
                    "matrix.json and an HTML heatmap (matrix.html) in a run directory.",
    )
    transfer.add_argument("--skills", nargs="+", required=True, metavar="SKILL",
                          help="skills as for compare (initial, files, folders, run dirs, registry:...)")
    transfer.add_argument("--targets", nargs="+", required=True, metavar="NAME",
                          help="named target models (model.targets.NAME of the config)")
    transfer.add_argument("--bench", nargs="+", required=True, metavar="BENCHMARK", help="benchmarks")
    transfer.add_argument("--split", default="test", help="train, val (selection) or test (default)")
    _add_run_options(transfer, cache=False)


def _add_serve_and_skills(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="serve the skill-train/<benchmark> deployments on a Prefect server (nightly runs)",
        description="Register one deployment skill-train/<benchmark> per benchmark with a nightly schedule "
                    "and mode: nightly, then run their flow runs until interrupted. --data, --backend, "
                    "--model, -c and -o become the deployments' default parameters. With no names, every "
                    "installed benchmark whose config and data check out is served and the others are "
                    "listed with the reason. Serves on PREFECT_API_URL, else on the local server of "
                    "`skillopt server start` (started in the background when none runs). Prints each run it "
                    "picks up with its UI link.",
    )
    serve.add_argument("benchmarks", nargs="*", metavar="BENCHMARK",
                       help="benchmarks to serve (default: every one whose data resolves)")
    serve.add_argument(
        "--data",
        metavar="PATH",
        help="the benchmark's data (one name only): a folder with train/ "
        "val/ test/ (split_dir mode) or one data file (ratio mode)",
    )
    serve.add_argument("--cron", default=None, metavar="EXPR",
                       help="schedule of every deployment, a cron expression (default: '0 3 * * *')")
    serve.add_argument(
        "--timezone", default=None, metavar="TZ", help="time zone of the cron schedule (default: UTC)"
    )
    serve.add_argument(
        "--no-schedule", action="store_true", help="serve without a schedule (runs on demand only)"
    )
    serve.add_argument("--mode", choices=["nightly", "train"], default="nightly",
                       help="the deployments' default mode (default: nightly)")
    _add_skill_option(serve)
    _add_config_options(serve)
    _add_role_flags(serve)

    skill = commands.add_parser(
        "skill", help="a run's best skill as an Agent Skills folder: export, install",
        description="Write a run's best skill as an Agent Skills folder (SKILL.md, references/, ...), or "
                    "install it where Claude Code or Codex discovers skills.",
    )
    skill_commands = skill.add_subparsers(dest="skill_command", metavar="SUBCOMMAND")
    export = skill_commands.add_parser("export", help="write the run's best skill as a folder under DIR")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<run>)")
    export.add_argument("--to", required=True, metavar="DIR", help="the folder to write <name>/ into")
    install = skill_commands.add_parser(
        "install", help="install the run's best skill for an agent",
        description="Install the run's best skill into the agent's skills folder (.claude/skills/<name>/ for "
                    "Claude Code, .agents/skills/<name>/ for Codex), in a project or in your home folder.")
    install.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<run>)")
    install.add_argument("--agent", required=True, choices=["claude-code", "codex"])
    where = install.add_mutually_exclusive_group(required=True)
    where.add_argument("--project", metavar="DIR", help="install into this project folder")
    where.add_argument("--global", dest="global_", action="store_true", help="install into your home folder")
    for sub in (export, install):
        sub.add_argument("--force", action="store_true", help="replace a different skill of the same name")
    runs = commands.add_parser(
        "runs", help="recent runs on the Prefect server: state, best score, UI link; Late runs nobody "
                     "serves",
        description="List the recent skill-train and skill-eval runs of the Prefect server in use "
                    "(PREFECT_API_URL, else the local server of `skillopt server start`): state, best gate "
                    "score and the run's page in the UI. A Late run of a deployment that no process serves "
                    "is flagged with the `skillopt serve` command that would run it. `skillopt runs logs ID "
                    "--follow` prints a run's log as it is written.",
    )
    runs.add_argument("-n", "--limit", type=_at_least_one, default=10, metavar="N",
                      help="how many runs (default 10)")
    runs_commands = runs.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    logs = runs_commands.add_parser("logs", help="a run's log (the training story); --follow until it ends")
    logs.add_argument("flow_run_id", metavar="RUN",
                      help="the flow run's name or id (skillopt runs, serve and the UI show them)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new lines until the run ends")

    skills = commands.add_parser(
        "skills", help="the registry of promoted skills: list, show, promote, rollback",
        description="Manage the promoted skills that nightly runs warm-start from (run.skills_dir, default "
                    "skills/).",
    )
    skills_commands = skills.add_subparsers(dest="skills_command", metavar="SUBCOMMAND")
    listing = skills_commands.add_parser(
        "list", help="every benchmark's current version, or one benchmark's history"
    )
    listing.add_argument("benchmark", nargs="?", metavar="BENCHMARK")
    show = skills_commands.add_parser("show", help="print the promoted skill (or one version)")
    show.add_argument("benchmark", metavar="BENCHMARK")
    show.add_argument(
        "--version", dest="skill_version", type=int, metavar="N", help="print version N instead"
    )
    promote = skills_commands.add_parser(
        "promote", help="promote a skill file or a run's best_skill.md by hand"
    )
    promote.add_argument("benchmark", metavar="BENCHMARK")
    promote.add_argument(
        "source", metavar="RUN_DIR_OR_SKILL",
        help="a run directory (its best skill), an Agent Skills folder or a markdown file"
    )
    promote.add_argument("--max-file-bytes", type=_at_least_one, default=262_144, metavar="N",
                         help="the largest text file a skill folder may hold (default: 262144)")
    rollback = skills_commands.add_parser(
        "rollback", help="make the previously promoted version current again"
    )
    rollback.add_argument("benchmark", metavar="BENCHMARK")
    for sub in (listing, show, promote, rollback):
        sub.add_argument("--skills-dir", metavar="DIR", help="the registry folder (default: run.skills_dir)")
        _add_config_options(sub)


def _whole_number(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None


def _at_least_one(text: str) -> int:
    """A count given on the command line: a whole number of at least 1."""
    value = _whole_number(text, "whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def _port(text: str) -> int:
    """A TCP port given on the command line: 1 to 65535."""
    value = _whole_number(text, "port number")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1 to 65535)")
    return value


def _add_skill_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skill", metavar="PATH",
                        help="the skill to start from: an Agent Skills folder (SKILL.md, references/, ...) "
                             "or a markdown file (sets train.skill_init)")


def _skill_overrides(args: argparse.Namespace) -> list[str]:
    return [f"train.skill_init={args.skill}"] if getattr(args, "skill", None) else []


def _add_run_options(parser: argparse.ArgumentParser, *, data: bool = True, cache: bool = True) -> None:
    _add_config_options(parser)
    if data:
        parser.add_argument("--data", metavar="PATH",
                            help="a folder with train/ val/ test/ (split_dir mode) or one data file (ratio "
                                 "mode)")
    parser.add_argument("--run-name", metavar="NAME", help="run directory name; re-use one to resume")
    parser.add_argument("--ephemeral", action="store_true",
                        help="without a Prefect API or a running local server, use a temporary Prefect "
                             "server for this run instead of starting the local one in the background "
                             "(run.prefect_server: temporary)")
    if cache:
        parser.add_argument(
            "--no-cache", action="store_true", help="recompute every call (refresh the cache)"
        )
    _add_role_flags(parser)


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", metavar="FILE", help="your YAML file, merged over the benchmark's")
    parser.add_argument(
        "-o", "--override", action="append", default=[], metavar="KEY=VALUE",
        help="override one value, e.g. -o optimizer.learning_rate=8 (repeatable, applied in order)",
    )


def _add_role_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--benchmark", metavar="NAME", help="start from this benchmark's config")
    _add_config_options(parser)
    _add_role_flags(parser)


def _add_role_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", help="backend for every role without its own setting")
    parser.add_argument("--model", help="model for every role without its own setting")
    for role in ("target", "optimizer", "judge"):
        parser.add_argument(f"--{role}-backend", dest=f"{role}_backend", metavar="NAME")
        parser.add_argument(f"--{role}-model", dest=f"{role}_model", metavar="ID")
    parser.add_argument("--effort", action="append", default=[], metavar="ROLE=LEVEL",
                        help="reasoning effort of one role, e.g. --effort optimizer=high (repeatable)")


def _resolve(args: argparse.Namespace):  # noqa: ANN202 - returns (loaded, roles, registry)
    from skillopt.core.config import load_config
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.roles import CliRoleOptions, resolve_roles

    roles = _cli_roles(args)
    loaded = load_config(args.benchmark, config_file=args.config, overrides=args.override, env=os.environ,
                         cli_roles=roles)
    cli = CliRoleOptions(**roles)
    registry = BackendRegistry.default()
    return loaded, resolve_roles(loaded, cli=cli, env=os.environ, registry=registry), registry


def _cli_roles(args: argparse.Namespace) -> dict:
    """The named role options as plain data (``CliRoleOptions`` fields), e.g. for a flow parameter."""
    from skillopt.llm.roles import CliRoleOptions

    roles = ("target", "optimizer", "judge")
    return {
        "backend": args.backend,
        "model": args.model,
        "role_backend": {r: getattr(args, f"{r}_backend") for r in roles if getattr(args, f"{r}_backend")},
        "role_model": {r: getattr(args, f"{r}_model") for r in roles if getattr(args, f"{r}_model")},
        "effort": CliRoleOptions.parse_efforts(args.effort),
    }


def _data_overrides(data: str | None) -> list[str]:
    from skillopt.core.data import data_overrides

    return data_overrides(data)


def _cmd_train(args: argparse.Namespace, out: _Output) -> int:
    overrides = [*_data_overrides(args.data), *_skill_overrides(args), *args.override]
    if args.dry_run:
        return _dry_run(args, overrides, out)
    if args.no_cache:
        overrides.append("run.refresh_cache=true")
    loaded = _check_before_prefect(args.benchmark, args, overrides)
    started = _now_iso()
    summary = _run_flow("train", out, prefect_server=_prefect_server(loaded, args), benchmark=args.benchmark,
                        config_file=args.config, overrides=overrides, run_name=_prefetch(loaded, args),
                        cli_roles=_cli_roles(args))
    _print_summary(summary, out, started=started)
    return EXIT_OK


def _prefetch(loaded: LoadedConfig, args: argparse.Namespace) -> str | None:
    """Build the training run and start its first calls while Prefect loads (``skillopt.run.prefetch``);
    returns the run's name for the flow, which adopts the run."""
    from dataclasses import asdict

    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.prefetch import start_before_flow

    return start_before_flow(loaded, cli_roles=asdict(CliRoleOptions(**_cli_roles(args))),
                             run_name=args.run_name)


def _prefect_server(loaded: LoadedConfig | None, args: argparse.Namespace) -> str:
    """Which Prefect server a run starts when it has none: ``temporary`` with ``--ephemeral`` or
    ``SKILLOPT_PREFECT_SERVER=temporary``, else ``run.prefect_server`` (``background`` by default;
    also for the commands that span several configs, ``compare`` and ``transfer``)."""
    if args.ephemeral:
        return "temporary"
    chosen = os.environ.get("SKILLOPT_PREFECT_SERVER", "").strip()
    if chosen:
        if chosen not in ("background", "temporary"):
            from skillopt.core.errors import ConfigError

            raise ConfigError(f"SKILLOPT_PREFECT_SERVER={chosen!r}: expected background or temporary")
        return chosen
    return loaded.config.run.prefect_server if loaded is not None else "background"


def _run_flow(kind: str, out: _Output, *, prefect_server: str, **parameters: object) -> dict:
    """Run the flow; on a terminal its lines scroll above a live status line (stage, items, calls, cost)."""
    from skillopt.flows.run import run_flow
    from skillopt.shell.live_display import LiveDisplay, wants_live_display

    if not wants_live_display(out.out):
        return run_flow(kind, out, out.guard, prefect_server=prefect_server, **parameters)
    display = LiveDisplay(out.out, out.redactor)
    if out.guard is not None:
        out.guard.add_cleanup(display.stop)  # a forced exit gives the terminal its cursor back
    with display:
        return run_flow(kind, display, out.guard, prefect_server=prefect_server, **parameters)


def _check_before_prefect(
    benchmark: str,
    args: argparse.Namespace,
    overrides: list[str],
    *,
    roles_used: tuple[str, ...] = ("target", "optimizer"),
    split: str | None = None,
) -> LoadedConfig:
    """Config, benchmark, roles, credentials and data, checked before Prefect is imported: a bad input is
    reported in under a second, once, instead of after Prefect's import and server start. Returns the
    validated config."""
    from skillopt.core.config import load_config
    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.run_checks import check_run

    roles = _cli_roles(args)
    loaded = load_config(benchmark, config_file=args.config, overrides=overrides, env=os.environ,
                         cli_roles=roles)
    check_run(
        loaded,
        cli=CliRoleOptions(**roles),
        env=os.environ,
        roles_used=roles_used,
        split=split,
        command=f"skillopt {args.command} BENCHMARK",
        run_name=getattr(args, "run_name", None) if "optimizer" in roles_used else None,
    )
    return loaded


def _dry_run(args: argparse.Namespace, overrides: list[str], out: _Output) -> int:
    """``train --dry-run``: the estimate of calls, tokens and USD; no model call, no Prefect run."""
    from skillopt.core.config import load_config
    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.estimate import dry_run, format_estimate

    roles = _cli_roles(args)
    loaded = load_config(args.benchmark, config_file=args.config, overrides=overrides, env=os.environ,
                         cli_roles=roles)
    estimate = dry_run(loaded, cli=CliRoleOptions(**roles), env=os.environ)
    for line in format_estimate(estimate):
        out.print(line)
    return EXIT_OK


def _demo_real_roles(loaded: LoadedConfig, args: argparse.Namespace) -> list[str]:
    """The demo's roles that call a real model (``target local/…``); none when the run is a simulation."""
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.roles import CliRoleOptions, resolve_roles

    roles = resolve_roles(loaded, cli=CliRoleOptions(**_cli_roles(args)), env=os.environ,
                          registry=BackendRegistry.default())
    chosen = (("target", roles.target), ("optimizer", roles.optimizer))
    return [f"{name} {role.label()}" for name, role in chosen if role.backend != "scripted"]


def _demo_banner(real: list[str]) -> list[str]:
    """What the demo says of itself: a simulation when every role is scripted, else which roles are real."""
    if not real:
        return ["skillopt demo: a simulated run on the built-in demo benchmark with the deterministic "
                "`scripted`", "backend (no model, no key, no network). Every number below comes from that "
                "simulation."]
    return [f"skillopt demo: the built-in demo benchmark with a real model as {'; '.join(real)}; any other "
            "role is the", "deterministic `scripted` backend. The items are generated; the scores are these "
            "models'."]


def _demo_next_steps(real: list[str]) -> list[str]:
    """Where to go after the demo: your own data with a real model; after the simulation, also this demo with
    a local model as the target."""
    lines = ["Next: train on your own data with a real model, for example",
             "  export OPENAI_API_KEY=...            # or ANTHROPIC_API_KEY, or a local server "
             "(docs/backends.md)",
             "  skillopt backends check              # check the credential and endpoint first",
             "  skillopt train qa --data examples/qa/my_items.jsonl --backend openai --model gpt-4.1-mini"]
    if not real:
        lines.append("Or run this demo with a local GGUF model as the target: skillopt demo --target-backend "
                     "local -o model.target.options.model_path=PATH.gguf")
    return lines


def _cmd_demo(args: argparse.Namespace, out: _Output) -> int:
    overrides = [*_skill_overrides(args), *args.override,
                 *(["run.refresh_cache=true"] if args.no_cache else [])]
    loaded = _check_before_prefect("demo", args, overrides)
    real = _demo_real_roles(loaded, args)
    for line in _demo_banner(real):
        out.print(line)
    started = _now_iso()
    summary = _run_flow("train", out, prefect_server=_prefect_server(loaded, args), benchmark="demo",
                        config_file=args.config, overrides=overrides, run_name=_prefetch(loaded, args),
                        cli_roles=_cli_roles(args))
    _print_summary(summary, out, started=started)
    out.print()
    for line in _demo_next_steps(real):
        out.print(line)
    return EXIT_OK


def _cmd_eval(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell.decision_cli import read_skills

    overrides = [*_data_overrides(args.data), *args.override]
    loaded = _check_before_prefect(args.benchmark, args, overrides, roles_used=("target",), split=args.split)
    read_skills(loaded, [args.skill])  # a skill that cannot be read or does not parse stops here
    result = _run_flow("eval", out, prefect_server=_prefect_server(loaded, args), benchmark=args.benchmark,
                       skill_file=args.skill, split=args.split, config_file=args.config, overrides=overrides,
                       run_name=args.run_name, cli_roles=_cli_roles(args))
    out.print(f"{args.benchmark} {result['split']}: hard {result['hard']:.3f}  soft {result['soft']:.3f}  "
              f"(n={result['n']}, skill {result['skill_sha'][:12]})")
    for task_type, row in result["per_task_type"].items():
        out.print(f"  {task_type:<20} hard {row['hard']:.3f}  soft {row['soft']:.3f}  n={row['n']}")
    out.print(f"results: {result['run_dir']}")
    return EXIT_OK


def _now_iso() -> str:
    """Now, in the format of ``usage.jsonl``'s ``ts`` (ISO 8601 UTC with milliseconds), so they compare."""
    import time

    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def attempt_line(summary: dict, started: str) -> str | None:
    """For a resumed run: how many of its model calls this attempt made and how many earlier attempts did
    (the summary's total counts both). None for a run with one attempt."""
    from pathlib import Path

    from skillopt.run.runs import RunDir

    if not summary.get("run_dir"):
        return None
    run = RunDir(Path(summary["run_dir"]))
    total, new = run.paid_calls(), run.paid_calls(since=started)
    if total == new:
        return None
    return f"of the {total} model calls, {new} were made by this attempt and {total - new} by earlier ones"


def _print_summary(summary: dict, out: _Output, *, started: str | None = None) -> None:
    scores = summary["scores"]
    out.print()
    out.print(f"run {summary['run_name']} finished" + (f" (stopped by {summary['stopped_by']})"
                                                       if summary.get("stopped_by") else ""))
    if summary.get("stopped_message"):
        out.print(f"  {summary['stopped_message']}; best_skill.md holds the best skill so far")
    for phase in ("baseline", "best"):
        parts = [f"{split} hard {v['hard']:.3f} soft {v['soft']:.3f}"
                 for split, v in (scores.get(phase) or {}).items()]
        out.print(f"  {phase:<9} " + ("; ".join(parts) or "not scored"))
    note = best_after_the_last_step(summary)
    if note:
        out.print(f"  {note}")
    total = summary.get("counts", {}).get("total", {})
    if total:
        out.print(f"  steps {total.get('n', 0)}: {total.get('accepts', 0)} accepted, "
                  f"{total.get('rejects', 0)} rejected, {total.get('skips', 0)} skipped")
    usage = summary.get("usage", {}).get("total", {})
    if usage:
        out.print(f"  {usage_line(usage)}")
    attempts = attempt_line(summary, started) if started else None
    if attempts:
        out.print(f"  {attempts}")
    out.print(f"  run directory: {summary.get('run_dir', '')}")


def best_after_the_last_step(summary: dict) -> str | None:
    """Why the best skill scores above the best the step lines reported, when it does: the epoch boundary
    (slow update, meta skill) changed the last skill, which the final check found better than the best gated
    one. None otherwise."""
    from pathlib import Path

    from skillopt.core.gate import gate_score
    from skillopt.run.runs import RunDir

    run_dir = summary.get("run_dir")
    final = ((summary.get("scores") or {}).get("final") or {}).get("selection")
    best = ((summary.get("scores") or {}).get("best") or {}).get("selection")
    if not run_dir or not isinstance(final, dict) or not isinstance(best, dict):
        return None
    try:
        history = RunDir(Path(run_dir)).read_history()
    except (SkillOptError, OSError):
        return None
    if not history:
        return None
    evaluation = (summary.get("config") or {}).get("evaluation") or {}
    metric, weight = evaluation.get("gate_metric", "hard"), float(evaluation.get("gate_mixed_weight", 0.5))
    best_score = gate_score(best["hard"], best["soft"], metric, weight)
    last = history[-1]
    if best_score <= last.best_score + 1e-9:
        return None
    kinds = sorted({r.kind.replace("_", " ") for r in history if r.kind not in ("step", "final")})
    after = " and ".join(kinds) or "last step"
    return (f"best {best_score:.3f}, not the {last.best_score:.3f} of the step lines: the skill the {after} "
            f"left scored {best_score:.3f} on the selection split at the final check, so it became the best")


def usage_line(usage: dict) -> str:
    """``model calls N, cost $X`` from a usage total, saying plainly when the cost is not known or calls came
    from the cache (a summary's ``usage.total``)."""
    from skillopt.llm.usage import cost_text

    cached = usage.get("cache_hits", 0)
    line = f"model calls {usage.get('calls', 0)}, cost {cost_text(usage)}"
    if cached:
        line += f"; {cached} call{'s' if cached != 1 else ''} served from cache"
    return line


def _cmd_benchmarks(args: argparse.Namespace, out: _Output) -> int:
    from importlib.metadata import entry_points

    from skillopt.benchmarks.base import ENTRY_POINT_GROUP, load_benchmark

    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        # One broken plug-in must not hide the others: it is listed as unavailable, with the reason.
        try:
            line = _listing_line(load_benchmark(entry.name))
        except SkillOptError as error:
            line = f"unavailable: {error}"
        except Exception as error:  # noqa: BLE001 - a bug in the plug-in, said on its own line
            line = f"unavailable: {type(error).__name__}: {' '.join(str(error).split())}"
        out.print(f"{entry.name:<24} {line}")
    out.print("\nsandbox for model-written code (spreadsheetbench, swebench's fake harness): "
              f"{_sandbox_line()}")
    out.print("an extra installs with: pip install 'skillopt[NAME]'; a judge role is set with "
              "--judge-backend or -o model.judge.backend=...")
    return EXIT_OK


def _listing_line(benchmark: Any) -> str:
    """What ``skillopt benchmarks`` says of one loaded plug-in after its name."""
    from skillopt.benchmarks.base import keys_without_default

    if missing := keys_without_default(benchmark):
        return f"unavailable: its Config has no default for {', '.join(repr(key) for key in missing)}"
    summary = _one_line_summary(sys.modules[type(benchmark).__module__].__doc__ or "")
    judge = "needs the judge role" if benchmark.needs_judge(benchmark.Config()) else "no judge"
    extras = benchmark.extras
    needs = "extras: " + ",".join(extras) if extras else "no extras"
    return f"v{benchmark.version:<4} {benchmark.default_split_mode:<10} {judge:<21} {needs:<24} {summary}"


def _sandbox_line() -> str:
    """Whether the OS sandbox works here, and the fix when it does not."""
    from skillopt.sandbox.confine import SANDBOX_FIX, sandbox_status

    status = sandbox_status()
    return status.describe() if status.available else f"{status.describe()}; fix: {SANDBOX_FIX}"


def _one_line_summary(docstring: str) -> str:
    """The first sentence of a plug-in module's docstring, without reST markup, for one listing line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    paragraph = paragraph.replace("``", "")
    title_end = paragraph.find(": ")  # "DocVQA (docvqa): short extractive answers ..." -> the description
    sentence = paragraph[title_end + 2:] if 0 < title_end < 60 else paragraph
    sentence = sentence.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 110 else sentence[:109].rstrip() + "…"


def _cmd_backends(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.llm.roles import provenance_table

    loaded, roles, registry = _resolve(args)
    out.print("registered backends:")
    for name in registry.names():
        info = registry.get(name)
        key = f"key {info.key_env}" if info.key_env else "no key"
        out.print(f"  {name:<18} {info.kind:<5} {key:<32} {info.summary}")
    out.print()
    out.print("roles (value, source):")
    for role, field_name, value, source in provenance_table(roles, os.environ):
        out.print(f"  {role:<10} {field_name:<17} {value:<40} {source}")
    return EXIT_OK


def _cmd_backends_check(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.llm.base import EnvSecrets
    from skillopt.llm.clients import ModelClients
    from skillopt.llm.preflight import check_role

    loaded, roles, registry = _resolve(args)
    limiter = None
    if loaded.config.model.rate_limit_mode == "prefect":
        from skillopt.tasks.limits import PrefectRateLimiter

        limiter = PrefectRateLimiter(loaded.config.model.providers)
    clients = ModelClients.build(roles, loaded=loaded, registry=registry, secrets=EnvSecrets(os.environ),
                                 limiter=limiter)
    wanted = [args.role] if args.role else ["target", "optimizer", "judge"]
    failed = False
    for role in wanted:
        client = getattr(clients, role)
        if client is None:
            message = f"{role}: cannot be resolved: {roles.judge_problem}"
            if args.role:
                out.error(message)
                return EXIT_FAILURE
            out.print(f"{role}: skipped ({roles.judge_problem})")
            continue
        result = check_role(client, os.environ, call=not args.no_call)
        out.print(f"{role}: {result.label} {'ok' if result.ok else 'FAILED'}")
        for line in result.lines:
            out.print(f"  {line}")
        if not result.ok:
            failed = True
            out.error(f"{role}: {result.problem}")
    out.print(f"sandbox (model-written code, exec targets): {_sandbox_line()}")
    return EXIT_FAILURE if failed else EXIT_OK


def _cmd_config_show(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.core.config import dump_config, load_config
    from skillopt.core.errors import BenchmarkPluginError

    loaded = load_config(args.benchmark, config_file=args.config, overrides=args.override, env=os.environ)
    try:
        _check_benchmark_section(loaded)
        unloadable = None
    except BenchmarkPluginError as error:  # the config is still shown; the command fails after it
        unloadable = error
    data = dump_config(loaded)
    out.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100).rstrip())
    if not args.no_sources:
        _print_sources(loaded, data, out)
    if unloadable is not None:
        out.error(str(unloadable))
        return EXIT_USAGE
    return EXIT_OK


def _print_sources(loaded: Any, data: dict[str, Any], out: _Output) -> None:
    """``config show``'s comments: where each value came from, the credentials, the item time limit."""
    from skillopt.core.config import DEFAULT_SOURCE, flatten

    out.print()
    out.print("# where each value came from (every value not listed: default)")
    for dotted in flatten(data):
        source = loaded.source_of(dotted)
        if source != DEFAULT_SOURCE:
            out.print(f"# {dotted}: {source}")
    out.print("# credentials (presence only; values are never read into the config)")
    for role, status in _credentials(loaded).items():
        out.print(f"# model.{role}: {status}")
    limit = _item_limit_line(loaded)
    if limit:
        out.print(f"# {limit}")


def _credentials(loaded: LoadedConfig) -> dict[str, str]:
    """Per role, its credential as a run resolves it (``set (env:VAR)``, ``optional, missing (env:VAR)`` for a
    local server's preset, ``not needed`` for a backend that sends no key, …); never a value."""
    from skillopt.core.config import ROLES
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.roles import credential_state, resolve_roles

    try:
        roles = resolve_roles(loaded, env=os.environ, registry=BackendRegistry.default())
    except SkillOptError as error:
        return {"target and optimizer": f"not resolved: {error}"}
    states = {}
    for name in ROLES:
        role = roles.get(name)
        if role is not None:
            states[name] = credential_state(role, os.environ)
        else:
            states[name] = ("disabled (model.judge: null)" if loaded.config.model.judge is None
                            else f"not resolved: {roles.judge_problem}")
    return states


def _check_benchmark_section(loaded: Any) -> None:
    """The ``benchmark:`` keys of a named benchmark, checked by its plug-in as a run checks them. A plug-in
    that cannot be loaded cannot check them: ``BenchmarkPluginError`` says why, naming the keys only the
    plug-in knows (an unknown benchmark is left to the run, which lists the registered ones)."""
    from skillopt.benchmarks.base import BenchmarkConfig, benchmark_config, load_benchmark
    from skillopt.core.errors import BenchmarkPluginError, ConfigError

    section = loaded.config.benchmark
    if not section.name:
        return
    try:
        benchmark = load_benchmark(section.name)
    except ConfigError:
        return
    except BenchmarkPluginError as error:
        own = [f"benchmark.{key}" for key in section.model_dump() if key not in BenchmarkConfig.model_fields]
        unchecked = f"; so its own keys ({', '.join(own)}) are not checked" if own else ""
        raise BenchmarkPluginError(f"{error}{unchecked}") from error
    benchmark_config(benchmark, section, loaded.source_of)


def _item_limit_line(loaded: Any) -> str | None:
    """``config show``'s line on the item time limit, or None when the roles or benchmark cannot be resolved
    here (a missing plug-in extra, an unknown backend): the config itself was printed."""
    from skillopt.benchmarks.base import benchmark_config, load_benchmark
    from skillopt.benchmarks.item_limit import describe_limit
    from skillopt.llm.base import BackendRegistry
    from skillopt.llm.roles import resolve_roles

    try:
        registry = BackendRegistry.default()
        roles = resolve_roles(loaded, env=os.environ, registry=registry)
        section = loaded.config.benchmark
        bench_cfg: Any = section
        judge = roles.judge
        if section.name:
            benchmark = load_benchmark(section.name)
            bench_cfg = benchmark_config(benchmark, section)
            judge = judge if benchmark.needs_judge(bench_cfg) else None
        return describe_limit(bench_cfg, roles.target, judge, loaded.config.model.retry,
                              exec_target=registry.get(roles.target.backend).kind == "exec")
    except (SkillOptError, ImportError):
        return None


def _cmd_config_validate(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.core.config import load_config_file

    loaded = load_config_file(args.file, overrides=args.override, env=os.environ)
    _check_benchmark_section(loaded)
    name = loaded.config.benchmark.name
    suffix = (f" (benchmark: {name})" if name else
              " (its benchmark: keys are checked by the benchmark's plug-in once one is named: skillopt "
              f"config show BENCHMARK -c {args.file})")
    out.print(f"{args.file}: valid{suffix}")
    return EXIT_OK


def _cmd_schedule(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.optimizer.schedule import EditBudgetSchedule

    schedule = EditBudgetSchedule.from_config(args.kind, args.max_budget, args.min_budget, args.steps)
    budgets = schedule.budgets()
    for step, budget in enumerate(budgets, start=1):
        out.print(f"step {step}: {budget}")
    counts = schedule.summary()
    parts = ", ".join(f"{n} step{'s' if n != 1 else ''} of {b}" for b, n in counts.items())
    out.print(f"# {args.kind} {args.max_budget}->{args.min_budget} over {args.steps} steps: {parts}; "
              f"{sum(budgets)} edits at most")
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.deployments.serve import (
        DEFAULT_CRON,
        DEFAULT_TIMEZONE,
        memory_leases_note,
        run_defaults,
        servable_benchmarks,
        serve_benchmarks,
        settle_abandoned_runs,
    )

    defaults = run_defaults(mode=args.mode, data=args.data, config_file=args.config, overrides=args.override,
                            cli_roles=_cli_roles(args), skill=args.skill)
    benchmarks, skipped = servable_benchmarks(args.benchmarks, defaults)  # reported now, not at 3 a.m.
    if not benchmarks:
        raise SkillOptError("skillopt serve: no benchmark to serve: "
                            + "; ".join(f"{s.benchmark}: {s.reason}" for s in skipped))

    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        get_current_settings,
        temporary_settings,
    )

    from skillopt.shell import local_server

    api: dict[Any, Any] = {}
    if not get_current_settings().api.url:
        # The local server of `skillopt server start`, as train/eval/demo use it (started if none runs).
        home = local_server.prefect_home(os.environ)
        server = local_server.running(home)
        if server is not None:
            out.print(f"Prefect: the local server at {server.ui_url} (skillopt server)")
        elif os.environ.get("SKILLOPT_PREFECT_SERVER", "").strip() == "temporary":
            raise SkillOptError("skillopt serve needs a Prefect server that stays up, and "
                                "SKILLOPT_PREFECT_SERVER=temporary rules out starting the local one: start "
                                "it with `skillopt server start` or set PREFECT_API_URL (e.g. "
                                "http://127.0.0.1:4200/api; see docs/self-hosting.md)")
        else:
            server, _ = local_server.start(home, {**os.environ, "PREFECT_HOME": str(home)})
            out.print(local_server.started_note(server))
        api = {PREFECT_API_URL: server.api_url}
    # The `prefect` command finds the local server only through PREFECT_API_URL (without it, it starts a
    # temporary server of its own on the same database), so the line to copy names it.
    prefect_command = f"PREFECT_API_URL={api[PREFECT_API_URL]} prefect" if api else "prefect"
    start_line = (f"  start a run: {prefect_command} deployment run skill-train/{benchmarks[0]}   "
                  "(stop serving: Ctrl-C)")
    cron = None if args.no_schedule else (args.cron or DEFAULT_CRON)
    out.print(
        f"serving {len(benchmarks)} deployment(s): " + ", ".join(f"skill-train/{b}" for b in benchmarks)
    )
    from skillopt.deployments.decisions import deployment_names

    out.print("  and for evaluation: " + ", ".join(deployment_names(benchmarks)))
    for skip in skipped:
        out.print(f"  skipped {skip.benchmark}: {skip.reason}")
    out.print(f"  schedule: {cron + ' ' + (args.timezone or DEFAULT_TIMEZONE) if cron else 'none'}; "
              f"default mode: {args.mode}; at most 1 run per benchmark at a time")
    parameters = {
        k: v for k, v in defaults.parameters(benchmarks[0]).items() if k not in ("benchmark", "mode")
    }
    if parameters:
        out.print("  default parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    with temporary_settings(updates=api, set_defaults={PREFECT_SERVER_ANALYTICS_ENABLED: False}):
        for line in settle_abandoned_runs(benchmarks, defaults):
            out.print(f"  {line}")
        note = memory_leases_note()
        if note:
            out.print(f"  {note}")
        # Said once the deployments exist on the server: printed before, the command it names failed with
        # "Deployment ... not found" for the 2-3 s the registration took.
        return serve_benchmarks(benchmarks, defaults, cron=cron, timezone=args.timezone or DEFAULT_TIMEZONE,
                                registered=lambda: out.print(start_line),
                                announce=out.print)


@contextmanager
def _prefect_api(command: str) -> Iterator[Any]:
    """A sync Prefect client of the API in use: ``PREFECT_API_URL``, else the local server; else an error
    saying how to get one."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from skillopt.shell import local_server

    updates: dict[Any, Any] = {}
    if not get_current_settings().api.url:
        server = local_server.running(local_server.prefect_home(os.environ))
        if server is None:
            raise SkillOptError(f"{command}: no Prefect server to ask: start one with `skillopt server "
                                "start` or set PREFECT_API_URL")
        updates = {PREFECT_API_URL: server.api_url}
    with temporary_settings(updates=updates), get_client(sync_client=True) as client:
        yield client


def _cmd_runs(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell.prefect_runs import Upcoming, format_runs, recent_runs

    with _prefect_api("skillopt runs") as client:
        upcoming: list[Upcoming] = []
        rows = recent_runs(client, limit=args.limit, upcoming=upcoming)
        for line in format_runs(rows, upcoming):
            out.print(line)
    return EXIT_OK


def _cmd_runs_logs(args: argparse.Namespace, out: _Output) -> int:
    from prefect.exceptions import ObjectNotFound

    from skillopt.shell.prefect_runs import flow_run_id_of, follow_logs

    with _prefect_api("skillopt runs logs") as client:
        try:
            run_id = flow_run_id_of(client, args.flow_run_id)
            state = follow_logs(client, run_id, out.print, follow=args.follow)
        except ObjectNotFound:
            raise SkillOptError(f"skillopt runs logs: no flow run {args.flow_run_id} on this Prefect server "
                                "(`skillopt runs` lists them)") from None
    out.print(f"(run {state})")
    return EXIT_OK


def _cmd_server_start(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell import local_server

    home = local_server.prefect_home(os.environ)
    server, started = local_server.start(home, os.environ, port=args.port)
    out.print(f"{'started' if started else 'already running:'} Prefect server (pid {server.pid}), "
              f"database under {home}")
    out.print(f"  UI:  {server.ui_url}")
    out.print(f"  API: {server.api_url}  (skillopt train/eval/demo use it while PREFECT_API_URL is unset)")
    out.print(f"  log: {server.log_path}; stop it with `skillopt server stop`")
    out.print(_preload_line(home))
    if not started and args.port and f":{args.port}/" not in server.api_url:
        out.print(f"  --port {args.port} not used: this server already runs; `skillopt server stop` first to "
                  "start it on another port")
    return EXIT_OK


def _preload_line(home: Path) -> str:
    from skillopt.shell import preload

    pid = preload.recorded_process(home)
    if pid is None:
        return (f"  runs: each starts in its own process (the preloaded process is not running; see "
                f"{home / preload.LOG})")
    return (f"  runs: train, demo and eval start in a preloaded process (pid {pid}), without their imports; "
            f"log: {home / preload.LOG}")


def _cmd_server_stop(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell import local_server

    server = local_server.stop(local_server.prefect_home(os.environ))
    out.print(f"stopped the Prefect server at {server.ui_url} (pid {server.pid})" if server
              else "no local Prefect server was running")
    return EXIT_OK


def _cmd_server_status(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell import local_server

    home = local_server.prefect_home(os.environ)
    server = local_server.recorded(home)
    if server is None:
        out.print(f"no local Prefect server running (PREFECT_HOME {home}); start one with `skillopt server "
                  "start`")
        return EXIT_FAILURE
    if args.api_url:
        out.print(server.api_url)
        return EXIT_OK
    state = "running" if local_server.healthy(server.api_url) else "starting or not answering"
    out.print(f"{state}: UI {server.ui_url}, API {server.api_url} (pid {server.pid}), database under {home}")
    out.print(_preload_line(home))
    return EXIT_OK


def _registry(args: argparse.Namespace):  # noqa: ANN202 - returns a SkillRegistry
    from pathlib import Path

    from skillopt.core.config import load_config
    from skillopt.run.registry import SkillRegistry

    if args.skills_dir:
        return SkillRegistry(Path(args.skills_dir))
    loaded = load_config(args.benchmark, config_file=args.config, overrides=args.override, env=os.environ)
    return SkillRegistry(Path(loaded.config.run.skills_dir))


def _cmd_skills_list(args: argparse.Namespace, out: _Output) -> int:
    registry = _registry(args)
    if args.benchmark is None:
        names = registry.benchmarks()
        if not names:
            out.print(f"no promoted skills in {registry.root}")
        for name in names:
            current = registry.current(name)
            last = registry.history(name)[-1]
            state = f"version {current.version} (sha {current.sha[:12]})" if current else "nothing promoted"
            out.print(f"{name:<24} {state:<32} last: {last.action} {last.at}")
        return EXIT_OK
    events = registry.history(args.benchmark)
    if not events:
        out.print(f"{args.benchmark}: no decisions recorded in {registry.folder(args.benchmark)}")
        return EXIT_OK
    current = events[-1].version
    for version in registry.versions(args.benchmark):
        origin = next((e for e in events if e.action == "promote" and e.version == version), None)
        marker = "*" if version == current else " "
        source = f"{origin.source} {origin.at}" if origin else ""
        out.print(f"{marker} version {version:<4} {source}")
    out.print("decisions:")
    for event in events:
        scores = ""
        if event.candidate_score is not None and event.incumbent_score is not None:
            scores = f" [{event.metric} {event.candidate_score:.4f} vs {event.incumbent_score:.4f}]"
        out.print(f"  {event.at} {event.action:<8} -> {event.version or '-'}{scores} {event.reason}"
                  + (f" (run {event.run_name})" if event.run_name else ""))
    return EXIT_OK


def _cmd_skills_show(args: argparse.Namespace, out: _Output) -> int:
    registry = _registry(args)
    if args.skill_version is not None:
        out.print(registry.version_text(args.benchmark, args.skill_version).rstrip("\n"))
        return EXIT_OK
    current = registry.current(args.benchmark)
    if current is None:
        raise SkillOptError(f"{args.benchmark}: nothing is promoted in {registry.folder(args.benchmark)}")
    out.print(current.text.rstrip("\n"))
    return EXIT_OK


def _cmd_skills_promote(args: argparse.Namespace, out: _Output) -> int:
    import json
    from pathlib import Path

    from skillopt.core.config import SkillSection
    from skillopt.run.skill_source import read_skill
    from skillopt.skill.folder import folder_files, load_skill

    registry = _registry(args)
    source = Path(args.source)
    carried: dict[str, bytes] = {}
    if source.is_dir() and (source / "SKILL.md").is_file() and not (source / "best_skill.md").is_file():
        path = source  # an Agent Skills folder
        skill = load_skill(source, max_file_bytes=args.max_file_bytes)
        text, carried = skill.text, skill.carried
    else:
        path = source / "best_skill.md" if source.is_dir() else source
        if not path.is_file():
            raise SkillOptError(f"skills promote: no skill at {path} (give a run directory, a skill folder "
                                "or a markdown file)")
        # Read as `skillopt eval --skill` reads it: a markdown file, UTF-8, no binary content, well-formed
        # front matter.
        text = read_skill(str(path), settings=SkillSection(max_file_bytes=args.max_file_bytes)).text
        if source.is_dir() and (source / "skill_carried").is_dir():
            carried = {relative: file.read_bytes()
                       for relative, file in folder_files(source / "skill_carried")}
    run_name = run_dir = candidate = None
    summary_path = source / "summary.json" if source.is_dir() else None
    if summary_path is not None and summary_path.is_file():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        run_name, run_dir = summary.get("run_name"), str(source)
        candidate = summary.get("scores", {}).get("best", {}).get("selection", {}).get("hard")
    event = registry.promote(args.benchmark, text, carried=carried, source=str(path),
                             reason=f"promoted by hand from {path}",
                             metric="hard" if candidate is not None else None, candidate_score=candidate,
                             run_name=run_name, run_dir=run_dir)
    promoted = registry.current(args.benchmark)
    out.print(f"{args.benchmark}: version {event.version} is current (was {event.previous or 'none'}); "
              f"{registry.folder(args.benchmark) / 'current.md'}"
              + (f"; as a skill folder: {promoted.folder}" if promoted and promoted.folder else ""))
    return EXIT_OK


def _cmd_skill_export(args: argparse.Namespace, out: _Output) -> int:
    from pathlib import Path

    from skillopt.run.skill_install import export_run_skill

    folder = export_run_skill(Path(args.run_dir), Path(args.to), force=args.force)
    out.print(f"skill: {folder}")
    return EXIT_OK


def _cmd_skill_install(args: argparse.Namespace, out: _Output) -> int:
    from pathlib import Path

    from skillopt.run.skill_install import install_run_skill

    project = Path(args.project) if args.project else None
    folder = install_run_skill(Path(args.run_dir), args.agent, project=project, force=args.force)
    out.print(f"installed for {args.agent}: {folder}")
    return EXIT_OK


def _cmd_skills_rollback(args: argparse.Namespace, out: _Output) -> int:
    registry = _registry(args)
    event = registry.rollback(args.benchmark)
    out.print(f"{args.benchmark}: {event.reason}; {registry.folder(args.benchmark) / 'current.md'}")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.run.report import write_report

    out.print(f"report: {write_report(args.run_dir, args.out)}")
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace, out: _Output) -> int:
    """``compare SKILL_A SKILL_B BENCHMARK`` (a paired comparison), or ``compare --runs RUN_DIR...`` (the run
    comparison page); RUN_DIR arguments without ``--runs`` still mean the latter when the last one is not a
    benchmark name."""
    from skillopt.shell.decision_cli import compare_mode

    mode = compare_mode(args.items, args.runs)
    if mode == "runs":
        paired_only = (("--split", args.split), ("--target", args.target), ("-c", args.config),
                       ("-o", args.override), ("--data", args.data), ("--run-name", args.run_name))
        given = [flag for flag, value in paired_only if value]
        if any(value for value in _cli_roles(args).values()):
            given.append("the model options")
        if given:
            raise SkillOptError(f"skillopt compare --runs: {', '.join(given)} apply to a paired comparison "
                                "(SKILL_A SKILL_B BENCHMARK); the runs page reads only the run directories")
        return _compare_runs(args.runs or args.items, args.out or "compare.html", out)
    from skillopt.shell.decision_cli import check_compare, compare_lines

    args.split = args.split or "test"
    skill_a, skill_b, benchmark = args.items
    overrides = [*_data_overrides(args.data), *args.override]
    check_compare(benchmark, skill_a, skill_b, config_file=args.config, overrides=overrides,
                  cli_roles=_cli_roles(args), split=args.split, target=args.target, env=os.environ)
    result = _run_flow("compare", out, prefect_server=_prefect_server(None, args), benchmark=benchmark,
                       skill_a=skill_a, skill_b=skill_b,
                       split=args.split, target=args.target, data=args.data, config_file=args.config,
                       overrides=args.override, run_name=args.run_name, cli_roles=_cli_roles(args))
    for line in compare_lines(result):
        out.print(line)
    if args.out:
        import shutil
        from pathlib import Path

        try:
            shutil.copyfile(Path(result["run_dir"]) / "compare.html", args.out)
        except OSError as error:
            raise SkillOptError(f"--out {args.out}: cannot write the page there ({error.strerror or error}); "
                                f"it is in {result['run_dir']}") from None
        out.print(f"page copied to {args.out}")
    return EXIT_OK


def _compare_runs(run_dirs: list[str], target: str, out: _Output) -> int:
    from pathlib import Path

    from skillopt.core.atomic import atomic_write_bytes
    from skillopt.run.report import load_run, render_compare

    runs = [load_run(path) for path in run_dirs]
    atomic_write_bytes(Path(target), render_compare(runs).encode("utf-8"))
    out.print(f"comparison of {len(runs)} runs: {target}")
    return EXIT_OK


def _cmd_transfer(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.shell.decision_cli import check_transfer, transfer_lines

    check_transfer(args.bench, args.skills, args.targets, config_file=args.config,
                   overrides=[*_data_overrides(args.data), *args.override], data=args.data,
                   cli_roles=_cli_roles(args), split=args.split, env=os.environ)
    result = _run_flow("transfer", out, prefect_server=_prefect_server(None, args), benchmarks=args.bench,
                       skills=args.skills, targets=args.targets,
                       split=args.split, data=args.data, config_file=args.config, overrides=args.override,
                       run_name=args.run_name, cli_roles=_cli_roles(args))
    for line in transfer_lines(result):
        out.print(line)
    return EXIT_OK


def _interrupted(out: _Output, guard: InterruptGuard | None) -> int:
    """Ctrl-C (or a dead API server) during a command: one line, no traceback."""
    if guard is None:
        out.err.write(f"{INTERRUPTED_MESSAGE}\n")
        return EXIT_INTERRUPTED
    if guard.report_once():
        if guard.reason:
            out.error(guard.reason)
        else:
            out.err.write(f"{INTERRUPTED_MESSAGE}\n")
    if guard.signals or guard.reason:
        # A real signal, or a stop for a reason (whose SIGINT may still be on its way): exit now rather than
        # wait for the model calls still in flight in worker threads.
        guard.force_exit()
    return guard.exit_code()


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the ``skillopt`` command and return its exit code."""
    out = _Output(Redactor.from_environment(), stdout or sys.stdout, stderr or sys.stderr)
    parser = _build_parser()
    args = parser.parse_args(argv)
    handlers = {
        ("config", "show"): _cmd_config_show,
        ("config", "validate"): _cmd_config_validate,
        ("schedule", None): _cmd_schedule,
        ("report", None): _cmd_report,
        ("compare", None): _cmd_compare,
        ("transfer", None): _cmd_transfer,
        ("train", None): _cmd_train,
        ("demo", None): _cmd_demo,
        ("eval", None): _cmd_eval,
        ("benchmarks", None): _cmd_benchmarks,
        ("backends", None): _cmd_backends,
        ("backends", "check"): _cmd_backends_check,
        ("serve", None): _cmd_serve,
        ("skill", "export"): _cmd_skill_export,
        ("skill", "install"): _cmd_skill_install,
        ("runs", None): _cmd_runs,
        ("runs", "logs"): _cmd_runs_logs,
        ("skills", "list"): _cmd_skills_list,
        ("skills", "show"): _cmd_skills_show,
        ("skills", "promote"): _cmd_skills_promote,
        ("skills", "rollback"): _cmd_skills_rollback,
        ("server", "start"): _cmd_server_start,
        ("server", "stop"): _cmd_server_stop,
        ("server", "status"): _cmd_server_status,
    }
    key = (args.command, getattr(args, "config_command", None) or getattr(args, "backends_command", None)
           or getattr(args, "skills_command", None) or getattr(args, "server_command", None)
           or getattr(args, "skill_command", None) or getattr(args, "runs_command", None))
    handler = handlers.get(key)
    if handler is None:
        if args.command in ("config", "server"):
            parser.parse_args([args.command, "--help"])
        parser.print_help(out.out)
        return EXIT_USAGE if args.command else EXIT_OK
    guard = InterruptGuard(out.err) if key in _RUN_COMMANDS else None
    if guard is not None:
        # A forced exit skips the exit handlers: stop the agent CLIs still running (they lead process groups
        # of their own, which the terminal's Ctrl-C does not reach) and remove their workspaces first.
        guard.add_cleanup(end_leftovers)
    try:
        with guard or nullcontext():
            out.guard = guard
            return handler(args, out)
    except SkillOptError as exc:
        if guard is not None and getattr(exc, "retryable", False):
            # A model endpoint that kept failing (down, overloaded, timing out) after its retries: not bad
            # input, and every call that answered is cached.
            out.error(f"{exc}; {RESUME_HINT} once it answers")
            return EXIT_FAILURE
        out.error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted(out, guard)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); stop quietly like other command-line tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        # An error raised while a Ctrl-C was being handled is the interrupt's: Prefect's crash handling of a
        # task run it had not finished creating raised "Task run is not set" in place of the
        # KeyboardInterrupt, and the command printed that traceback. Any other error is reported as it is.
        if guard is not None and guard.interrupted and _while_interrupted(exc):
            return _interrupted(out, guard)
        if guard is not None and guard.reason:  # raised while the run was being stopped for that reason
            return _interrupted(out, guard)
        from skillopt.flows.run import api_unreachable

        api = api_unreachable(exc)
        if api is not None:
            out.error(f"the Prefect API at {api} stopped answering and did not come back: "
                      f"{RESUME_HINT} once it is up")
            return EXIT_FAILURE
        raise
    except BaseException:
        # A stop for a reason from another thread (a lost Dask cluster) also raises where the run waited.
        if guard is not None and guard.reason:
            return _interrupted(out, guard)
        raise


def _while_interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while a ``KeyboardInterrupt`` was being handled."""
    seen: set[int] = set()
    cause: BaseException | None = error.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


def entry(*, hand_over: bool = True) -> NoReturn:
    """The console command: ``main``, the exit handlers, then leave at once.

    A run command is first offered to the preloaded process of ``skillopt server start``
    (``skillopt.shell.preload``), which runs it without this process's start-up imports; this process then
    only waits for it (``hand_over=False`` is that process's own call).

    Tearing the interpreter down after a run (freeing Prefect's, SQLAlchemy's and pydantic's objects, with
    no Python code left to run) takes seconds (``bench/README.md``). Nothing is lost by skipping it: the
    outputs are written and flushed, Prefect's queues were drained when the flow returned, and the exit
    handlers (Prefect's own clean-ups among them) still run here.
    """
    if hand_over:
        from skillopt.shell.preload import run_preloaded

        handed = run_preloaded(sys.argv[1:])
        if handed is not None:
            os._exit(handed)
    try:
        code = main()
    except BaseException:
        end_leftovers()  # before the traceback, and before the interpreter waits for worker threads
        raise
    atexit._run_exitfuncs()  # end_leftovers among them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
