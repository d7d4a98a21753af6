"""The first API request a new Prefect server answers, with and without ``skillopt``'s warm-up.

The server's web framework builds the request handling of its API routes on the first request routed
through them, so the first run after a server start paid for it inside its own start-up (in its first
request, the client's API version check). ``skillopt server start`` and the temporary server now send
one warm-up request (``skillopt.shell.local_server.warm_up``) before a run needs the server.

Per trial, a new server (``bench.run.prefect_server``: ``python -m skillopt.shell.prefect_server server
start`` on a free port, a new ``PREFECT_HOME``) is started and, once healthy:

- **cold**: the time of its first ``GET /api/admin/version``;
- **warmed**: ``warm_up`` first (its own time is reported too), then the same request.

Trials alternate cold and warmed servers; medians and the ratio cold / warmed are printed as JSON.

    python bench/server_warm_up.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import prefect_server  # noqa: E402
from skillopt.shell.local_server import warm_up  # noqa: E402


def _timed_get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return time.perf_counter() - start


def trial(warmed: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="skillopt-warm-up-") as workdir, \
            prefect_server(Path(workdir)) as api:  # healthy: it has answered GET /api/health
        figures: dict[str, float] = {}
        if warmed:
            start = time.perf_counter()
            warm_up(api)
            figures["warm_up_s"] = time.perf_counter() - start
        figures["first_request_s"] = _timed_get(f"{api}/admin/version")
        return figures


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
