"""Ctrl-C handling without Prefect: a real process, real signals, a worker thread stuck in a "model call"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from skillopt.shell.interrupt import INTERRUPTED_MESSAGE

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for a run: the main thread waits on a worker thread that would take a minute (a slow
# model call Python cannot cancel), inside the guard, and reports the interrupt the way the CLI does.
_RUN = textwrap.dedent("""
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    from skillopt.shell.interrupt import InterruptGuard

    guard = InterruptGuard(sys.stderr, grace_s={grace})
    guard.add_cleanup(lambda: sys.stderr.write("cleanup ran\\n"))
    with guard:
        try:
            with ThreadPoolExecutor(max_workers=1) as pool:  # leaving it waits for the call in flight
                call = pool.submit(time.sleep, {work})
                print("ready", flush=True)
                call.result()
        except KeyboardInterrupt:
            if guard.report_once():
                sys.stderr.write("reported by the main thread\\n")
    sys.exit(guard.exit_code())
""")


def _start(grace: float, work: float = 60) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", _RUN.format(grace=grace, work=work)], cwd=ROOT,
                               text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_first_sigint_exits_130_after_the_grace_period_although_a_worker_is_still_busy():
    process = _start(grace=0.5)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    print(f"exited {time.monotonic() - started:.2f} s after SIGINT")
    assert process.returncode == 130
    # The main thread is still waiting for the pool to shut down: the deadline reports and exits.
    assert err.splitlines() == [INTERRUPTED_MESSAGE, "cleanup ran"]


def test_a_reply_that_lands_while_the_exit_cleans_up_logs_nothing_after_the_resume_line():
    """After the interrupt's line the exit still runs its clean-ups (a report to the API server can take a
    while); a model call that answers meanwhile must not log its warning below that line, which is the last
    thing the user reads."""
    script = textwrap.dedent("""
        import logging, sys, threading, time
        from skillopt.shell.interrupt import InterruptGuard

        logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")

        def late_reply():
            time.sleep(0.8)
            logging.getLogger("skillopt.llm").warning("no price known for the model's reply")

        guard = InterruptGuard(sys.stderr, grace_s=0.2)
        guard.add_cleanup(lambda: (time.sleep(1.5), sys.stderr.write("cleanup ran\\n")))
        with guard:
            threading.Thread(target=late_reply, daemon=True).start()
            try:
                print("ready", flush=True)
                time.sleep(60)
            except KeyboardInterrupt:
                time.sleep(60)  # an orderly exit that never ends: the deadline reports and exits
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err.splitlines() == [INTERRUPTED_MESSAGE, "cleanup ran"], err


def test_second_sigint_exits_at_once():
    process = _start(grace=60)  # the deadline alone would keep it for a minute
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "cleanup ran" in err
    assert "Traceback" not in err


def test_one_sigint_delivered_twice_at_once_is_one_stop_not_a_forced_exit():
    """`timeout -s INT` (without --foreground) and some supervisors signal the process, then its group: the
    run got a second Ctrl-C a few milliseconds after the first and exited at once, its flow run unreported.
    The call in flight ends well within the grace: the orderly path reports, the forced exit never runs."""
    process = _start(grace=60, work=2)
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)  # delivered apart (two signals pending at once are one), well within one keypress
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err.splitlines() == ["reported by the main thread"], err


def test_stop_because_reports_the_reason_and_exits_1(tmp_path: Path):
    script = textwrap.dedent("""
        import sys, threading, time
        from skillopt.shell.interrupt import InterruptGuard

        guard = InterruptGuard(sys.stderr, grace_s=0.5)
        with guard:
            threading.Timer(0.2, guard.stop_because, args=("the API server exited",)).start()
            try:
                threading.Thread(target=time.sleep, args=(60,)).start()
                time.sleep(60)
            except KeyboardInterrupt:
                pass
        sys.exit(3)  # never reached in time: the deadline exits first
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert result.stderr.strip() == "error: the API server exited"


def test_an_error_raised_while_ctrl_c_unwinds_a_run_is_reported_as_the_interrupt(tmp_path: Path):
    # A run command whose unwinding after Ctrl-C raises another error (as Prefect's crash handling did for a
    # task run it was still creating): one line and exit 130, no traceback.
    script = textwrap.dedent("""
        import os, signal, time
        import skillopt.shell.cli as cli

        def train(args, out):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            except KeyboardInterrupt:
                raise ValueError("Task run is not set") from None

        cli._cmd_train = train
        cli.entry(hand_over=False)
    """)
    process = subprocess.run([sys.executable, "-c", script, "train", "demo"], cwd=tmp_path, text=True,
                             capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.returncode == 130, process.stderr
    assert process.stderr.strip().splitlines() == [INTERRUPTED_MESSAGE]


def test_sigterm_exits_143_with_the_resume_line_although_a_worker_is_still_busy():
    process = _start(grace=0.5)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert process.returncode == 143
    assert err.splitlines() == [INTERRUPTED_MESSAGE, "cleanup ran"]


# Inside a flow Prefect's SIGTERM handler replaces the guard's (it raises its own TerminationSignal and the
# flow's orderly exit may wait for ever); terminate_promptly puts the guard's deadline in front of it.
_IN_A_FLOW = textwrap.dedent("""
    import signal, sys, threading, time
    from skillopt.shell.interrupt import InterruptGuard, terminate_promptly

    class TerminationSignal(BaseException):
        pass

    def prefects_handler(signum, frame):
        raise TerminationSignal

    guard = InterruptGuard(sys.stderr, grace_s=0.5)
    with guard:
        signal.signal(signal.SIGTERM, prefects_handler)
        with terminate_promptly():
            try:
                print("ready", flush=True)
                time.sleep(60)
            except TerminationSignal:
                threading.Event().wait(60)  # an orderly exit that waits on work that never ends
""")


def test_sigterm_inside_a_flow_still_exits_143_promptly():
    process = subprocess.Popen([sys.executable, "-c", _IN_A_FLOW], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert process.returncode == 143 and err.splitlines() == [INTERRUPTED_MESSAGE]
