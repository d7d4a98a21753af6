"""Two skillopt source trees side by side on one row of ``bench/e2e.py``, runs interleaved in one bench run.

On a shared two-core machine the same commit's batch-10 phase ratio moves by 0.1x between bench runs minutes
apart, as much as most single changes are worth. Interleaving the runs of two trees against one latency world
puts both under the same drift: each tree gets its own ``PREFECT_HOME`` and its own ``skillopt server start``
(the server and the preloaded process of that tree's code), and their runs alternate, A then B, ``--repeat``
times. Reported per tree: every run's phase ratio (model phase / its critical path), exit after the last call
and end to end, their medians, and B's phase ratio over A's per pair.

    python bench/ab.py --row batch10 --repeat 7 <tree A> <tree B> [--out bench/results/ab.json]

A tree is a source checkout (``git worktree add <folder> <commit>``, or a clone) run with this Python; its own
``bench/`` is not used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

from bench import e2e  # noqa: E402
from bench.latency_world import LatencyWorld  # noqa: E402

ROWS = {"tiny": e2e.TINY, "batch10": e2e.BATCH10, "batch40": e2e.BATCH40}


def tree_env(tree: Path, home: Path) -> dict[str, str]:
    """The bench's user environment (``e2e.skillopt_env``) with ``tree``'s code first on the path."""
    env = e2e.skillopt_env(home)
    env["PYTHONPATH"] = str(tree)
    return env


def server(env: dict[str, str], command: str) -> None:
    done = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "server", command], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    if command == "start" and done.returncode != 0:
        raise RuntimeError(f"skillopt server start failed:\n{done.stdout}\n{done.stderr}")


def label(tree: Path) -> str:
    """The tree's commit (``git describe``), so results name no folder of this machine."""
    described = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"],
                               capture_output=True, text=True, check=False).stdout.strip()
    return described or tree.name


def side_by_side(config: e2e.Config, trees: list[Path], repeat: int, workdir: Path) -> dict[str, Any]:
    envs = [tree_env(tree, workdir / f"home-{index}") for index, tree in enumerate(trees)]
    names = [f"{'AB'[index] if index < 2 else index}: {label(tree)}" for index, tree in enumerate(trees)]
    rows: list[list[dict[str, Any]]] = [[] for _ in trees]
    with LatencyWorld(latency_s=config.latency) as world:
        try:
            for env in envs:
                server(env, "start")
            for run in range(repeat):
                for index, env in enumerate(envs):
                    cwd = workdir / f"{config.label}-{index}-{run}"
                    timeline = e2e.timed(config.label, e2e.train_argv(config, world, "e2e"), world=world,
                                         latency=config.latency, env=env, cwd=cwd)
                    if timeline.returncode != 0:
                        raise RuntimeError(f"{names[index]}: skillopt exited {timeline.returncode}; "
                                           f"see {cwd}")
                    row = e2e.with_path(timeline, cwd / "runs" / "e2e", config).row()
                    rows[index].append(row)
                    print(f"{names[index]}: phase {row['phase_ratio']}x, exit after last call "
                          f"{row['exit_after_last_call_s']} s, end to end {row['exit_s']} s", flush=True)
        finally:
            for env in envs:
                server(env, "stop")

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        keys = ("phase_ratio", "exit_after_last_call_s", "exit_s", "first_call_s")
        return {"runs": runs, "median": {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}}

    result: dict[str, Any] = {name: summary(runs) for name, runs in zip(names, rows, strict=True)}
    if len(trees) == 2:
        pairs = [b["phase_ratio"] / a["phase_ratio"] for a, b in zip(rows[0], rows[1], strict=True)]
        result["phase_b_over_a"] = {"pairs": [round(p, 3) for p in pairs],
                                    "median": round(statistics.median(pairs), 3),
                                    "b_lower_in": f"{sum(p < 1 for p in pairs)} of {len(pairs)}"}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="source trees (A, then B)")
    parser.add_argument("--row", choices=sorted(ROWS), default="batch10")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    missing = [str(t) for t in args.trees if not (t / "skillopt" / "shell" / "cli.py").is_file()]
    if missing:
        parser.error(f"not a skillopt source tree (no skillopt/shell/cli.py): {', '.join(missing)}")
    trees = [t.resolve() for t in args.trees]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="skillopt-ab-") as tmp:
        result = side_by_side(ROWS[args.row], trees, args.repeat, Path(tmp))
    result["row"], result["when"] = args.row, datetime.now().isoformat(timespec="seconds")
    result["load_before"] = load_before
    for name, value in result.items():
        if isinstance(value, dict) and "median" in value and "runs" in value:
            print(f"{name}: median {value['median']}")
    if "phase_b_over_a" in result:
        print(f"phase B / A: {result['phase_b_over_a']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
