"""The epoch subflow runs without flow-run heartbeats; the top-level flow keeps its own.

A sync subflow waits up to 1 s for its heartbeat thread to stop (measured with bench/run.py: it held the first
step of every epoch after the first), and the top-level ``skill-train`` run's heartbeats already show
liveness.
"""

from __future__ import annotations

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

import skillopt.flows.train as train


def test_the_epoch_subflow_is_called_with_heartbeats_off_and_they_come_back(monkeypatch):
    seen = {}

    def fake_epoch(ctx, state, epoch):
        seen[epoch] = PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value()
        return state

    monkeypatch.setattr(train, "skill_epoch", fake_epoch)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}):
        assert train.run_epoch(None, "state", 2) == "state"
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 60
    assert seen == {2: None}
