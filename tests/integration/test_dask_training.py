"""Training spreadsheetbench (sandboxed code) with ``run.task_runner: dask``: the rollouts run in Dask worker
processes, the run ends with the same best skill and scores as on the thread pool, and a worker killed mid-run
costs only its in-flight calls.

Every run is the real command (``python -m skillopt.shell.cli train spreadsheetbench --data ... --backend
scripted``) in a subprocess against the session's Prefect server. The data is the fixture's three tasks copied
into several items per split, so that each evaluation has rollouts for both workers and training sees
failures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "spreadsheetbench"
#: Copies per split of the fixture's tasks: 59001 and 59002 are solved by the scripted target, 59003-1 is not.
SPLITS = {
    "train": {"59001": 2, "59003-1": 2},
    "val": {"59002": 2, "59003-1": 2},
    "test": {"59001": 1, "59003-1": 1},
}
TRAIN = ["-o", "train.epochs=2", "-o", "train.batch_size=4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spreadsheetbench")
    originals = {item["id"]: item for split in ("train", "val", "test")
                 for item in json.loads((FIXTURES / split / "items.json").read_text())}
    for split, copies in SPLITS.items():
        items = []
        for source, count in copies.items():
            for n in range(count):
                item_id = f"{split}{n}-{source}"
                shutil.copytree(FIXTURES / "spreadsheet" / source, root / "spreadsheet" / item_id)
                items.append(
                    {**originals[source], "id": item_id, "spreadsheet_path": f"spreadsheet/{item_id}"}
                )
        (root / split).mkdir()
        (root / split / "items.json").write_text(json.dumps(items, indent=1))
    shutil.copy(FIXTURES / "scripted_rules.yaml", root)  # the scripted target's replies, keyed by instruction
    return root


def start(cwd: Path, api: str, data: Path, *overrides: str) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "skillopt.shell.cli", "train", "spreadsheetbench", "--data", str(data),
               "--backend", "scripted", "--run-name", "sb", *TRAIN, *overrides]
    # as a user runs it: without the PREFECT_LOGGING_LEVEL the test suite sets
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_LEVEL"}, "PREFECT_API_URL": api}
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=1500)
    assert process.returncode == 0, output[-4000:]
    return output


def run_dir(cwd: Path) -> Path:
    return cwd / "runs" / "sb"


def outcome(folder: Path) -> dict:
    """What must not depend on where the rollouts ran: the best skill, the scores, the gate's decisions and
    every evaluation's rows (hard and soft per item)."""
    summary = json.loads((folder / "summary.json").read_text())
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    evaluations = {}
    for results in sorted((folder / "eval").glob("*/results.jsonl")):
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        evaluations[results.parent.name] = {r["id"]: (r["hard"], r["soft"]) for r in rows}
    return {"best_skill": (folder / "best_skill.md").read_text(), "scores": summary["scores"],
            "decisions": [(r["kind"], r.get("step"), r.get("decision")) for r in history],
            "evaluations": evaluations}


def rollout_pids(folder: Path) -> list[int]:
    """The process of every rollout row the run recorded (evaluations and the steps' trajectories)."""
    pids = []
    for path in [*folder.glob("eval/*/results.jsonl"), *folder.glob("steps/*/trajectories.jsonl")]:
        pids += [json.loads(line).get("worker_pid") for line in path.read_text().splitlines()]
    return pids


def paid_calls(folder: Path) -> list[tuple]:
    """Every model call the run paid for (not served from a cache), by what it asked."""
    records = [json.loads(line) for line in (folder / "usage.jsonl").read_text().splitlines() if line.strip()]
    return [(r["role"], r["stage"], json.dumps(r["tags"], sort_keys=True)) for r in records
            if r["status"] == "ok" and not r["cache_hit"]]


def reply_store_hits(folder: Path) -> list[tuple]:
    """Calls answered from the reply store (a hit there carries its request's tags), by what they asked."""
    records = [json.loads(line) for line in (folder / "usage.jsonl").read_text().splitlines() if line.strip()]
    return [(r["role"], r["stage"], json.dumps(r["tags"], sort_keys=True)) for r in records
            if r["status"] == "ok" and r["cache_hit"] and r["tags"]]


