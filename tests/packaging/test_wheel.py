"""The wheel ships prompts/ and configs/ and the flow layer under the skillopt namespace: build it, install
it into a fresh venv outside the repository, load a prompt and a config from there, and import every
module of skillopt.flows, skillopt.tasks and skillopt.deployments (none may import a top-level `flows`,
`tasks` or `deployments`, which the wheel does not install)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{argv[:4]} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_installed_outside_the_repo_loads_shipped_prompts_and_configs(tmp_path):
    pytest.importorskip("hatchling", reason="building the wheel offline needs the dev extra (hatchling)")
    wheel_dir = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(REPO),
        ]
    )
    (wheel,) = wheel_dir.glob("skillopt-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])

    # The fresh venv borrows the dependencies (pydantic, PyYAML, ...) of the test environment through
    # PYTHONPATH; skillopt itself can only come from the wheel (the repo is not on the path, and the
    # editable install's .pth file is not processed for PYTHONPATH entries).
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    env.pop("PYTHONHOME", None)
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = (
        "import skillopt, skillopt.core.resources as r, skillopt.core.config as c\n"
        "print(skillopt.__file__)\n"
        "print(r.shipped_dir('configs'))\n"
        "print(r.load_prompt('benchmarks/searchqa/initial_skill').splitlines()[0])\n"
        "print(c.load_config('searchqa', env={}).config.benchmark.split_dir)\n"
        "import importlib, importlib.util, pkgutil\n"
        "for layer in ('flows', 'tasks', 'deployments'):\n"
        "    assert importlib.util.find_spec(layer) is None, f'a top-level {layer} package is installed'\n"
        "    package = importlib.import_module(f'skillopt.{layer}')\n"
        "    for module in pkgutil.iter_modules(package.__path__, f'skillopt.{layer}.'):\n"
        "        importlib.import_module(module.name)\n"
        "print(importlib.import_module('skillopt.flows.train').skill_train.name)\n"
    )
    proc = _run([str(python), "-c", script], cwd=work, env=env)
    module_file, configs_dir, prompt_title, split_dir, flow_name = proc.stdout.splitlines()
    assert Path(module_file).is_relative_to(env_dir), module_file
    assert Path(configs_dir).is_relative_to(env_dir) and Path(configs_dir).parts[-2:] == (
        "_shipped",
        "configs",
    )
    assert prompt_title == "# SearchQA skill"
    assert split_dir == "data/searchqa_split"
    assert flow_name == "skill-train"

    cli = _run(
        [str(env_dir / "bin" / "skillopt"), "config", "show", "demo", "--no-sources"], cwd=work, env=env
    )
    assert "backend: scripted" in cli.stdout
