"""docker-compose.yml, the Dockerfile, .env.example and deployments/prefect.yaml, checked by parsing them.

There is no Docker engine in the test environment, so these tests read the files the way compose and
Prefect would and check what `docker compose up -d` and `prefect deploy --all` depend on: services,
health checks, volumes, loopback-only ports, that every command names something the image has, and
that the deployments match what `skillopt serve` registers.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shlex
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml

from skillopt.core.config import SkillOptConfig
from skillopt.core.resources import shipped_config_names

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "skillopt:local"
WORKDIR = "/data"
_VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(?::([-?])([^}]*))?\}")


def dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped, surrounding quotes removed)."""
    values = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


ENV_EXAMPLE = dotenv(ROOT / ".env.example")
# What a user writes into .env by following docs/self-hosting.md.
USER_ENV = {**ENV_EXAMPLE, "POSTGRES_PASSWORD": "a-long-random-string"}


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} substitution."""

    def substitute(match: re.Match[str]) -> str:
        name, kind, arg = match.groups()
        current = env.get(name, "")
        if kind == "-":
            return current or arg
        if kind == "?":
            assert current, f"compose would stop: {name}: {arg}"
        return current

    return _VARIABLE.sub(substitute, value)


def resolved(node, env: dict[str, str]):  # noqa: ANN001, ANN201 - YAML data in, YAML data out
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolved(x, env) for x in node]
    if isinstance(node, dict):
        return {k: resolved(v, env) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def raw_compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose(raw_compose: dict) -> dict:
    return resolved(raw_compose, USER_ENV)


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_the_four_services_and_their_images(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "prefect-server", "trainer", "reports"}
    for name in ("prefect-server", "trainer", "reports"):
        assert services[name]["image"] == IMAGE
        assert services[name]["build"]["context"] == "."
    assert re.fullmatch(r"postgres:\d+(-alpine)?", services["postgres"]["image"]), (
        "pin the postgres major version"
    )


def test_every_variable_is_documented_in_env_example_and_the_password_is_required(raw_compose):
    used = set(_VARIABLE.findall(yaml.safe_dump(raw_compose)))
    assert {name for name, _, _ in used} <= set(ENV_EXAMPLE), (
        "a ${VAR} of docker-compose.yml is not in .env.example"
    )
    with pytest.raises(AssertionError, match="POSTGRES_PASSWORD"):
        resolved(raw_compose, ENV_EXAMPLE)  # the example's empty password stops compose with a message
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "POSTGRES_PASSWORD"):
        assert not ENV_EXAMPLE.get(key), f".env.example must not carry a value for {key}"


def test_ports_are_bound_to_loopback_only(compose):
    published = {name: service.get("ports", []) for name, service in compose["services"].items()}
    assert published["prefect-server"] == ["127.0.0.1:4200:4200"]
    assert published["reports"] == ["127.0.0.1:8080:8080"]
    for name, ports in published.items():
        for port in ports:
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (
                f"{name} publishes {port!r} beyond loopback"
            )


def test_health_checks_gate_start_up_order(compose):
    services = compose["services"]
    assert services["prefect-server"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["trainer"]["depends_on"] == {"prefect-server": {"condition": "service_healthy"}}
    for name in ("postgres", "prefect-server", "reports"):
        assert services[name]["healthcheck"]["test"], f"{name} has no health check"
    postgres = services["postgres"]
    assert postgres["healthcheck"]["test"] == ["CMD-SHELL", "pg_isready -U prefect -d prefect"]
    server_port = _port_of(argv(services["prefect-server"]["command"]))
    for name, port, path in (("prefect-server", server_port, "/api/health"), ("reports", "8080", "/")):
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        compile(test[3], f"{name} health check", "exec")  # the probe is valid Python
        assert f"http://127.0.0.1:{port}{path}" in test[3]


def test_the_server_uses_postgres_and_the_trainer_uses_the_server(compose):
    services = compose["services"]
    env = services["prefect-server"]["environment"]
    database = services["postgres"]["environment"]
    url = env["PREFECT_API_DATABASE_CONNECTION_URL"]
    expected = (f"postgresql+asyncpg://{database['POSTGRES_USER']}:{USER_ENV['POSTGRES_PASSWORD']}@postgres:5432/"
                f"{database['POSTGRES_DB']}")
    assert url == expected
    assert importlib.util.find_spec("asyncpg") is not None, "the image needs asyncpg for the Postgres URL"
    port = _port_of(argv(services["prefect-server"]["command"]))
    assert services["trainer"]["environment"]["PREFECT_API_URL"] == f"http://prefect-server:{port}/api"
    assert services["trainer"]["env_file"] == ".env"  # provider keys
    assert env["PREFECT_UI_API_URL"].startswith("http://127.0.0.1:")
    # The run links the trainer prints open where the browser reaches the UI, not at the service's name.
    trainer = services["trainer"]["environment"]
    assert trainer["PREFECT_UI_URL"] == env["PREFECT_UI_API_URL"].removesuffix("/api")


def test_volumes_hold_runs_cache_and_the_skill_registry_where_the_trainer_looks(compose):
    run = SkillOptConfig().run
    trainer = compose["services"]["trainer"]["volumes"]
    for volume, setting in (("runs", run.runs_dir), ("cache", run.cache_dir), ("skills", run.skills_dir)):
        assert f"{volume}:{WORKDIR}/{setting}" in trainer, f"{volume} is not mounted at {WORKDIR}/{setting}"
    assert "runs:/data/runs:ro" in compose["services"]["reports"]["volumes"]
    assert any(v.endswith(":/data/datasets:ro") for v in trainer)
    assert {"postgres", "runs", "cache", "skills"} <= set(compose["volumes"])
    assert "postgres:/var/lib/postgresql/data" in compose["services"]["postgres"]["volumes"]
    # the server's concurrency leases (skillopt's servers keep them under PREFECT_HOME) outlive the container
    server = compose["services"]["prefect-server"]
    assert f"prefect-home:{server['environment']['PREFECT_HOME']}" in server["volumes"]
    assert "prefect-home" in compose["volumes"]


def test_every_command_names_something_the_image_has(compose):
    """skillopt and prefect console scripts from the installed distributions, python modules that exist."""
    scripts = {e.name for name in ("skillopt", "prefect") for e in distribution(name).entry_points
               if e.group == "console_scripts"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "skillopt" in pyproject["project"]["scripts"] and any(
        d.startswith("prefect") for d in pyproject["project"]["dependencies"])
    for name, service in compose["services"].items():
        if service.get("image") != IMAGE:
            continue
        command = argv(service["command"])
        program = command[0]
        if program == "python":
            assert command[1] == "-m" and importlib.util.find_spec(command[2]) is not None, (
                f"{name}: {command}"
            )
            if command[2] == "skillopt.shell.prefect_server":  # Prefect's command line, `server start` first
                assert command[3:5] == ["server", "start"], f"{name}: {command}"
        else:
            assert program in scripts, f"{name}: {program} is not a console script of the image"
        if program == "skillopt":
            _check_skillopt_arguments(command[1:])
        if program == "prefect":
            from prefect.cli import server

            assert command[1:3] == ["server", "start"] and callable(server.start)
    assert argv(compose["services"]["trainer"]["command"])[:2] == ["skillopt", "serve"]


def _check_skillopt_arguments(arguments: list[str]) -> None:
    from skillopt.deployments.serve import registered_benchmarks
    from skillopt.shell.cli import _build_parser

    parsed = _build_parser().parse_args(arguments)  # exits (fails the test) on an unknown option
    assert parsed.command == "serve"
    assert set(parsed.benchmarks) <= set(registered_benchmarks())
    from skillopt.core.config import load_config

    load_config("demo", overrides=parsed.override, env={})  # every -o is a valid config key and value


def _port_of(command: list[str]) -> str:
    return command[command.index("--port") + 1]


def test_dockerfile_installs_this_repository_and_runs_skillopt_serve():
    text = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    base = re.search(r"^FROM python:(\d+\.\d+)", text, re.MULTILINE)
    assert base, "the image starts from an official python image"
    minimum = pyproject["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, base.group(1).split("."))) >= tuple(map(int, minimum.split(".")))
    copied = set(re.findall(r"^COPY (\S+)", text, re.MULTILINE))
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    shipped = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert set(packages) | set(shipped) <= copied, "the image must copy everything the wheel is built from"
    assert 'pip install ".' in text
    assert re.search(r"^USER (?!root)\S+", text, re.MULTILINE), "the services run as an unprivileged user"
    assert text.rstrip().splitlines()[-1] == 'CMD ["skillopt", "serve"]'
    assert re.findall(r"^WORKDIR (\S+)", text, re.MULTILINE)[-1] == WORKDIR
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".env", ".git", ".venv", "runs"} <= set(ignored)


# --------------------------------------------------------------------------------------------
# deployments/prefect.yaml


@pytest.fixture(scope="module")
def prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())


def test_prefect_yaml_has_one_nightly_deployment_per_benchmark(prefect_yaml):
    from skillopt.deployments.serve import (
        CONCURRENCY_PER_BENCHMARK,
        DEFAULT_CRON,
        DEFAULT_TIMEZONE,
        registered_benchmarks,
    )

    deployments = prefect_yaml["deployments"]
    names = [d["name"] for d in deployments]
    assert len(names) == len(set(names))
    # Every shipped benchmark config (so every built-in benchmark, installed extras or not).
    assert set(names) == set(shipped_config_names()) - {"_base_"}
    assert set(registered_benchmarks()) <= set(names)
    for deployment in deployments:
        assert deployment["entrypoint"] == "skillopt.flows.train.skill_train"
        assert deployment["parameters"] == {"benchmark": deployment["name"], "mode": "nightly"}
        assert deployment["schedules"] == [{"cron": DEFAULT_CRON, "timezone": DEFAULT_TIMEZONE}]
        assert deployment["concurrency_limit"] == CONCURRENCY_PER_BENCHMARK
        assert deployment["work_pool"]["name"] == "skillopt"


def test_prefect_yaml_entrypoint_and_parameters_fit_the_flow(prefect_yaml):
    from prefect.flows import load_flow_from_entrypoint

    flow = load_flow_from_entrypoint(prefect_yaml["deployments"][0]["entrypoint"])
    assert flow.name == "skill-train"
    accepted = set(inspect.signature(flow.fn).parameters)
    for deployment in prefect_yaml["deployments"]:
        assert set(deployment["parameters"]) <= accepted
    (pull,) = prefect_yaml["pull"]
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == "{{ $SKILLOPT_WORKDIR }}"
    assert prefect_yaml["build"] is None and prefect_yaml["push"] is None
