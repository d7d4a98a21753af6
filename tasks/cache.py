"""Cache keys and result storage for skillopt's tasks.

A model-calling task's key is its request: ``call_key`` hashes the request the task sends (every prompt
text, images by content, the role's model identity and sampling parameters, the response schema, the tags)
through ``ChatRequest.cache_key``, the same function the reply store files replies under. A task's key is
therefore ``skillopt-<stage>-<the reply store key of its request>``: editing a prompt makes new keys for
exactly the calls whose request holds it, and nothing else (no version constant, no template hash).
Rollout keys (``skillopt.run.rollouts.rollout_key``) add what decides the score and which draw it is; pure
tasks (the epoch plan) hash their inputs with the package version (``content_key``).

Never the run id or the flow-run id: re-running a command, retrying a flow run or restarting after a crash
finds every finished call. Results are JSON files under the run's ``cache_dir`` (Prefect's local file
system on that folder).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt.llm.chat import ChatRequest
from skillopt.llm.errors import BackendError
from skillopt.run.assembly import Run
from skillopt.run.cache_keys import call_key
from skillopt.tasks.cache_hits import cache_hit_hook

CacheKeyFn = Callable[[Any, dict[str, Any]], str]


def keyed_by_request(build: Callable[..., ChatRequest],
                     schema: Callable[[Run], type[BaseModel]] | type[BaseModel]) -> CacheKeyFn:
    """A Prefect ``cache_key_fn`` for an optimizer task: ``call_key`` of the request ``build(**parameters)``
    renders (the task renders the same one), with ``schema`` (or ``schema(run)``) as its response schema."""

    def cache_key_fn(context: Any, parameters: dict[str, Any]) -> str:
        run: Run = parameters["run"]
        reply = schema if isinstance(schema, type) else schema(run)
        return call_key(run.clients.roles.optimizer.fingerprint(), build(**parameters), reply)

    return cache_key_fn


def keyed(fn: Callable[[dict[str, Any]], str]) -> Callable[[Any, dict[str, Any]], str]:
    """Adapt ``fn(parameters) -> key`` to Prefect's ``cache_key_fn(context, parameters)``."""

    def cache_key_fn(context: Any, parameters: dict[str, Any]) -> str:
        return fn(parameters)

    return cache_key_fn


def retry_only_retryable(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a task only for errors the backends mark retryable."""
    try:
        state.result()
    except BackendError as error:
        return error.retryable
    except Exception:  # noqa: BLE001 - anything else (bugs, config errors) must not be retried
        return False
    return False


#: The ``@task`` options every optimizer task shares: a JSON result kept under its request's key, the
#: ``llm:optimizer`` concurrency tag, and retries only for errors the backends mark retryable.
OPTIMIZER_TASK_OPTIONS: dict[str, Any] = {
    "persist_result": True, "result_serializer": "json", "tags": ["llm:optimizer"],
    "retry_condition_fn": retry_only_retryable,
}


def bound(run: Run, task: Any, **options: Any) -> Any:
    """``task`` with ``run``'s result storage, cache refresh setting and cache-hit accounting.

    The ``llm:<role>`` tags of the model-calling tasks are kept only with ``model.rate_limit_mode: prefect``.
    Prefect asks the server for tag concurrency slots before every tagged task run and remembers "no limit
    for these tags" for only 5 s, so with a busy server each stage's first tasks wait for that round trip
    (``bench/README.md``). In ``prefect`` mode the user has chosen Prefect-side limits, and the tags let them
    add tag limits per role too.
    """
    if options:
        return _bind(run, task, options)
    # Bound once per run and task: Prefect builds a new task (its signature, its checks) for every
    # ``with_options``, work that would otherwise come again ahead of each stage's first call.
    with _bound_lock:
        known = _bound.setdefault(run, {}).get(task)
    if known is None:
        known = _bind(run, task, {})
        with _bound_lock:
            known = _bound[run].setdefault(task, known)
    return known


def _bind(run: Run, task: Any, options: dict[str, Any]) -> Any:
    if run.config.model.rate_limit_mode != "prefect" and "tags" not in options:
        options["tags"] = set()
    return task.with_options(result_storage=_storage_of(run), refresh_cache=run.config.run.refresh_cache,
                             on_completion=[cache_hit_hook(run)], **options)


_bound: weakref.WeakKeyDictionary[Run, dict[Any, Any]] = weakref.WeakKeyDictionary()
_bound_lock = threading.Lock()


def _storage_of(run: Run) -> Path:
    """The run's result storage: its cache folder (``Run.build`` made sure it can be written).

    A folder, not a saved ``LocalFileSystem`` block: Prefect builds the same local file system from a path
    itself, where saving a block costs three API round trips at the start of every run, ahead of the
    baseline's first task."""
    return run.cache_dir.resolve()
