"""``run_flow`` sets Prefect defaults for a CLI run; an ephemeral API server started inside the run
inherits them through ``to_environment_variables`` (what Prefect passes to that subprocess)."""

from __future__ import annotations

import io

import skillopt.flows.run
import skillopt.flows.train
from skillopt.flows.run import run_flow


class Printer:
    def __init__(self) -> None:
        self.out = io.StringIO()

    def print(self, *args: object) -> None:
        print(*args, file=self.out)


def server_environment_inside_a_run(monkeypatch) -> dict[str, str]:
    seen: dict[str, str] = {}

    def fake_train(**parameters):
        from prefect.settings import get_current_settings

        seen.update(get_current_settings().to_environment_variables(exclude_unset=True))
        return {}

    monkeypatch.setattr(skillopt.flows.train, "skill_train", fake_train)
    monkeypatch.setattr(skillopt.flows.run._TemporaryServerStart, "if_needed", classmethod(lambda cls: None))
    run_flow("train", Printer(), benchmark="demo")
    return seen


def test_the_ephemeral_server_gets_quiet_logging_and_the_cli_defaults(monkeypatch):
    import prefect.context
    from prefect.settings import Settings

    # The suite's conftest sets the start-up timeout for its own temporary server: here the settings are read
    # from an environment without it (or the server logging level), so only run_flow's defaults can set them.
    for name in ("PREFECT_SERVER_LOGGING_LEVEL", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    current = prefect.context.get_settings_context()
    with prefect.context.SettingsContext(profile=current.profile, settings=Settings()):
        env = server_environment_inside_a_run(monkeypatch)
    assert env["PREFECT_SERVER_LOGGING_LEVEL"] == "CRITICAL"
    assert env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "120"


def test_a_users_own_server_logging_level_wins(monkeypatch):
    from prefect.settings import PREFECT_SERVER_LOGGING_LEVEL, temporary_settings

    with temporary_settings(updates={PREFECT_SERVER_LOGGING_LEVEL: "DEBUG"}):
        env = server_environment_inside_a_run(monkeypatch)
    assert env["PREFECT_SERVER_LOGGING_LEVEL"] == "DEBUG"


def _api_url_inside_a_run(monkeypatch, home) -> tuple[str | None, str]:
    seen: dict[str, str | None] = {}

    def fake_train(**parameters):
        from prefect.settings import get_current_settings

        seen["api"] = get_current_settings().api.url
        return {}

    monkeypatch.setattr(skillopt.flows.train, "skill_train", fake_train)
    monkeypatch.setattr(skillopt.flows.run._TemporaryServerStart, "if_needed", classmethod(lambda cls: None))
    printer = Printer()
    from prefect.settings import PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_HOME: str(home)}):
        run_flow("train", printer, benchmark="demo")
    return seen["api"], printer.out.getvalue()


def test_a_run_on_a_temporary_server_says_so_once(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    api, printed = _api_url_inside_a_run(monkeypatch, tmp_path)  # run_flow's default: a temporary server
    assert api is None  # Prefect's temporary server
    assert printed.count("temporary Prefect server") == 1


def test_a_users_own_api_url_is_never_replaced(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    api, printed = _api_url_inside_a_run(monkeypatch, tmp_path)
    assert api == "http://127.0.0.1:9/api"
    assert "skillopt server" not in printed


def test_after_ctrl_c_prefect_s_crash_lines_are_dropped_from_every_run_logger_the_engine_s_too(monkeypatch):
    """The engine reports a crash on ``prefect.engine`` while a (sub)flow run's own logger does not exist yet;
    after Ctrl-C the command says it once, so that line goes too."""
    import logging

    from skillopt.shell.interrupt import InterruptGuard

    guard = InterruptGuard(io.StringIO())
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.name}: {record.getMessage()}")

    keep = Keep()
    names = ("prefect.engine", "prefect.flow_runs", "prefect.task_runs")

    def interrupted_train(**parameters):
        guard.signals = 1  # what the first Ctrl-C does
        for name in names:
            logging.getLogger(name).error("Crash detected! Execution was aborted by an interrupt signal.")
        return {}

    for name in names:
        logging.getLogger(name).addHandler(keep)
    try:
        monkeypatch.setattr(skillopt.flows.train, "skill_train", interrupted_train)
        no_server = classmethod(lambda cls: None)
        monkeypatch.setattr(skillopt.flows.run._TemporaryServerStart, "if_needed", no_server)
        run_flow("train", Printer(), guard, benchmark="demo")
        logging.getLogger("prefect.engine").error("after the command: kept")
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(keep)
    assert seen == ["prefect.engine: after the command: kept"]


def test_the_queue_services_drain_count_stays_off_the_terminal(caplog):
    """Prefect says how many items its event and log queues still hold whenever they drain, the exit of
    every command included; the user's terminal does not need it. Other warnings of those services pass."""
    import logging

    import skillopt.flows.run  # noqa: F401 - installs the filter for the process

    with caplog.at_level(logging.WARNING):
        logging.getLogger("EventsWorker").warning("Still processing items: 6 items remaining...")
        logging.getLogger("APILogWorker").warning("Still processing items: 2 items remaining...")
        logging.getLogger("EventsWorker").warning("Service 'EventsWorker' failed to process item")
    assert [r.getMessage() for r in caplog.records] == ["Service 'EventsWorker' failed to process item"]
