"""One rollout, in the library: the target runs an item with a skill and the benchmark scores it.

``roll_out`` is the body of the ``rollout_item`` task (``skillopt.tasks.rollout``) and of the prefetch layer
(``skillopt.run.prefetch``), so both make exactly the same calls; each rollout holds one of the run's
``benchmark.workers`` rollout slots while it runs, whoever makes it. ``rollout_key`` is its cache key;
``Draws`` says which draw of an item each training rollout of an epoch is.

A rollout's key is the request the target gets first, hashed by ``ChatRequest.cache_key`` with the target's
identity and sampling parameters, plus the item's content, the benchmark's settings, the judge's rendered
request and which draw it is: a training rollout carries its epoch and sample index
(``train.resample_each_epoch``), an evaluation rollout neither, so the selection and test splits stay cached
by skill while every epoch samples its training items afresh.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from skillopt.benchmarks.base import Judge
from skillopt.benchmarks.runner import first_messages, plugin_call, run_item
from skillopt.core.data import BatchPlan, Item
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest
from skillopt.llm.clients import BEFORE_SEND
from skillopt.llm.reply_store import PREFETCH
from skillopt.run.cache_keys import call_key, digest
from skillopt.run.item_usage import ItemUsage
from skillopt.skill.document import skill_hash

if TYPE_CHECKING:
    from skillopt.run.assembly import Run


class Slots(Protocol):
    """What a rollout takes its slot from: ``RolloutSlots`` in one process, or slots a cluster shares."""

    size: int

    def acquire(self) -> None: ...

    def release(self) -> None: ...


class RolloutSlots:
    """At most ``size`` rollouts in flight, whoever makes them; a rollout the flow waits for goes before a
    prefetched one (``skillopt.run.prefetch``), so prefetching never keeps the flow's own rollouts waiting."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._busy = 0
        self._flow_waiting = 0
        self._changed = threading.Condition()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """One slot while the block runs."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        """Wait for a slot (a prefetched rollout only when no flow rollout waits) and take it."""
        prefetched = PREFETCH.get()
        with self._changed:
            if not prefetched:
                self._flow_waiting += 1
            try:
                self._changed.wait_for(
                    lambda: self._busy < self.size and (not prefetched or not self._flow_waiting))
            finally:
                if not prefetched:
                    self._flow_waiting -= 1
                    self._changed.notify_all()
            self._busy += 1

    def release(self) -> None:
        with self._changed:
            self._busy -= 1
            self._changed.notify_all()


class LazySlot:
    """One rollout's slot, taken when the rollout first sends a request (``BEFORE_SEND``) and given back when
    it ends: a rollout answered from stored or prefetched replies takes none."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.held = False

    def __call__(self) -> None:
        if not self.held:
            self.slots.acquire()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()


class JudgeVerdict(BaseModel):
    verdict: str
    reason: str = ""


#: Stands in for the prediction when a rollout key renders the judge's request (its prompt texts count).
_OPEN_PREDICTION = "<prediction>"


def rollout_key(run: Run, item: Item, skill: str, *, training: bool, probe_instruction: str | None = None,
                sample: int = 0, epoch: int | None = None, view_seed: int | None = None) -> str:
    """The cache key of one rollout: the request the target gets first (the benchmark's rendered prompt with
    the skill, every prompt text and image in it, the target's identity and sampling parameters) through the
    one key function ``ChatRequest.cache_key``, plus what decides the score (the item's content, the
    benchmark's settings and scoring version, the judge's request with the prediction left open) and which
    draw it is (training feedback, epoch and sample index). With ``view_seed`` the item is the benchmark's
    view of that training batch (e.g. reshuffled choices), so the request and item hashed are that view."""
    item = viewed(run, item, view_seed, training)
    first = ChatRequest(messages=first_messages(run.benchmark, item, skill, run.bench_cfg,
                                                probe_instruction=probe_instruction), stage="rollout")
    judge = run.clients.roles.judge if run.benchmark.needs_judge(run.bench_cfg) else None
    parts = {
        "request": first.cache_key(run.clients.roles.target.fingerprint()),
        "item": item,
        "settings": run.bench_cfg.model_dump(mode="json", exclude={"workers"}),
        # The plug-in's declared scoring version: its author bumps it when score() changes.
        "scoring": run.benchmark.version,
        "judge": _open_judge_key(run, item) if judge else None,
        "training": training, "epoch": epoch, "sample": sample,
    }
    return f"skillopt-rollout-{digest(parts)}"


def _open_judge_key(run: Run, item: Item) -> str:
    """The key of the judge's request for ``item`` with the prediction left open."""
    with plugin_call(run.benchmark, "judge_request", item.id):
        request = run.benchmark.judge_request(item, _OPEN_PREDICTION)
    return judge_call_key(run, request)


