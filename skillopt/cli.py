"""The ``skillopt`` command.

Every sub-command prints through a ``Redactor``, so no secret loaded in the process reaches the
terminal; user errors (``SkillOptError``) print one clear message and exit 2, without a traceback.
Heavy imports (Prefect, SDKs) stay inside the commands that need them, so ``skillopt --help`` and
``skillopt config show`` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import yaml

from skillopt import __version__
from skillopt.errors import SkillOptError
from skillopt.redact import Redactor

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Output:
    """stdout and stderr, both redacted."""

    def __init__(self, redactor: Redactor, out: TextIO, err: TextIO) -> None:
        self.redactor = redactor
        self.out = out
        self.err = err

    def print(self, text: str = "") -> None:
        self.out.write(self.redactor(text) + "\n")

    def error(self, text: str) -> None:
        self.err.write(self.redactor(f"error: {text}") + "\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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

    schedule = commands.add_parser(
        "schedule",
        help="print the edit budget (learning rate) of every step",
        description="Print the edit budget of every step, one line 'step <s>: <budget>' each, then a summary.",
    )
    schedule.add_argument("--kind", choices=["constant", "linear", "cosine"], default="cosine")
    schedule.add_argument("--max", dest="max_budget", type=int, default=4, help="L_max (optimizer.learning_rate)")
    schedule.add_argument(
        "--min", dest="min_budget", type=int, default=2, help="L_min (optimizer.min_learning_rate)"
    )
    schedule.add_argument("--steps", type=int, required=True, help="total steps T = epochs * steps per epoch")
    return parser


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", metavar="FILE", help="your YAML file, merged over the benchmark's")
    parser.add_argument(
        "-o", "--override", action="append", default=[], metavar="KEY=VALUE",
        help="override one value, e.g. -o optimizer.learning_rate=8 (repeatable, applied in order)",
    )


def _cmd_config_show(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.config import DEFAULT_SOURCE, credential_status, dump_config, flatten, load_config

    loaded = load_config(args.benchmark, config_file=args.config, overrides=args.override, env=os.environ)
    data = dump_config(loaded)
    out.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100).rstrip())
    if args.no_sources:
        return EXIT_OK
    out.print()
    out.print("# where each value came from (every value not listed: default)")
    for dotted in flatten(data):
        source = loaded.source_of(dotted)
        if source != DEFAULT_SOURCE:
            out.print(f"# {dotted}: {source}")
    out.print("# credentials (presence only; values are never read into the config)")
    for role, status in credential_status(loaded.config, os.environ).items():
        out.print(f"# model.{role}: {status}")
    return EXIT_OK


def _cmd_config_validate(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.config import load_config_file

    loaded = load_config_file(args.file, overrides=args.override, env=os.environ)
    name = loaded.config.benchmark.name
    suffix = f" (benchmark: {name})" if name else ""
    out.print(f"{args.file}: valid{suffix}")
    return EXIT_OK


def _cmd_schedule(args: argparse.Namespace, out: _Output) -> int:
    from skillopt.schedule import EditBudgetSchedule

    schedule = EditBudgetSchedule.from_config(args.kind, args.max_budget, args.min_budget, args.steps)
    budgets = schedule.budgets()
    for step, budget in enumerate(budgets, start=1):
        out.print(f"step {step}: {budget}")
    counts = schedule.summary()
    parts = ", ".join(f"{n} step{'s' if n != 1 else ''} of {b}" for b, n in counts.items())
    out.print(f"# {args.kind} {args.max_budget}->{args.min_budget} over {args.steps} steps: {parts}; "
              f"{sum(budgets)} edits at most")
    return EXIT_OK


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the ``skillopt`` command and return its exit code."""
    out = _Output(Redactor.from_environment(), stdout or sys.stdout, stderr or sys.stderr)
    parser = _build_parser()
    args = parser.parse_args(argv)
    handlers = {
        ("config", "show"): _cmd_config_show,
        ("config", "validate"): _cmd_config_validate,
        ("schedule", None): _cmd_schedule,
    }
    key = (args.command, getattr(args, "config_command", None))
    handler = handlers.get(key)
    if handler is None:
        if args.command == "config":
            parser.parse_args(["config", "--help"])
        parser.print_help(out.out)
        return EXIT_USAGE if args.command else EXIT_OK
    try:
        return handler(args, out)
    except SkillOptError as exc:
        out.error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); stop quietly like other command-line tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