@pytest.fixture(scope="module")
def reference(prefect_api: str, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same training on the thread pool."""
    cwd = tmp_path_factory.mktemp("threads")
    process = start(cwd, prefect_api, data)
    finish(process)
    assert set(rollout_pids(run_dir(cwd))) == {process.pid}
    return run_dir(cwd)


def test_a_local_dask_cluster_trains_to_the_same_skill_with_rollouts_in_its_worker_processes(
        prefect_api, data, reference, tmp_path):
    pytest.importorskip("prefect_dask")
    process = start(tmp_path, prefect_api, data, "-o", "run.task_runner=dask", "-o", "run.dask_n_workers=2",
                    "-o", "run.dask_threads_per_worker=1")
    output = finish(process)
    # the run's story, without distributed's INFO lines on every client, worker and stream, and without the
    # worker processes' INFO lines on every task run
    assert "distributed." not in output and "Task run" not in output, output[-4000:]
    folder = run_dir(tmp_path)
    assert outcome(folder) == outcome(reference)
    pids = Counter(rollout_pids(folder))
    assert None not in pids and process.pid not in pids, pids
    assert len(pids) >= 2, f"the rollouts ran in {len(pids)} worker process(es): {pids}"
    assert Counter(paid_calls(folder)) == Counter(paid_calls(reference))


def fixture_target_server(server) -> None:
    """The fake answers each chat completion as the fixture's scripted target would, behind real HTTP: unlike
    the scripted backend (free and deterministic, so never stored), an HTTP target's replies go to the reply
    store."""
    from skillopt.benchmarks.base import load_benchmark
    from skillopt.llm.base import BackendContext
    from skillopt.llm.chat import ChatRequest, assistant, system, user
    from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set
    from tests.fakes.benchmark_target import fixture_rules
    from tests.fakes.http_fakes import ok

    rules = fixture_rules(load_benchmark("spreadsheetbench"))
    backend = ScriptedBackend(
        resolve_rule_set(None, BackendContext(scripted_target_rules=rules), where="test"), role="target"
    )
    builders = {"system": system, "user": user, "assistant": assistant}

    def reply(request):
        messages = [builders[m["role"]](m["content"]) for m in request.body["messages"]]
        return ok(text=backend.attempt(ChatRequest(messages=messages, stage="rollout"), timeout_s=30).text)

    server.handler = reply


def test_a_worker_killed_mid_run_costs_only_its_in_flight_calls(prefect_api, data, reference, tmp_path):
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("prefect_dask")
    from tests.fakes.http_fakes import FakeOpenAIServer

    # The killed worker cannot remove its rollout's scratch folders: they stay under the test's folder.
    (worker_temp := tmp_path / "worker-tmp").mkdir()
    with FakeOpenAIServer() as server, \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None, env={"TMPDIR": str(worker_temp)}) as cluster, \
            distributed.Client(cluster) as client:
        fixture_target_server(server)
        process = start(tmp_path, prefect_api, data, "-o", "run.task_runner=dask",
                        "-o", f"run.dask_address={cluster.scheduler_address}",
                        "-o", "model.target.backend=openai_compatible",
                        "-o", f"model.target.base_url={server.openai_base_url}",
                        "-o", "model.target.model=fixture-model")
        victim = None
        deadline = time.monotonic() + 900
        while victim is None and process.poll() is None and time.monotonic() < deadline:
            busy = [address for address, keys in client.processing().items() if keys]
            if busy and server.calls("/v1/chat/completions"):  # a worker is rolling out, after some replies
                victim = client.run(os.getpid, workers=[busy[0]])[busy[0]]
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.05)
        assert victim is not None, "the run never had a rollout in flight on a worker"
        finish(process)
    folder = run_dir(tmp_path)
    assert outcome(folder) == outcome(reference)
    paid = Counter(paid_calls(folder))
    assert [call for call, n in paid.items() if n > 1] == [], "a completed call was paid twice"
    assert set(paid) <= set(paid_calls(reference))
    # The killed worker's one call in flight may have had its reply stored and not yet its usage line (the
    # store is written first, so that a kill never pays twice): its retry is then served from the reply store.
    missing = set(paid_calls(reference)) - set(paid)
    assert len(missing) <= 1 and missing <= set(reply_store_hits(folder)), missing
    assert process.pid not in set(rollout_pids(folder))
