"""Does the preloaded process of ``skillopt server start`` pay? Whole commands, start to exit, side by side.

With one local server running (its own ``PREFECT_HOME``), the same ``skillopt demo --no-cache`` runs
alternately handed to the preloaded process (A) and in a process of its own (B, ``SKILLOPT_NO_PRELOAD=1``),
``--repeat`` pairs after one warm-up run of each. Reported: every run's wall time from the command's start to
its exit, the medians, and B - A per pair.

    python bench/preload_ab.py --repeat 6 [--out bench/results/preload_ab.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

from bench import e2e  # noqa: E402


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skillopt-preload-ab-") as folder:
        work = Path(folder)
        env = e2e.skillopt_env(work / "prefect-home")
        cli = [sys.executable, "-m", "skillopt.shell.cli"]
        subprocess.run([*cli, "server", "start"], env=env, cwd=work, check=True, capture_output=True,
                       timeout=300)
        try:
            envs = {"preload": env, "no_preload": {**env, "SKILLOPT_NO_PRELOAD": "1"}}
            runs: dict[str, list[float]] = {name: [] for name in envs}
            for index in range(args.repeat + 1):
                for name, run_env in envs.items():
                    wall = timed([*cli, "demo", "--no-cache", "--run-name", f"{name}-{index}"], run_env, work)
                    if index:  # the first pair warms the server and the file cache
                        runs[name].append(round(wall, 3))
                        print(f"{name}: {wall:.2f} s", flush=True)
        finally:
            subprocess.run([*cli, "server", "stop"], env=env, cwd=work, check=False, capture_output=True,
                           timeout=120)
    saved = [round(b - a, 3) for a, b in zip(runs["preload"], runs["no_preload"], strict=True)]
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"), "command": "skillopt demo --no-cache",
        "runs_s": runs, "median_s": {name: statistics.median(walls) for name, walls in runs.items()},
        "no_preload_minus_preload_s": {"pairs": saved, "median": statistics.median(saved)},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
