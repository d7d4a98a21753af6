"""A run's artifacts go to the Prefect API through one client shared by the publisher's threads (Prefect's
``create_*_artifact`` functions open a new client, with a new TLS context and connection, per artifact),
attached to the flow run that published them, in Prefect's own formats."""

from __future__ import annotations

import json
import threading
import uuid

import prefect.artifacts
import prefect.client.orchestration
from prefect import flow
from prefect.context import get_run_context

from bench.run import api_post
from skillopt.tasks.artifacts import Publisher


def test_one_client_sends_every_artifact_of_a_publisher_to_its_flow_run(prefect_settings, monkeypatch):
    opened: list[str] = []
    lock = threading.Lock()

    def counted(original):
        def get_client(*args, **kwargs):
            if threading.current_thread().name.startswith("skillopt-artifacts"):
                with lock:
                    opened.append(threading.current_thread().name)
            return original(*args, **kwargs)
        return get_client

    for module in (prefect.client.orchestration, prefect.artifacts):  # where skillopt and Prefect look it up
        monkeypatch.setattr(module, "get_client", counted(module.get_client))
    tag = uuid.uuid4().hex[:8]

    @flow(name="artifact-client")
    def publish() -> str:
        publisher = Publisher(lanes=3)
        publisher.send("table", publisher.table, key=f"t-{tag}", table=[{"a": 1, "b": float("nan")}],
                       description="a table")
        publisher.send("table", publisher.table, key=f"t-{tag}", table=[{"a": 2, "b": 3}])
        publisher.send("diff", publisher.markdown, key=f"m-{tag}", markdown="# heading")
        publisher.send("report", publisher.link, key=f"l-{tag}", link="file:///r.html", link_text="report")
        publisher.send_progress(40.0, "step 2 of 5", f"p-{tag}")
        publisher.close(timeout_s=30)  # the first progress version is created before the update is queued
        again = Publisher(lanes=1)
        again.progress_id = publisher.progress_id
        again.send_progress(100.0, "finished", f"p-{tag}")
        again.close(timeout_s=30)
        return str(get_run_context().flow_run.id)

    flow_run_id = publish()
    assert len(opened) == 2, opened  # one client per publisher, not one per artifact (there were six)

    found = api_post(prefect_settings, "/artifacts/filter",
                 {"artifacts": {"key": {"any_": [f"{k}-{tag}" for k in "tmlp"]}}})
    by_key: dict[str, list[dict]] = {}
    for artifact in sorted(found, key=lambda a: a["created"]):
        by_key.setdefault(artifact["key"].split("-")[0], []).append(artifact)
    assert {k: len(v) for k, v in by_key.items()} == {"t": 2, "m": 1, "l": 1, "p": 1}
    assert all(a["flow_run_id"] == flow_run_id for a in found)
    tables = [json.loads(a["data"]) for a in by_key["t"]]
    assert tables == [[{"a": 1, "b": None}], [{"a": 2, "b": 3}]]  # NaN sanitised as Prefect does
    assert by_key["t"][0]["type"] == "table" and by_key["t"][0]["description"] == "a table"
    assert by_key["m"][0]["type"] == "markdown" and by_key["m"][0]["data"] == "# heading"
    assert by_key["l"][0]["data"] == "[report](file:///r.html)"
    (progress,) = by_key["p"]
    assert progress["type"] == "progress" and float(progress["data"]) == 100.0  # updated in place
    assert progress["description"] == "finished"
