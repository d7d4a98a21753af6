"""The run a flow works on, with the task layer's one addition: Prefect's rate limiter when configured.

``start_run`` builds the flow's run in its own process; ``run_of`` gives any process (a worker that received
only the ``RunSpec``) the same run, built once per process.
"""

from __future__ import annotations

from skillopt.assembly import Run, RunSpec, open_run, remember_run
from skillopt.config import LoadedConfig, SkillOptConfig
from skillopt.llm.limiter import RateLimiter


def limiter_for(config: SkillOptConfig) -> RateLimiter | None:
    """Prefect's global concurrency limits with ``model.rate_limit_mode: prefect``; else the clients' own."""
    if config.model.rate_limit_mode != "prefect":
        return None
    from skillopt.tasks.limits import PrefectRateLimiter

    return PrefectRateLimiter(config.model.providers)


def start_run(spec: RunSpec, *, loaded: LoadedConfig | None = None) -> Run:
    """Build the run ``spec`` describes for a flow in this process (``loaded``: the config, already
    validated)."""
    loaded = loaded or spec.loaded()
    return remember_run(Run.build(spec, loaded=loaded, limiter=limiter_for(loaded.config)))


def run_of(spec: RunSpec) -> Run:
    """The run ``spec`` describes, built on first use in this process."""
    return open_run(spec, limiter_for=limiter_for)