def roll_out(run: Run, item: Item, skill: str, *, training: bool, judge: Judge | None,
             probe_instruction: str | None = None, sample: int = 0, epoch: int | None = None,
             view_seed: int | None = None) -> ItemResult:
    """The target runs one item with ``skill``; the benchmark scores it (``judge``: the benchmark's judge,
    when it needs one). A training rollout of a later epoch (or a later sample of the same item) is a new
    draw: ``epoch`` and ``sample`` are in its requests' tags and its seed. With ``view_seed`` (a training
    batch's seed) the item is shown as the benchmark's view of that batch (e.g. reshuffled choices)."""
    item = viewed(run, item, view_seed, training)
    role = run.clients.roles.target
    counted = ItemUsage(run.clients.target, prices=run.clients.ledger.prices, backend=role.backend,
                        price_model=role.price_model)
    target: Any = counted
    draw: dict[str, Any] = {}
    if epoch is not None:
        draw = {"epoch": epoch}
        target = DrawTarget(target, draw_seed(run, epoch, sample))
    slot = LazySlot(run.rollout_slots)
    token = BEFORE_SEND.set(slot)
    try:
        row = run_item(run.benchmark, item, skill, run.bench_cfg, target=target, judge=judge,
                       probe_instruction=probe_instruction, sample=sample,
                       tags={"training": training, "skill_sha": skill_hash(skill)[:16], **draw})
    finally:
        BEFORE_SEND.reset(token)
        slot.release()
    return row.model_copy(update={"worker_pid": os.getpid(), "usage": {**counted.totals(), **row.usage}})


def direct_judge(run: Run) -> Judge:
    """The benchmark's judge as one direct structured call of the judge role (the ``judge_item`` task makes
    the same call, cached)."""

    def judge(item: Item, prediction: str) -> tuple[bool, str]:
        request = run.benchmark.judge_request(item, prediction)
        verdict, _ = run.clients.get("judge").structured(request, JudgeVerdict)
        return verdict.verdict == "correct", verdict.reason

    return judge


def viewed(run: Run, item: Item, view_seed: int | None, training: bool) -> Item:
    if view_seed is None:
        return item
    with plugin_call(run.benchmark, "batch_view", item.id):
        return run.benchmark.batch_view(item, run.bench_cfg, seed=view_seed, training=training)


def draw_seed(run: Run, epoch: int, sample: int) -> int:
    """The sampling seed of one training draw: the target's configured seed (else ``train.seed``) moved on by
    epoch and sample index, so each draw is its own reproducible request."""
    base = run.clients.roles.target.seed
    return (run.config.train.seed if base is None else base) + 1000 * epoch + sample


class DrawTarget:
    """The target client for one training draw: a request that sets no seed of its own gets the draw's seed.

    A later epoch's rollout of an unchanged skill is then a different request from the same prompt (a backend
    that honours seeds samples it reproducibly), and a provider, a proxy or a test sees it as a new call.
    """

    def __init__(self, client: Any, seed: int) -> None:
        self._client = client
        self._seed = seed

    def chat(self, request: ChatRequest) -> Any:
        if request.seed is None:
            request = request.model_copy(update={"seed": self._seed})
        return self._client.chat(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def judge_call_key(run: Run, request: ChatRequest) -> str:
    judge = run.clients.roles.judge
    return call_key(judge.fingerprint() if judge else "", request, JudgeVerdict)


class Draws:
    """Which draw each training rollout of one epoch is (sampling vs caching).

    With ``train.resample_each_epoch`` a training rollout is keyed by its epoch and by how often this epoch
    has drawn the item before (its sample index), so every epoch samples the target afresh even for an
    unchanged skill, and an item drawn twice in one epoch is two samples. Without it, ``epoch`` is None and
    every sample index 0: an unchanged skill replays its cached rollouts. The counts follow the seeded plan,
    so a resumed run asks for exactly the draws the killed one did.
    """

    def __init__(self, epoch: int, *, resample: bool) -> None:
        self.epoch = epoch if resample else None
        self._seen: Counter[str] = Counter()

    def take(self, item_ids: list[str]) -> list[int]:
        """The sample index of each of ``item_ids``, counting them as drawn."""
        samples = self.peek(item_ids)
        if self.epoch is not None:
            self._seen.update(item_ids)
        return samples

    def peek(self, item_ids: list[str]) -> list[int]:
        """The sample indices ``take`` would give ``item_ids`` now, without counting them."""
        if self.epoch is None:
            return [0] * len(item_ids)
        seen: Counter[str] = Counter()
        samples = []
        for item_id in item_ids:
            samples.append(self._seen[item_id] + seen[item_id])
            seen[item_id] += 1
        return samples


def first_batch(run: Run) -> tuple[BatchPlan, Draws] | None:
    """Step 1's first batch and its draws (the first of epoch 1): the training rollouts that may start with
    the baseline (``skillopt.run.prefetch``). None with a budget cap (a cap must be able to stop the run
    before step 1 spends anything) or no step."""
    plan = run.epoch_plan(1)
    if run.config.budget.capped or not plan.steps:
        return None
    return plan.steps[0].batches[0], Draws(1, resample=run.config.train.resample_each_epoch)
