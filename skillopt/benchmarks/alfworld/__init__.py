"""ALFWorld (``alfworld``): text household tasks played step by step in an environment.

Items are ``{id, gamefile, task_type}`` (native ``items.json``); ``gamefile`` is relative to
``alfworld_data`` (by default the ``--data`` folder, else ``$ALFWORLD_DATA``) or absolute. Loading
adds the resolved path, the goal sentence and the game's index (its seed offset); split files keep
the raw form.

:meth:`AlfworldBenchmark.run_episode` plays one game through an env manager (:mod:`.env`): each
step the target sees the task, the recent history, the observation and the admissible commands,
reasons in ``<think>`` and names one command in ``<action>``. The episode's outcome is handed to
:meth:`AlfworldBenchmark.score` as a JSON record (the episode's "response"): hard = soft = won.
``benchmark.env_manager: auto`` picks the fake world when the target backend is ``scripted``
(settled by :meth:`AlfworldBenchmark.bind_target` before preflight), else the real environment.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from skillopt.benchmarks.alfworld.env import (
    DATA_VARIABLE,
    TASK_TYPES,
    AlfworldEnvManager,
    EnvManager,
    FakeEnvManager,
    alfworld_data_roots,
    check_alfworld_installed,
    first_text,
    game_data_root,
    goal_of,
    normalise_command,
    task_from_observation,
    task_type_named,
    task_type_of,
)
from skillopt.benchmarks.answers import quote_answer
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.grading import hidden_reference_block
from skillopt.benchmarks.rows import confined_path
from skillopt.benchmarks.runner import READOUT_HEADING
from skillopt.core.data import Item
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import ChatRequest, Message, user

BENCHMARK_ID = "alfworld"
NATIVE_EXTENSIONS = (".json",)
#: The item keys loading adds (never written to split files).
GAME_PATH_KEY, GOAL_KEY, INDEX_KEY = "game_path", "task", "game_index"
HISTORY_STEPS = 2
FALLBACK_ACTION = "look"
HIDDEN_COMMANDS = frozenset({"help"})
SIMULATED_NOTE = (
    "the environment is simulated (benchmark.env_manager: fake): a small fake text world stands in for "
    "ALFWorld, so scores say nothing about the real benchmark"
)

_SYSTEM_INTRO = (
    "You are an agent in a text-based household environment. Each turn you read what you observe, "
    "think about the task, and choose exactly one of the admissible commands."
)
_FORMAT = (
    "Reason step by step inside <think>…</think>, then give exactly one admissible command, copied "
    "as written, inside <action>…</action>."
)
_EPISODE_INTRO = (
    "A household game starts now. Each of the following messages shows the observation and the "
    "admissible commands for one step."
)
_THINK = re.compile(r"<think>(.*?)</think>", re.IGNORECASE | re.DOTALL)
_ACTION = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


class AlfworldConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``alfworld``: the game data, the env manager and the step loop."""

    #: The folder gamefiles are relative to (holds ``json_2.1.1/`` and, for the real env, ``logic/``).
    #: Unset: the ``--data`` folder, else ``$ALFWORLD_DATA``.
    alfworld_data: str | None = None
    #: ``auto``: ``fake`` when the target backend is ``scripted``, else ``alfworld`` (the real game).
    env_manager: Literal["auto", "alfworld", "fake"] = "auto"
    #: The most environment steps (target calls) of one game.
    max_steps: int = Field(default=50, ge=1)
    #: The most target calls in flight at once across the games of a rollout.
    max_api_workers: int = Field(default=8, ge=1)
    #: The target's output cap per step (a per-call override of model.target.max_tokens).
    max_tokens: int = Field(default=2048, ge=1)


# ----------------------------------------------------------------------------------------- loading


def normalise_row(row: Mapping[str, Any], roots: Sequence[Path] = ()) -> dict[str, Any]:
    """An ALFWorld item (idempotent): ``id`` and ``gamefile`` are required; ``task_type`` is the
    task-directory prefix mapped onto the six types when the row has none. A gamefile that resolves
    outside ``roots`` raises ``ValueError``. Raises ``KeyError(field)`` or
    ``ValueError``; the loader names the file and the row."""
    for name in ("id", "gamefile"):
        value = row.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise KeyError(name)
        if not isinstance(value, str | int):
            raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    gamefile = str(row["gamefile"]).strip()
    # The gamefile's task directory decides; a row's own label counts only when the path names no type.
    label = str(row.get("task_type") or "").strip()
    task_type = task_type_of(gamefile) or task_type_named(label) or label
    if not task_type:
        raise ValueError(f"field 'task_type' is missing and the gamefile's task directory names no task type "
                         f"({', '.join(TASK_TYPES)}): {quote_answer(gamefile)}")
    resolve_gamefile(gamefile, roots)  # a gamefile leaving the data roots is a bad row
    item = {"id": str(row["id"]), "gamefile": gamefile, "task_type": str(task_type)}
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def resolve_gamefile(gamefile: str, roots: Sequence[Path]) -> Path:
    """The gamefile confined to ``roots`` (a path resolving outside them raises ``ValueError``):
    under the first root that holds it, else under the first root, so a miss names where it was
    expected."""
    found = confined_path(gamefile, roots, field="gamefile")
    if found is not None:
        return found
    path = Path(gamefile).expanduser()
    return path if path.is_absolute() or not roots else (roots[0] / path)


