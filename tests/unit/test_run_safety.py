"""Run-directory safety: one writer per run, outputs that a failed resume never touches, torn lines,
read-only places and full disks, and set-up failures that do not block a run name."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skillopt.core.atomic import check_writable
from skillopt.core.config import SkillOptConfig
from skillopt.core.errors import ConfigError, StorageError
from skillopt.core.records import StepRecord
from skillopt.run.report import load_run
from skillopt.run.runs import RunDir, RunDirError, config_hash

ROOT = Path(__file__).resolve().parents[2]


def make_config(**sections) -> SkillOptConfig:
    return SkillOptConfig.model_validate({"benchmark": {"name": "demo"}, **sections})


def open_run(tmp_path: Path, config: SkillOptConfig | None = None) -> RunDir:
    config = config or make_config()
    return RunDir.open(tmp_path / "runs", "run1", config, config_hash=config_hash(config), provenance={})


def record(step: int) -> StepRecord:
    return StepRecord(step=step, epoch=1, step_in_epoch=step, budget=2, decision="accept_new_best")


def python(code: str, *, under: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` (dedented) run by a fresh interpreter from this checkout, inside the ``under`` command if
    given."""
    return subprocess.run([*(under or []), sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


def finished_run(tmp_path: Path) -> RunDir:
    """A run that trained for three steps and wrote its outputs."""
    run = open_run(tmp_path)
    run.write_skill_snapshot(0, "initial")
    for step in (1, 2, 3):
        run.record_step(record(step))
        run.write_skill_snapshot(step, f"trained {step}")
    run.write_best_skill("trained 3")
    run.summary_path.write_text('{"best_skill_sha": "of trained 3"}\n')
    return run


# --------------------------------------------------------------------------------------------
# One process per run directory


def test_a_second_process_on_the_same_run_gets_an_error_naming_the_holder(tmp_path: Path):
    open_run(tmp_path)  # this process holds the run now
    result = python(f"""
        from pathlib import Path
        from skillopt.core.config import SkillOptConfig
        from skillopt.core.errors import StorageError
        from skillopt.run.runs import RunDir, config_hash
        config = SkillOptConfig.model_validate({{"benchmark": {{"name": "demo"}}}})
        try:
            RunDir.open(Path({str(tmp_path / "runs")!r}), "run1", config, config_hash=config_hash(config),
                        provenance={{}})
        except StorageError as error:
            print(error)
    """)
    assert result.stdout.strip() == (f"run directory {tmp_path / 'runs' / 'run1'} is in use by another "
                                     f"skillopt process (pid {os.getpid()}); wait for it to finish or stop "
                                     "it, or choose another --run-name")


def test_the_lock_goes_with_the_process_that_held_it(tmp_path: Path):
    holder = python(f"""
        from pathlib import Path
        from skillopt.core.config import SkillOptConfig
        from skillopt.run.runs import RunDir, config_hash
        config = SkillOptConfig.model_validate({{"benchmark": {{"name": "demo"}}}})
        RunDir.open(Path({str(tmp_path / "runs")!r}), "run1", config, config_hash=config_hash(config),
                    provenance={{}})
    """)
    assert holder.returncode == 0, holder.stderr
    assert open_run(tmp_path).path.is_dir()  # no stale lock after the holder exited


def test_in_use_tells_a_run_held_by_a_live_process_from_one_whose_process_is_gone(tmp_path: Path):
    run = open_run(tmp_path)  # this process holds the run
    asked = python(f"""
        from skillopt.run.runs import RunDir
        print(RunDir({str(run.path)!r}).in_use())
    """)
    assert asked.stdout.strip() == "True", asked.stderr
    # asking takes no lock: the holder keeps it, and a process asking a free run leaves it free
    assert python(f"""
        from skillopt.run.runs import RunDir
        print(RunDir({str(tmp_path / "runs" / "gone")!r}).in_use())
    """).stdout.strip() == "False"
    holder = python(f"""
        from pathlib import Path
        from skillopt.core.config import SkillOptConfig
        from skillopt.run.runs import RunDir, config_hash
        config = SkillOptConfig.model_validate({{"benchmark": {{"name": "demo"}}}})
        RunDir.open(Path({str(tmp_path / "runs")!r}), "run2", config, config_hash=config_hash(config),
                    provenance={{}})
    """)
    assert holder.returncode == 0, holder.stderr
    assert RunDir(tmp_path / "runs" / "run2").in_use() is False  # its process exited
    assert RunDir(tmp_path / "runs" / "run2").in_use() is False  # and asking did not take it


# --------------------------------------------------------------------------------------------
# A resume that fails leaves the outputs alone


def test_a_failed_resume_never_rewrites_best_skill_or_summary(tmp_path: Path):
    finished_run(tmp_path)
    summary = (tmp_path / "runs/run1/summary.json").read_text()
    resumed = open_run(tmp_path)
    resumed.write_best_skill("initial")  # the replay's baseline passes through the untrained skill
    resumed.record_step(record(1))
    with pytest.raises(RunDirError, match="already holds a different skill for step 2"):
        resumed.write_skill_snapshot(2, "something else")  # the replay diverges: the resume fails here
    assert resumed.best_skill_path.read_text() == "trained 3"
    assert resumed.summary_path.read_text() == summary


def test_a_resume_writes_the_best_skill_once_past_the_recorded_steps_or_at_the_end(tmp_path: Path):
    finished_run(tmp_path)
    resumed = open_run(tmp_path)
    resumed.write_best_skill("initial")
    for step in (1, 2, 3):
        resumed.record_step(record(step))
    resumed.write_best_skill("trained 3")
    assert resumed.best_skill_path.read_text() == "trained 3"
    resumed.record_step(record(4))  # a new step: the replay is over
    resumed.write_best_skill("trained 4")
    assert resumed.best_skill_path.read_text() == "trained 4"


def test_a_torn_last_history_line_is_dropped_with_a_warning_and_the_resume_keeps_the_best(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    run = finished_run(tmp_path)
    text = run.history_path.read_text()
    run.history_path.write_text(text[: len(text) - 40])  # the last record cut short
    with caplog.at_level(logging.WARNING):
        resumed = open_run(tmp_path)
    assert f"{run.history_path}:3: not a valid step record" in caplog.text
    assert [r.step for r in resumed.read_history()] == [1, 2]
    resumed.write_best_skill("initial")
    resumed.record_step(record(1))
    assert resumed.best_skill_path.read_text() == "trained 3"  # held back during the replay
    resumed.record_step(record(2))
    resumed.write_best_skill("trained 3")
    resumed.record_step(record(3))  # past what was recorded: the best is written, the history repaired
    assert resumed.best_skill_path.read_text() == "trained 3"
    assert [r.step for r in RunDir(run.path).read_history()] == [1, 2, 3]


def test_a_damaged_line_inside_the_history_is_an_error_naming_file_and_line(tmp_path: Path):
    run = finished_run(tmp_path)
    lines = run.history_path.read_text().splitlines()
    lines[1] = lines[1][:20]
    run.history_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=rf"{run.history_path}:2: not a valid step record"):
        open_run(tmp_path)
    assert run.best_skill_path.read_text() == "trained 3"


def test_a_torn_usage_line_does_not_stop_the_report(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    run = finished_run(tmp_path)
    run.usage_path.write_text('{"stage": "rollout", "role": "target"}\n{"stage": "rollo')
    with caplog.at_level(logging.WARNING):
        data = load_run(run.path)
    assert len(data.usage) == 1
    assert f"{run.usage_path}:2: not a JSON line" in caplog.text


# --------------------------------------------------------------------------------------------
# Set-up failures do not block a name


def test_a_run_that_stopped_before_its_first_step_does_not_block_its_name(tmp_path: Path):
    open_run(tmp_path, make_config())  # config.yaml written, then the data failed to load
    fixed = make_config(optimizer={"learning_rate": 8})
    run = open_run(tmp_path, fixed)
    assert run.recorded_config_hash() == config_hash(fixed)
    run.write_skill_snapshot(0, "initial")  # the baseline ran (and paid), then failed
    run.write_best_skill("initial")
    run.usage_path.write_text('{"stage": "rollout"}\n')
    other = make_config(optimizer={"learning_rate": 2})
    again = open_run(tmp_path, other)
    assert again.recorded_config_hash() == config_hash(other)
    assert not again.skill_snapshot_path(0).exists() and not again.best_skill_path.exists()
    assert again.usage_path.read_text() == '{"stage": "rollout"}\n'  # the spend stays on record
    again.write_skill_snapshot(0, "another initial skill")
    again.record_step(record(1))  # now it has a result: another config is refused
    changed = r"config hashes to \w+; changed: optimizer\.learning_rate; resume it with the same config"
    with pytest.raises(ConfigError, match=changed):
        open_run(tmp_path, make_config())


# --------------------------------------------------------------------------------------------
# Read-only places and full disks: one line naming the path


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap to mount a folder read-only")
def test_a_read_only_folder_is_one_line_naming_it_and_the_setting(tmp_path: Path):
    folder = tmp_path / "cache"
    folder.mkdir()
    probe = bwrap_python(tmp_path, f"""
        from pathlib import Path
        from skillopt.core.atomic import check_writable
        from skillopt.core.errors import StorageError
        try:
            check_writable(Path({str(folder)!r}), "run.cache_dir")
        except StorageError as error:
            print(error)
    """)
    expected = f"cannot write to {folder} (run.cache_dir): Read-only file system"
    assert probe.stdout.strip() == expected, probe.stderr


def bwrap_python(read_only: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python(code)`` with the folder ``read_only`` mounted read-only."""
    return python(code, under=["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(read_only), str(read_only)])


def test_a_full_disk_is_one_line_naming_the_file(tmp_path: Path):
    # RLIMIT_FSIZE makes the kernel refuse the write the way a full disk does (an OSError mid-write).
    result = python(f"""
        import resource, signal
        from pathlib import Path
        from skillopt.core.errors import StorageError
        from skillopt.run.runs import RunDir
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        run = RunDir(Path({str(tmp_path / "run")!r}))
        run.write_text("small.txt", "fits")
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            run.write_text("summary.json", "x" * 5000)
        except StorageError as error:
            print(error)
    """)
    assert result.stdout.strip() == f"cannot write {tmp_path / 'run' / 'summary.json'}: File too large"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["small.txt"]  # no temp file left behind


def test_check_writable_creates_a_missing_folder_and_leaves_nothing_in_it(tmp_path: Path):
    check_writable(tmp_path / "a" / "b", "run.runs_dir")
    assert list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match=r"cannot write to .*file/sub \(run.runs_dir\): Not a directory"):
        check_writable(tmp_path / "file" / "sub", "run.runs_dir")


def test_files_written_atomically_get_the_mode_a_plain_open_gives(tmp_path):
    """A run's files (reports, summary, best skill) are read by others, e.g. a web server of the runs folder:
    the private mode of the temp file they are written through must not stay on them."""
    script = textwrap.dedent("""
        import os, sys
        from pathlib import Path
        os.umask(int(sys.argv[2], 8))
        from skillopt.core.atomic import atomic_write_bytes
        folder = Path(sys.argv[1])
        atomic_write_bytes(folder / "atomic.html", b"<p>report</p>")
        (folder / "plain.html").write_bytes(b"<p>report</p>")
    """)
    for umask, expected in (("022", 0o644), ("027", 0o640)):
        folder = tmp_path / umask
        folder.mkdir()
        subprocess.run([sys.executable, "-c", script, str(folder), umask], check=True, timeout=60)
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        assert modes == {"atomic.html": expected, "plain.html": expected}, (umask, modes)
