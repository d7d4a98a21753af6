"""The stages' tasks as plain calls, for work done ahead of the flow (``skillopt.early_start``).

While ``AHEAD`` is set in a context, ``bound`` gives a task's function itself instead of the Prefect task,
and ``pool_for`` a plain thread pool: the stage functions of ``flows/stages.py`` then make their model calls
without a task run, and each reply is kept for the flow's own task that asks for it later (``ReplyStore.
take_ahead``). Nothing else of the run changes: no run file is written, no Prefect run is created, no live
line is shown, and the error streak is left to the flow.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from skillopt.llm.reply_store import AHEAD

log = logging.getLogger(__name__)


def ahead() -> bool:
    """Whether this context works ahead of the flow."""
    return AHEAD.get()


class AheadTask:
    """A task's function, called directly (``task(...)``) or in a thread (``task.submit(...)``)."""

    def __init__(self, task: Any) -> None:
        self.fn = task.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> AheadFuture:
        return AheadFuture(_in_thread(self.fn, *args, **kwargs))


class AheadFuture:
    """The ``result``/``wait`` of a Prefect future, over a thread's future."""

    def __init__(self, future: Future[Any]) -> None:
        self._future = future

    def result(self) -> Any:
        return self._future.result()

    def wait(self) -> None:
        self._future.exception()


class AheadPool:
    """``runner.submit(task, parameters)`` of a Prefect task runner, on a plain thread pool."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool

    def submit(self, task: Any, parameters: dict[str, Any]) -> AheadFuture:
        call = task if isinstance(task, AheadTask) else AheadTask(task)
        context = contextvars.copy_context()  # AHEAD holds in the pool's threads too
        return AheadFuture(self._pool.submit(lambda: context.run(call, **parameters)))


@contextmanager
def ahead_pool(workers: int) -> Iterator[AheadPool]:
    """A plain pool ``workers`` wide, shut down (its calls finished) when the stage leaves it."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="skillopt-ahead") as pool:
        yield AheadPool(pool)


def calls_first(run: Any, task: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], *,
                workers: int) -> None:
    """Start the model call of each of ``calls`` (the arguments of one run of the optimizer ``task``) now, at
    most ``workers`` at once, ahead of the task runs the flow makes next with the same arguments.

    Prefect's start of a task run (its run, its states, its cache key) takes 5-10 ms of the interpreter, so a
    stage's calls each left that much after the one before, and a stage of one call that much after the
    stage before it. Here each call is the task's function in an ``AHEAD`` context: its reply is kept, and the
    task's own call takes it as its call (``ReplyStore.take_ahead``), made, paid and recorded once; a call
    still in flight is waited for (``ReplyStore.claim``). A call that fails is left to its task, which makes
    it again with its retries. A re-run finds every reply stored and calls nothing.

    Only where the run starts its rollouts early (``Run.early``: its calls run in this process under its
    limits, and the optimizer's replies are stored), and not from work already ahead of the flow."""
    if ahead() or not calls or run.early is None or run.clients.optimizer.replies is None:
        return
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls))),
                              thread_name_prefix="skillopt-first")
    for args, kwargs in calls:
        pool.submit(_ahead_quietly, task.fn, args, kwargs)
    pool.shutdown(wait=False)


def _ahead_quietly(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    token = AHEAD.set(True)
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the task makes the call again and reports its error
        log.debug("a call made ahead of its task failed: %s", error)
    finally:
        AHEAD.reset(token)


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
    """``fn`` in a thread of its own, in this context (``AHEAD`` holds there too)."""
    future: Future[Any] = Future()
    context = contextvars.copy_context()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(fn, *args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - handed to whoever asks for the result
            future.set_exception(error)

    threading.Thread(target=run, name="skillopt-ahead", daemon=True).start()
    return future
