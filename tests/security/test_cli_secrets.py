"""A sentinel API key in the environment never reaches anything the CLI prints or writes,
and the same key written literally into a YAML file is refused without being quoted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SENTINEL = "sk-SENTINEL-7f3a2b9c4d1e6f08"
KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "DASHSCOPE_API_KEY",
                 "OPENAI_COMPATIBLE_API_KEY")


def skillopt(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skillopt.shell.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def sentinel_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLOPT_")}
    for i, name in enumerate(KEY_VARIABLES):
        env[name] = f"{SENTINEL}-{i}"
    return env


def files_below(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_sentinel_keys_never_appear_in_cli_output_or_files(tmp_path, sentinel_env):
    (tmp_path / "mine.yaml").write_text("_base_: searchqa.yaml\nmodel:\n  target: {backend: anthropic}\n",
                                        encoding="utf-8")
    before = files_below(tmp_path)
    runs = [
        skillopt(
            "config",
            "show",
            "searchqa",
            "-c",
            "mine.yaml",
            "-o",
            "model.judge.backend=openai_compatible",
            cwd=tmp_path,
            env=sentinel_env,
        ),
        skillopt("config", "validate", "mine.yaml", cwd=tmp_path, env=sentinel_env),
        skillopt("schedule", "--steps", "5", cwd=tmp_path, env=sentinel_env),
        skillopt("config", "show", "searchqa", "-o", "train.epochs=oops", cwd=tmp_path, env=sentinel_env),
    ]
    assert [r.returncode for r in runs] == [0, 0, 0, 2]
    assert "set (env:ANTHROPIC_API_KEY)" in runs[0].stdout  # the key was visible to the process
    for r in runs:
        assert SENTINEL not in r.stdout + r.stderr
    after = files_below(tmp_path)
    assert set(after) == set(before), "the CLI wrote files it should not have"
    for content in after.values():
        assert SENTINEL.encode() not in content


def test_literal_key_in_yaml_is_rejected_without_quoting_it(tmp_path, sentinel_env):
    (tmp_path / "leak.yaml").write_text(f"model:\n  optimizer:\n    api_key: {SENTINEL}\n", encoding="utf-8")
    proc = skillopt("config", "validate", "leak.yaml", cwd=tmp_path, env=sentinel_env)
    assert proc.returncode == 2
    assert "model.optimizer.api_key: literal keys are not accepted" in proc.stderr
    assert "OPENAI_API_KEY" in proc.stderr
    assert SENTINEL not in proc.stdout + proc.stderr
    proc = skillopt("config", "show", "qa", "-o", f"model.target.base_url=Bearer {SENTINEL}", cwd=tmp_path,
                    env=sentinel_env)
    assert proc.returncode == 2
    assert SENTINEL not in proc.stdout + proc.stderr
