"""The interpreter time one model call costs skillopt's client, against a zero-latency world.

Every call of a wave builds its request, sends it, reads, stores and records its reply on the run's one
interpreter: what one call costs there is paid ten times over at the start and at the end of a wave of ten,
one call after the other, and the wave's last request leaves (and its last reply is in) that much later.

Per tree (a source checkout; default: this one), in a fresh process each time: a run of the demo benchmark
is built on the ``openai_compatible`` backend pointed at the latency world with no latency (its own
process), and ``--calls`` distinct requests go through the target's ``RoleClient.chat`` one after the
other: the whole path of a rollout's call (reply store, limiter, retry loop, SDK, usage ledger). Reported:
the process's CPU time per call, and the same for a bare POST with the SDK's HTTP library (the floor no
client code can go under). Trees alternate, ``--rounds`` times; medians per tree, and B / A per round.

    python bench/call_cpu.py --calls 300 --rounds 3 [<tree A> <tree B>] [--out bench/results/call-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def measure(calls: int) -> dict[str, Any]:
    """In this process (its ``sys.path`` chooses the tree): CPU per call through the client and bare."""
    world = subprocess.Popen([sys.executable, str(BENCH / "latency_world.py"), "--latency", "0"],
                             stdout=subprocess.PIPE, text=True, cwd=BENCH)
    try:
        assert world.stdout is not None
        found = re.search(r"(http://\S+)", world.stdout.readline())
        if found is None:
            raise RuntimeError("the latency world did not say its address")
        url = found.group(1)
        sys.path.insert(1, str(ROOT))
        from bench.run import train_overrides
        from skillopt.core.config import load_config
        from skillopt.llm.chat import ChatRequest, system, user
        from skillopt.llm.http_common import http_library
        from skillopt.run.assembly import Run, RunSpec

        os.chdir(tempfile.mkdtemp(prefix="call-cpu-"))
        overrides = train_overrides(url, workers=1, batch=1, train_size=4, val_size=2, epochs=1, seed=1,
                                    eval_test=False)
        loaded = load_config("demo", overrides=overrides, env=os.environ)
        run = Run.build(RunSpec.create(loaded, run_name="call-cpu"))
        client = run.clients.target

        def request(index: int) -> ChatRequest:
            return ChatRequest(messages=[system("Answer the question in one line. " * 40),
                                         user(f"Question {index}: what is {index} + 2?")],
                               stage="rollout", max_tokens=64)

        for index in range(20):  # connections, lazy imports, first-use caches
            client.chat(request(-1 - index))
        cpu, wall = time.process_time(), time.perf_counter()
        for index in range(calls):
            client.chat(request(index))
        client_cpu, client_wall = time.process_time() - cpu, time.perf_counter() - wall

        import openai

        library = http_library(openai)
        assert library is not None
        body = {"model": "demo-target", "messages": [{"role": "user", "content": "hi"}]}
        with library.Client() as http:
            for index in range(20):
                http.post(f"{url}/chat/completions", json={**body, "seed": -1 - index})
            cpu = time.process_time()
            for index in range(calls):
                http.post(f"{url}/chat/completions", json={**body, "seed": index})
            bare_cpu = time.process_time() - cpu
        return {"client_cpu_ms": round(client_cpu / calls * 1000, 3),
                "client_wall_ms": round(client_wall / calls * 1000, 3),
                "bare_post_cpu_ms": round(bare_cpu / calls * 1000, 3)}
    finally:
        world.terminate()
        world.wait(timeout=10)


def run_tree(tree: Path, calls: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL",)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(tree), env.get("PYTHONPATH", "")] if p)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--calls",
                           str(calls)], env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="interpreter time per model call of skillopt's client")
    parser.add_argument("trees", nargs="*", type=Path, help="source checkouts (default: this one)")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, str(args.child))
        print(json.dumps(measure(args.calls)))
        return 0
    sys.path.insert(1, str(ROOT))  # here, not at import: a measuring process imports skillopt from its tree
    from bench.ab import label  # a tree's commit, never its folder

    trees = [tree.resolve() for tree in args.trees] or [ROOT]
    rows: dict[str, list[dict[str, Any]]] = {str(tree): [] for tree in trees}
    for number in range(args.rounds):
        for tree in trees if number % 2 == 0 else list(reversed(trees)):
            row = run_tree(tree, args.calls)
            rows[str(tree)].append(row)
            print(f"round {number + 1}: {label(tree)}: {row}", flush=True)
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "calls": args.calls, "trees": {}}
    for tree in trees:
        runs = rows[str(tree)]
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        result["trees"][label(tree)] = {"runs": runs, "median": medians}
        print(f"{label(tree)}: median {medians}")
    if len(trees) == 2:
        first, second = (rows[str(tree)] for tree in trees)
        ratios = [round(b["client_cpu_ms"] / a["client_cpu_ms"], 3)
                  for a, b in zip(first, second, strict=True)]
        result["client_cpu_b_over_a"] = {"rounds": ratios, "median": statistics.median(ratios)}
        print(f"client CPU per call, B / A: {ratios} (median {statistics.median(ratios)})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
