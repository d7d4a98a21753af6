"""What the Logs tab of a run in the Prefect UI tells: the training story, not Prefect's bookkeeping.

The lines the command line prints (run directory, baseline, each step with its gate decision and
scores, epoch boundaries) are records of the ``skillopt.progress`` logger, and the run's summary one of
``skillopt.story`` (the command line prints its own). During a
top-level flow run they also go to that run's logs, wherever they are written (the epoch subflows,
task threads), so one run's page holds the whole story. Prefect's own line per task run ("Finished
in state Completed()", hundreds per run) stays out unless the run is ``verbose``.

A run started from a deployment has no command line: a skillopt error's message there names the
deployment parameter to set instead of a command-line option, and it is logged without a traceback.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.logging.handlers import APILogHandler

from skillopt.core.errors import SkillOptError, in_deployment_terms
from skillopt.flows.parameters import CONFIG_PARAMETERS
from skillopt.flows.run import PROGRESS_LOGGER, _UserErrorsWithoutTraceback

#: Prefect's logger of task-run states: one INFO line per task run.
TASK_RUNS_LOGGER = "prefect.task_runs"
#: Lines for the run's logs only (the command line shows the same facts its own way, e.g. the summary).
STORY_LOGGER = "skillopt.story"

_QUIET_USER_ERRORS = _UserErrorsWithoutTraceback()
# The run's logs only: a terminal shows the command's own summary.
logging.getLogger(STORY_LOGGER).propagate = False


class _ToFlowRun(APILogHandler):
    """Prefect's API log handler, with every record attributed to one flow run (not the subflow or task
    run it was written in), so the top-level run's Logs tab shows it."""

    def __init__(self, flow_run_id: str) -> None:
        super().__init__(logging.INFO)
        self.flow_run_id = flow_run_id

    def emit(self, record: logging.LogRecord) -> None:
        record = copy.copy(record)
        record.flow_run_id = self.flow_run_id
        record.task_run_id = None
        super().emit(record)


@contextmanager
def run_story(*, verbose: bool = False) -> Iterator[None]:
    """Around a top-level flow's body: progress lines into the run's logs, task-run state lines off unless
    ``verbose``, deployment terms in skillopt errors of a deployment run. Outside a flow run: nothing."""
    from prefect.runtime import deployment, flow_run

    run_id = flow_run.id
    if run_id is None:
        yield
        return
    loggers = [logging.getLogger(name) for name in (PROGRESS_LOGGER, STORY_LOGGER)]
    task_runs = logging.getLogger(TASK_RUNS_LOGGER)
    handler = _ToFlowRun(run_id)
    levels = [logger.level for logger in (*loggers, task_runs)]
    for logger in loggers:
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    if not verbose and task_runs.getEffectiveLevel() < logging.WARNING:
        task_runs.setLevel(logging.WARNING)
    from_deployment = deployment.id is not None
    if from_deployment:
        # Prefect logs the flow's exception after the body has returned: the filter stays for the process,
        # which runs this one deployment run.
        for name in ("prefect.flow_runs", TASK_RUNS_LOGGER):
            logging.getLogger(name).addFilter(_QUIET_USER_ERRORS)
    try:
        yield
    except SkillOptError as error:
        if from_deployment:
            error.args = (in_deployment_terms(str(error), CONFIG_PARAMETERS), *error.args[1:])
        raise
    finally:
        for logger, level in zip((*loggers, task_runs), levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
