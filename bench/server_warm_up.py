"""The first API request a new Prefect server answers, with and without ``skillopt``'s warm-up.

The server's web framework builds the request handling of its API routes on the first request routed
through them, so the first run after a server start paid for it inside its own start-up (in its first
request, the client's API version check). ``skillopt server start`` and the temporary server now send
one warm-up request (``skillopt.local_server.warm_up``) before a run needs the server.

Per trial, a new server (``python -m skillopt.prefect_server server start`` on a free port, a new
``PREFECT_HOME``) is started and, once healthy:

- **cold**: the time of its first ``GET /api/admin/version``;
- **warmed**: ``warm_up`` first (its own time is reported too), then the same request.

Trials alternate cold and warmed servers; medians and the ratio cold / warmed are printed as JSON.

    python bench/server_warm_up.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import free_port  # noqa: E402
from skillopt.local_server import healthy, warm_up  # noqa: E402


def _timed_get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return time.perf_counter() - start


def trial(warmed: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="skillopt-warm-up-") as home:
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false")
        process = subprocess.Popen(
            [sys.executable, "-m", "skillopt.prefect_server", "server", "start", "--host", "127.0.0.1",
             "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while not healthy(api):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Prefect server did not start")
                time.sleep(0.25)
            figures: dict[str, float] = {}
            if warmed:
                start = time.perf_counter()
                warm_up(api)
                figures["warm_up_s"] = time.perf_counter() - start
            figures["first_request_s"] = _timed_get(f"{api}/admin/version")
            return figures
        finally:
            os.killpg(process.pid, 15)
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="servers of each kind (alternated)")
    args = parser.parse_args()
    cold, warmed = [], []
    for _ in range(args.trials):
        cold.append(trial(warmed=False))
        warmed.append(trial(warmed=True))
    cold_s = statistics.median(t["first_request_s"] for t in cold)
    warmed_s = statistics.median(t["first_request_s"] for t in warmed)
    print(json.dumps({
        "trials": args.trials,
        "cold_first_request_s": round(cold_s, 4),
        "warmed_first_request_s": round(warmed_s, 4),
        "warm_up_s": round(statistics.median(t["warm_up_s"] for t in warmed), 4),
        "cold_over_warmed": round(cold_s / warmed_s, 1),
        "runs": {"cold": cold, "warmed": warmed},
    }, indent=2))


if __name__ == "__main__":
    main()
