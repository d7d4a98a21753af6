"""An endpoint's first structured call is its probe and runs alone; the calls that arrived while it ran then
go on side by side, not one after another (skillopt.llm.structured_output.StructuredModes.first_call)."""

from __future__ import annotations

import threading
import time

from skillopt.llm.structured_output import StructuredModes


def test_calls_that_waited_for_the_probe_then_run_side_by_side():
    modes = StructuredModes()
    lock = threading.Lock()
    inside: list[int] = []
    peak = [0]
    probe_in = threading.Event()
    release_probe = threading.Event()
    all_in = threading.Barrier(4, timeout=10)

    def call(probe: bool) -> None:
        with modes.first_call("openai_compatible|http://x|m"):
            with lock:
                inside.append(1)
                peak[0] = max(peak[0], len(inside))
            if probe:
                probe_in.set()
                assert release_probe.wait(10)
            else:
                all_in.wait()  # the three waiting calls are inside at once, or this times out
            with lock:
                inside.pop()

    first = threading.Thread(target=call, args=(True,))
    first.start()
    assert probe_in.wait(10)
    others = [threading.Thread(target=call, args=(False,)) for _ in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.2)
    assert peak[0] == 1  # nothing passes the probe while it runs
    release_probe.set()
    all_in.wait()
    for thread in [first, *others]:
        thread.join(10)
    assert peak[0] == 3 and not all_in.broken
