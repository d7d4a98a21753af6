"""A child started in its own process group is stopped with every process it started."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skillopt.sandbox import process_group
from skillopt.sandbox.process_group import (
    end_group,
    end_leftovers,
    end_with_leftovers,
    keep_at_exit,
    own_group,
    run_in_group,
    scratch_folder,
    start_in_group,
    temp_folder,
)
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


# ---- what is left when skillopt exits

# Like PARENT, but leader and grandchild ignore SIGTERM, as a busy agent CLI may: only SIGKILL stops them.
IGNORE_TERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
STUBBORN = IGNORE_TERM + PARENT.replace("'import time;", f"'{IGNORE_TERM}import time;")


@pytest.fixture
def exit_cleanup(monkeypatch):
    """``end_leftovers`` marks the process as exiting; undo that after the test."""
    monkeypatch.setattr(process_group, "_exiting", False)
    return end_leftovers


def _start(script: str) -> tuple[subprocess.Popen, int]:
    """A group started through the registry, and the pid of the grandchild its leader started."""
    process = start_in_group([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    grandchild = int(process.stdout.readline())
    process.stdout.close()
    return process, grandchild


def _no_such_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("script", [PARENT, STUBBORN], ids=["sigterm-stops-it", "sigterm-ignored"])
def test_end_leftovers_stops_every_live_group_with_its_grandchildren(exit_cleanup, script):
    started = [_start(script) for _ in range(2)]
    assert all(alive(process.pid) and alive(grandchild) for process, grandchild in started)
    exit_cleanup(grace_s=0.2)
    for process, grandchild in started:
        assert process.returncode is not None  # the leader was killed and reaped
        assert _no_such_process(process.pid)
        # The grandchild, re-parented to init, is gone once init reaps it (until then a zombie: not running).
        assert _gone_soon(grandchild)


def test_a_group_reaped_by_its_owner_is_no_longer_listed(exit_cleanup):
    process = start_in_group([sys.executable, "-c", "pass"])
    assert process.pid in process_group._live
    end_group(process, grace_s=0)
    assert process.pid not in process_group._live
    done = run_in_group([sys.executable, "-c", "print('ok')"], timeout_s=30)
    assert done.stdout == "ok\n" and process_group._live == {}


def test_after_the_exit_cleanup_a_new_group_is_stopped_at_once_and_a_folder_refused(exit_cleanup, tmp_path):
    exit_cleanup(grace_s=0)
    with pytest.raises(process_group.Exiting):
        start_in_group([sys.executable, "-c", "import time; time.sleep(60)"])
    assert process_group._live == {}
    with pytest.raises(process_group.Exiting):
        temp_folder("skillopt-x-", dir=tmp_path)


def test_a_temp_folder_is_removed_at_exit_and_none_is_made_after(exit_cleanup, tmp_path):
    """A worker thread still going after the exit clean-up neither leaves a folder nor reports a failure of
    its own: its workspace was removed under it (a child cannot start there) or is not made at all."""
    folder = temp_folder("skillopt-x-", dir=tmp_path)
    assert folder.parent == tmp_path and folder.is_dir()
    exit_cleanup(grace_s=0)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(process_group.Exiting):
        temp_folder("skillopt-x-", dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(process_group.Exiting):
        start_in_group([sys.executable, "-c", "pass"], cwd=folder)


def test_a_scratch_folder_is_removed_after_its_block_and_at_exit_during_it(exit_cleanup, tmp_path):
    """The block's work fails because the exit clean-up removed the folder under it (a copy into it, a git
    command in it): that is ``Exiting``, not a failure of the item. The same error before the exit is the
    block's own."""
    with scratch_folder("skillopt-x-", dir=tmp_path) as folder:
        assert folder.is_dir()
    assert list(tmp_path.iterdir()) == [] and folder not in process_group._folders
    with pytest.raises(FileNotFoundError), scratch_folder("skillopt-x-", dir=tmp_path) as folder:
        (folder / "missing" / "file").write_text("x")
    with pytest.raises(process_group.Exiting) as stopped, scratch_folder("skillopt-x-", dir=tmp_path) as late:
        exit_cleanup(grace_s=0)
        (late / "file").write_text("x")
    assert isinstance(stopped.value.__cause__, FileNotFoundError)
    assert list(tmp_path.iterdir()) == []


def test_a_child_stopped_at_exit_is_not_reported_as_its_own_failure(exit_cleanup):
    """The worker thread waiting on it gets ``Exiting``, not an exit status it would record as an error."""
    caught: list[BaseException] = []

    def wait_for_child() -> None:
        try:
            run_in_group([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"],
                         timeout_s=60)
        except BaseException as exc:  # noqa: BLE001 - checked below
            caught.append(exc)

    worker = threading.Thread(target=wait_for_child)
    worker.start()
    while not process_group._live and worker.is_alive():
        time.sleep(0.01)
    exit_cleanup(grace_s=0.2)
    worker.join()
    assert len(caught) == 1 and isinstance(caught[0], process_group.Exiting)


def test_end_leftovers_removes_listed_folders_and_keeps_forgotten_ones(exit_cleanup, tmp_path):
    left, finished = temp_folder("left-", dir=tmp_path), temp_folder("finished-", dir=tmp_path)
    for folder in (left, finished):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "SKILL.md").write_text("x")
    keep_at_exit(finished)  # its owner is done with it (removed it, or keeps it on purpose)
    exit_cleanup(grace_s=0)
    assert not left.exists()
    assert finished.exists()


# A process that ends its own leftovers on SIGTERM (a moment's work, then a note of it) and exits.
HELPER = ("import pathlib, signal, sys, time\n"
          "def end(*_):\n"
          "    time.sleep(0.3)\n"
          "    pathlib.Path(sys.argv[1]).write_text('ended')\n"
          "    sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, end)\n"
          "print('ready', flush=True)\n"
          "time.sleep(60)\n")


class _Helper:
    """A child as ``end_with_leftovers`` lists it: ``pid`` and ``is_alive()``."""

    def __init__(self, note: Path) -> None:
        self.popen = subprocess.Popen([sys.executable, "-c", HELPER, str(note)], stdout=subprocess.PIPE,
                                      text=True)
        assert self.popen.stdout is not None and self.popen.stdout.readline() == "ready\n"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None


def test_end_leftovers_has_listed_processes_end_their_own_and_waits_for_them(exit_cleanup, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(process_group, "_helpers", [])  # this test's only
    listed, forgotten = _Helper(tmp_path / "listed"), _Helper(tmp_path / "forgotten")
    end_with_leftovers(lambda: [listed])
    forget = end_with_leftovers(lambda: [forgotten])
    forget()  # e.g. a local cluster closed before the exit
    try:
        exit_cleanup(grace_s=5)
        assert (tmp_path / "listed").read_text() == "ended"  # done by the time the exit goes on
        assert not listed.is_alive()
        assert forgotten.is_alive() and not (tmp_path / "forgotten").exists()
    finally:
        for helper in (listed, forgotten):
            helper.popen.kill()
            helper.popen.wait()
