"""Stopping a ``codex_exec`` run on a local Dask cluster stops the agent CLIs its worker processes started.

The run is the real command (``skillopt train demo --target-backend codex_exec -o run.task_runner=dask``)
against the session's Prefect server, its target the fake ``codex`` (tests/fakes/bin) in the ``sleep``
scenario: a CLI that ignores SIGTERM and starts a grandchild, both sleeping far past the test. Without the OS
sandbox nothing ties them to the worker process that started them, which ends with the run's process by
``os._exit`` (Dask watches its parent) and so runs no clean-up of its own: each worker must stop them (and
remove their workspaces) when the run asks it to (tasks/dask_workers.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import alive

pytestmark = pytest.mark.slow
FAKE_BIN = Path(__file__).resolve().parents[1] / "fakes" / "bin"


def _processes(marker: bytes) -> dict[int, str]:
    """The running processes whose environment holds ``marker``, by pid: their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env, open(f"/proc/{entry}/cmdline", "rb") as cmd:
                environ, argv = env.read().split(b"\0"), cmd.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(marker in item for item in environ) and alive(int(entry)):
            found[int(entry)] = argv
    return found


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """The fake CLIs in the ``sleep`` scenario, with this interpreter in their shebang."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("codex", "fake_cli.py"):
        text = (FAKE_BIN / name).read_text(encoding="utf-8").replace("#!/usr/bin/env python3",
                                                                      f"#!{sys.executable}", 1)
        (folder / name).write_text(text, encoding="utf-8")
        (folder / name).chmod(0o755)
    (folder / "scenario.txt").write_text("sleep", encoding="utf-8")
    return folder


@pytest.fixture
def temp(tmp_path: Path) -> Iterator[Path]:
    """The runs' temporary folder (workspaces, private homes); kills what the test finds left in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    yield folder
    for pid in _processes(f"={folder}".encode()):
        os.kill(pid, signal.SIGKILL)


def _start(tmp_path: Path, prefect_api: str, fake_bin: Path, temp: Path) -> subprocess.Popen[bytes]:
    work = tmp_path / "work"  # apart from the temporary folder: workspaces must be outside the run's folders
    work.mkdir()
    command = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", "stop",
               "--target-backend", "codex_exec", "-o", "model.target.options.workspace_sandbox=none",
               "-o", f"run.runs_dir={work / 'runs'}", "-o", f"run.cache_dir={work / 'cache'}",
               "-o", "run.task_runner=dask", "-o", "run.dask_n_workers=2",
               "-o", "run.dask_threads_per_worker=1"]
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING",
           "TMPDIR": str(temp), "PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    with (tmp_path / "output.txt").open("wb") as output:  # a file: nobody reads a pipe while the run goes on
        return subprocess.Popen(command, cwd=work, env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)


@pytest.mark.parametrize(("how", "code"), [("ctrl-c", 130), ("sigterm", 143)])
def test_stopping_the_run_stops_the_clis_of_its_local_workers(tmp_path, prefect_api, fake_bin, temp, how,
                                                              code):
    pytest.importorskip("prefect_dask")
    process = _start(tmp_path, prefect_api, fake_bin, temp)
    homes = f"HOME={temp}".encode()  # the CLIs and their grandchildren: a private home under the run's TMPDIR
    try:
        deadline = time.monotonic() + 300
        while len(clis := _processes(homes)) < 4 and process.poll() is None:  # two CLIs, two grandchildren
            assert time.monotonic() < deadline, "no CLI started"
            time.sleep(0.2)
        assert process.poll() is None, (tmp_path / "output.txt").read_text()[-4000:]
        parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in clis}
        assert process.pid not in parents  # started by the worker processes, not by the run's own
        workers = {pid for pid, argv in _processes(f"TMPDIR={temp}".encode()).items()
                   if pid != process.pid and "spawn_main" in argv}
        assert len(workers) == 2
        if how == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the run and its workers get it
        else:
            process.send_signal(signal.SIGTERM)  # `docker stop`, a supervisor: the run's process only
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = (tmp_path / "output.txt").read_text()
    assert process.returncode == code, output[-4000:]
    assert "interrupted — re-run the same command to resume" in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    deadline = time.monotonic() + 10
    while (_processes(homes) or any(alive(pid) for pid in workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes(homes) == {}, "agent CLIs outlived the run"
    assert not any(alive(pid) for pid in workers)
    assert sorted(p.name for p in temp.glob("skillopt-*")) == []