# ----------------------------------------------------------------------------------------- prompts


def parse_reply(text: str) -> tuple[str, str, bool]:
    """``(reasoning, action, valid)``: the action is the lowercased text of the first ``<action>``
    pair; no action (or an empty one) → ``look`` and invalid; a missing ``<think>`` → invalid."""
    think = _THINK.search(text or "")
    action = _ACTION.search(text or "")
    command = normalise_command(action.group(1)) if action else ""
    if not command:
        return (think.group(1).strip() if think else ""), FALLBACK_ACTION, False
    return (think.group(1).strip() if think else ""), command, think is not None


def commands_block(commands: Sequence[str]) -> str:
    shown = [command for command in commands if normalise_command(command) not in HIDDEN_COMMANDS]
    return "Admissible commands:\n" + "\n".join(f"'{command}'" for command in shown)


def step_prompt(*, task: str, step: int, observation: str, history: Sequence[tuple[str, str]],
                commands: Sequence[str]) -> str:
    """The user message of one step. Step 0: the observation. Later: the task, the steps taken, the
    last ``HISTORY_STEPS`` (observation, action) pairs and the current step with its observation.
    Always closes with the admissible commands (``help`` left out) and the answer format."""
    if step == 0:
        parts = [f"## Observation\n{observation}"]
    else:
        recent = history[-HISTORY_STEPS:]
        first = step - len(recent) + 1  # steps are numbered from 1, as in the env_step events
        lines = [
            f"[Observation {first + k}] {obs}\n[Action {first + k}] {act}"
            for k, (obs, act) in enumerate(recent)
        ]
        parts = [f"## Task\n{task}", f"## Progress\nYou have taken {step} step(s). Your most recent steps:\n"
                 + "\n".join(lines), f"## Current step {step + 1}\n{observation}"]
    parts += [commands_block(commands), _FORMAT]
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------------ plugin


