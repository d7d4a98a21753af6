"""A child started in its own process group is stopped with every process it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from skillopt.sandbox.process_group import end_group, own_group, run_in_group
from tests.processes import alive

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")

# A parent that starts a long-sleeping grandchild, prints its pid and then sleeps itself.
PARENT = ("import subprocess, sys, time; "
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
          "print(child.pid, flush=True); time.sleep(120)")


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_ending_the_group_stops_the_leader_and_its_grandchild():
    process = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                               **own_group())
    grandchild = int(process.stdout.readline())
    assert alive(grandchild)
    code = end_group(process, grace_s=1.0)
    assert code != 0  # stopped by a signal, not finished
    assert _gone_soon(grandchild)
    process.stdout.close()


def test_a_timeout_in_run_in_group_stops_the_grandchild_too(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = PARENT.replace("print(child.pid, flush=True)",
                            f"open({str(pid_file)!r}, 'w').write(str(child.pid))")
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group([sys.executable, "-c", script], timeout_s=2.0, grace_s=0.5)
    assert _gone_soon(int(pid_file.read_text()))


def test_run_in_group_returns_the_output_and_exit_code_of_a_finished_child():
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    done = run_in_group([sys.executable, "-c", code], timeout_s=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