class AlfworldBenchmark(Benchmark[AlfworldConfig]):
    """The ``alfworld`` plug-in.

    ``env`` supplies ``$ALFWORLD_DATA`` (the process environment by default; tests pass a dict).
    ``env_factory(item, config)``, when given, builds the env manager of every game (tests inject
    scripted worlds through it); otherwise ``env_manager`` decides.
    """

    id = BENCHMARK_ID
    extras = ("alfworld",)
    Config = AlfworldConfig
    default_task_type = "pick_and_place"
    native_extensions = NATIVE_EXTENSIONS
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/ items.json and the "
                 "json_2.1.1/ game files) or set benchmark.split_dir")

    def __init__(self, env: Mapping[str, str] | None = None, env_factory: Any = None) -> None:
        self.env: Mapping[str, str] = env if env is not None else os.environ
        self.env_factory = env_factory
        self._slots_lock = threading.Lock()
        self._slots: dict[int, threading.BoundedSemaphore] = {}

    def data_roots(self, cfg: AlfworldConfig) -> list[Path]:
        """Where gamefiles and game data are looked for: ``alfworld_data``, else ``--data`` then
        ``$ALFWORLD_DATA``."""
        config = self.config(cfg)
        return alfworld_data_roots(config.alfworld_data, config.data_root, self.env)

    def normalise_row(self, row: Mapping[str, Any], cfg: AlfworldConfig) -> dict[str, Any]:
        return normalise_row(row, self.data_roots(cfg))

    def load_split(self, cfg: AlfworldConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` with the resolved gamefile, the goal sentence and the game index."""
        roots = self.data_roots(cfg)
        items = super().load_split(self.config(cfg), split, run_dir=run_dir)
        return [Item({**item, GAME_PATH_KEY: str(resolve_gamefile(item["gamefile"], roots)),
                      GOAL_KEY: goal_of(item["gamefile"]), INDEX_KEY: index})
                for index, item in enumerate(items)]

    def bind_target(
        self, cfg: AlfworldConfig, *, backend: str, kind: str
    ) -> tuple[AlfworldConfig, list[str]]:
        """Settle ``env_manager: auto`` (``fake`` under the ``scripted`` backend, else ``alfworld``);
        an exec-backend target is a setup error (the loop needs a chat target)."""
        config = self.config(cfg)
        if kind == "exec":
            raise BenchmarkSetupError(
                f"alfworld plays a step-by-step chat loop; the target backend {backend} is an exec backend "
                "and cannot play it: use a chat backend (openai, anthropic, openai_compatible, local, "
                "scripted)")
        manager = config.env_manager
        if manager == "auto":
            manager = "fake" if backend == "scripted" else "alfworld"
        bound = config.model_copy(update={"env_manager": manager})
        return bound, [SIMULATED_NOTE] if manager == "fake" else []

    def max_target_calls(self, cfg: AlfworldConfig) -> int:
        """One call per step of the game."""
        return cfg.max_steps

    def build_messages(self, item: Item, skill: str, cfg: AlfworldConfig) -> list[Message]:
        """System: the household agent, the skill, the answer format. User: the episode opener (the
        observations come from the environment, one message per step). Never reads gold."""
        return [self.system_message(_SYSTEM_INTRO, skill, _FORMAT), user(_EPISODE_INTRO)]

    def make_env(self, item: Item, config: AlfworldConfig) -> EnvManager:
        """The env manager for one game (``auto`` here means the real one: ``bind_target`` settles it)."""
        if self.env_factory is not None:
            return self.env_factory(item, config)
        if config.env_manager == "fake":
            return FakeEnvManager(str(item[GAME_PATH_KEY]))
        check_alfworld_installed()
        return AlfworldEnvManager(
            str(item[GAME_PATH_KEY]),
            data_root=game_data_root(self.data_roots(config)),
            seed=config.split_seed + int(item.get(INDEX_KEY, 0)),
            max_steps=config.max_steps,
        )

    def _api_slots(self, workers: int) -> threading.BoundedSemaphore:
        with self._slots_lock:
            return self._slots.setdefault(workers, threading.BoundedSemaphore(workers))

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult:
        """Play one game: up to ``max_steps`` target calls, one env step each, until the env reports
        done. Each step is an ``env_step`` event. Past ``ctx.deadline`` no call starts; a target
        error propagates (the env is closed either way). Returns the outcome record as JSON."""
        config = self.config(ctx.cfg)
        readout = _readout(ctx.messages)
        system_message = next(m for m in ctx.messages if m.role == "system")
        slots = self._api_slots(config.max_api_workers)
        env = self.make_env(item, config)
        outcome: dict[str, Any] = {"won": False, "done": False, "steps": 0, "invalid_actions": 0,
                                   "last_action": "", "gamefile": item["gamefile"]}
        try:
            obs, infos = env.reset()
            observation = first_text(obs)
            task = task_from_observation(observation) or str(item.get(GOAL_KEY, ""))
            outcome["task"] = task
            ctx.record({"type": "message", "role": "user", "turn": 0, "content": observation})
            history: list[tuple[str, str]] = []
            for step in range(config.max_steps):
                if time.monotonic() > ctx.deadline:
                    break
                prompt = step_prompt(task=task, step=step, observation=observation, history=history,
                                     commands=infos[0].get("admissible_commands", []))
                request = ChatRequest(messages=[system_message, user(prompt + readout)], stage="rollout",
                                      max_tokens=config.max_tokens, tags={**ctx.tags, "turn": step + 1})
                with slots:
                    text = ctx.target.chat(request).text
                reasoning, action, valid = parse_reply(text)
                obs, rewards, dones, infos = env.step([action])
                history.append((observation, action))
                observation = first_text(obs)
                won = bool(infos[0].get("won"))
                ctx.record({"type": "env_step", "step": step + 1, "reasoning": reasoning, "action": action,
                            "observation": observation, "reward": float(rewards[0]), "done": bool(dones[0]),
                            "valid": valid})
                outcome.update(steps=step + 1, last_action=action, won=won, done=bool(dones[0]))
                outcome["invalid_actions"] += 0 if valid else 1
                if dones[0]:
                    break
        finally:
            env.close()
        outcome["max_steps"] = config.max_steps
        return EpisodeResult(json.dumps(outcome, sort_keys=True), n_turns=outcome["steps"],
                             answered=outcome["steps"] > 0)

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = soft = won. fail_reason: ``wrong: step limit reached (<N>)`` or ``wrong: episode
        ended without success``. Extras: ``gamefile``, ``invalid_actions``. Never calls the judge."""
        try:
            outcome = json.loads(response_text)
        except json.JSONDecodeError:
            outcome = None
        if not isinstance(outcome, dict):
            return Score(hard=0.0, soft=0.0, fail_reason="no-answer: no episode was played",
                         extras={"gamefile": item["gamefile"], "invalid_actions": 0}, expected="won")
        won = bool(outcome.get("won"))
        steps = int(outcome.get("steps", 0))
        if won:
            fail = ""
        elif outcome.get("done"):
            fail = "wrong: episode ended without success"
        else:
            fail = f"wrong: step limit reached ({outcome.get('max_steps', steps)})"
        extras = {"gamefile": item["gamefile"], "invalid_actions": int(outcome.get("invalid_actions", 0))}
        detail = (f"task: {outcome.get('task', '')}; steps {steps}; invalid actions "
                  f"{extras['invalid_actions']}; last action "
                  f"'{quote_answer(str(outcome.get('last_action', '')))}'")
        reference = hidden_reference(Path(str(item.get(GAME_PATH_KEY) or item["gamefile"])))
        return Score(hard=float(won), soft=float(won), predicted_answer=str(outcome.get("last_action", "")),
                     fail_reason=fail, extras=extras, expected="won",
                     detail=detail + (f"\n{reference}" if reference else ""))

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """The task types present, sorted (the six types when there are no items)."""
        return sorted({item.task_type for item in items}) or list(TASK_TYPES)

    def preflight(self, cfg: AlfworldConfig) -> None:
        """The split folder and every item's gamefile (whichever env manager runs); for the real env
        manager also the ``alfworld`` package and the downloaded game logic. Each miss raises
        ``BenchmarkSetupError`` saying how to fix it."""
        config = self.config(cfg)
        super().preflight(config)
        if config.env_manager != "fake":
            check_alfworld_installed()
            game_data_root(self.data_roots(config))
        with tempfile.TemporaryDirectory(prefix="skillopt-alfworld-") as scratch:
            items = [item for split in ("train", "val", "test")
                     for item in self.load_split(config, split, run_dir=Path(scratch))]
        missing = [item for item in items if not Path(item[GAME_PATH_KEY]).is_file()]
        if missing:
            shown = ", ".join(f"{item.id} ({item[GAME_PATH_KEY]})" for item in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise BenchmarkSetupError(
                f"alfworld: {len(missing)} gamefile(s) not found: {shown}{more}; set benchmark.alfworld_data "
                f"(or ${DATA_VARIABLE}) to the folder holding json_2.1.1/, or pass --data with the game files"
            )


def hidden_reference(gamefile: Path) -> str:
    """The analyst-only block from ``traj_data.json`` beside the gamefile: the target object and
    receptacle, the expert's high-level plan and the annotated task; empty when there is none."""
    path = gamefile.parent / "traj_data.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(data, dict):
        return ""
    params = data.get("pddl_params") or {}
    plan = (data.get("plan") or {}).get("high_pddl") or []
    steps = [_plan_step(step) for step in plan]
    anns = (data.get("turk_annotations") or {}).get("anns") or []
    desc = anns[0].get("task_desc", "") if anns and isinstance(anns[0], dict) else ""
    lines = []
    if params:
        lines.append(f"Target: {params.get('object_target', '')}; receptacle: "
                     f"{params.get('parent_target', '')}")
    if steps:
        lines.append("Expert plan: " + " → ".join(steps))
    if desc:
        lines.append(f"Annotated task: {desc}")
    return hidden_reference_block(lines)


def _plan_step(step: Any) -> str:
    """One expert plan step: a string as is; ALFRED's ``{"discrete_action": {"action", "args"}}`` as
    ``Action(arg, …)``."""
    action = step.get("discrete_action", step) if isinstance(step, dict) else step
    if isinstance(action, dict) and "action" in action:
        return f"{action['action']}({', '.join(str(arg) for arg in action.get('args') or [])})"
    return str(action)


def _readout(messages: Sequence[Message]) -> str:
    """The training readout the runner appended to the opener (deep probes), to repeat every step."""
    users = [m.text() for m in messages if m.role == "user"]
    _, found, rest = (users[-1] if users else "").partition(READOUT_HEADING)
    return f"\n\n{READOUT_HEADING}{rest}" if found else ""


plugin = AlfworldBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "AlfworldBenchmark",
    "AlfworldConfig",
    "hidden_reference",
    "normalise_row",
    "parse_reply",
    "plugin",
    "step_prompt",
]
