"""The ALFWorld environment behind one interface: a fake text world for offline
runs and an adapter over the real ``alfworld`` package (imported only when a real game starts).

An env manager runs one game. ``reset()`` returns ``(obs, infos)`` and ``step([action])`` returns
``(obs, rewards, dones, infos)``; ``obs`` is ``{"text": [str], "image": None, "anchor": [str]}``
and each ``infos`` entry holds ``extra.gamefile``, ``admissible_commands`` (a list of commands)
and, after a step, ``won``. Lists have one entry because a manager holds one game.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from skillopt.core.errors import BenchmarkSetupError

#: The six task types, keyed by the prefix of a task directory (longest match first).
TASK_TYPE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("pick_cool_then_place_in_recep", "pick_cool_then_place_in_recep"),
    ("pick_heat_then_place_in_recep", "pick_heat_then_place_in_recep"),
    ("pick_clean_then_place_in_recep", "pick_clean_then_place_in_recep"),
    ("pick_two_obj_and_place", "pick_two_obj_and_place"),
    ("look_at_obj_in_light", "look_at_obj_in_light"),
    ("pick_and_place_simple", "pick_and_place"),
    ("pick_and_place", "pick_and_place"),
)
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place", "pick_two_obj_and_place", "look_at_obj_in_light",
    "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_clean_then_place_in_recep",
)
#: The templated goal of each task type (the real environment's goals read the same way).
_GOALS = {
    "pick_and_place": "put some {obj} in {recep}.",
    "pick_two_obj_and_place": "put two {obj} in {recep}.",
    "look_at_obj_in_light": "look at {obj} under the {recep}.",
    "pick_heat_then_place_in_recep": "heat some {obj} and put it in {recep}.",
    "pick_cool_then_place_in_recep": "cool some {obj} and put it in {recep}.",
    "pick_clean_then_place_in_recep": "clean some {obj} and put it in {recep}.",
}
TASK_MARKER = "Your task is to: "
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
NOTHING_HAPPENS = "Nothing happens."
#: The fake world's one winning command.
FAKE_WINNING_COMMAND = "go to microwave 1"
WIN_REWARD = 10.0
INSTALL_HINT = "pip install 'skillopt[alfworld]'"
DATA_VARIABLE = "ALFWORLD_DATA"


class EnvManager(Protocol):
    """One ALFWorld game. ``step`` takes one action per game (here: a one-element list)."""

    def reset(self) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...

    def step(
        self, actions: Sequence[str]
    ) -> tuple[dict[str, Any], list[float], list[bool], list[dict[str, Any]]]: ...

    def close(self) -> None: ...


def task_directory(gamefile: str) -> str:
    """The task directory of a gamefile path: ``<type>-<Object>-<Mrecep>-<Recep>-<scene>``, the
    folder above the ``trial_…`` folder (or the gamefile's own folder when there is none)."""
    parts = Path(gamefile).parts
    for index, part in enumerate(parts):
        if part.startswith("trial_") and index > 0:
            return parts[index - 1]
    return parts[-2] if len(parts) >= 2 else ""


def task_type_of(gamefile: str) -> str | None:
    """The task type from the task directory's prefix before the first ``-``, longest match first;
    None when the prefix names none of the six types."""
    return task_type_named(task_directory(gamefile).split("-", 1)[0])


def task_type_named(prefix: str) -> str | None:
    """One of the six task types for a label such as ``pick_and_place_simple``, or None."""
    for known, task_type in TASK_TYPE_PREFIXES:
        if prefix == known or prefix.startswith(known):
            return task_type
    return None


def goal_of(gamefile: str) -> str:
    """The templated goal sentence for a gamefile (from its task directory), e.g. ``heat some apple
    and put it in countertop.``; a generic sentence when the directory does not follow the pattern."""
    fields = task_directory(gamefile).split("-")
    task_type = task_type_of(gamefile)
    if task_type is None or len(fields) < 4:
        return "complete the household task."
    obj, recep = fields[1].lower(), fields[3].lower()
    return _GOALS[task_type].format(obj=obj, recep=recep)


def eval_split_of(gamefile: str) -> str:
    """``train``, ``eval_in_distribution`` (valid_seen) or ``eval_out_of_distribution`` (valid_unseen),
    from the gamefile's own path."""
    parts = set(Path(gamefile).parts)
    if "valid_unseen" in parts:
        return "eval_out_of_distribution"
    if "valid_seen" in parts:
        return "eval_in_distribution"
    return "train"


# --------------------------------------------------------------------------------------------- fake


class FakeEnvManager:
    """A small deterministic text world for one gamefile (no ``alfworld`` needed).

    The welcome observation names the room's receptacles and the goal built from the gamefile's
    task directory. Admissible commands: ``look``, ``inventory``, ``go to microwave 1``, ``go to
    <receptacle> 1`` and ``help``. Only ``go to microwave 1`` wins (reward 10, done); ``look``
    describes the room again; anything else gets ``Nothing happens.``. The game never ends by
    itself: the agent loop's step budget does.
    """

    def __init__(self, gamefile: str) -> None:
        self.gamefile = gamefile
        self.goal = goal_of(gamefile)
        fields = task_directory(gamefile).split("-")
        recep = fields[3].lower() if len(fields) >= 4 else "countertop"
        self.places = sorted({"microwave", "shelf", recep})
        self.commands = ["look", "inventory", FAKE_WINNING_COMMAND,
                         *[f"go to {place} 1" for place in self.places if place != "microwave"], "help"]
        self.won = False

    def _room(self) -> str:
        seen = ", ".join(f"a {place} 1" for place in self.places)
        return f"You are in the middle of a room. Looking quickly around you, you see {seen}."

    def _obs(self, text: str) -> dict[str, Any]:
        return {
            "text": [text],
            "image": None,
            "anchor": [f"{WELCOME}\n\n{self._room()}\n\n{TASK_MARKER}{self.goal}"],
        }

    def _infos(self) -> list[dict[str, Any]]:
        return [
            {"extra.gamefile": self.gamefile, "admissible_commands": list(self.commands), "won": self.won}
        ]

    def reset(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.won = False
        welcome = f"{WELCOME}\n\n{self._room()}\n\n{TASK_MARKER}{self.goal}"
        return self._obs(welcome), self._infos()

    def step(
        self, actions: Sequence[str]
    ) -> tuple[dict[str, Any], list[float], list[bool], list[dict[str, Any]]]:
        action = (actions[0] if actions else "").strip().lower()
        if action == FAKE_WINNING_COMMAND:
            self.won = True
            text = f"You arrive at microwave 1 and finish the task: {self.goal}"
            return self._obs(text), [WIN_REWARD], [True], self._infos()
        text = self._room() if action == "look" else NOTHING_HAPPENS
        return self._obs(text), [0.0], [False], self._infos()

    def close(self) -> None:
        return None


# --------------------------------------------------------------------------------------------- real


def alfworld_data_roots(configured: str | None, data_folder: str | None,
                        env: Mapping[str, str] | None = None) -> list[Path]:
    """Where relative gamefiles and the game logic are looked for, in order: ``benchmark.alfworld_data``
    when set (alone); otherwise the ``--data`` folder, then ``$ALFWORLD_DATA``."""
    env = os.environ if env is None else env
    values = [configured] if configured else [data_folder, env.get(DATA_VARIABLE)]
    roots: list[Path] = []
    for value in values:
        if value and Path(value).expanduser() not in roots:
            roots.append(Path(value).expanduser())
    return roots


def logic_files(root: Path) -> list[Path]:
    return [root / "logic" / "alfred.pddl", root / "logic" / "alfred.twl2"]


def game_data_root(roots: Sequence[Path]) -> Path:
    """The first root holding the downloaded game logic; ``BenchmarkSetupError`` naming ``$ALFWORLD_DATA``
    when none does."""
    for root in roots:
        if all(path.is_file() for path in logic_files(root)):
            return root
    where = (
        ", ".join(str(root) for root in roots)
        or f"nothing (benchmark.alfworld_data and ${DATA_VARIABLE} are unset)"
    )
    raise BenchmarkSetupError(
        f"alfworld: no ALFWorld game data at {where}: expected logic/alfred.pddl and logic/alfred.twl2; "
        f"run alfworld-download and set ${DATA_VARIABLE} (or benchmark.alfworld_data) to its folder")


def check_alfworld_installed() -> None:
    """``BenchmarkSetupError`` naming the extra when ``alfworld`` or ``textworld`` cannot be imported."""
    try:
        import alfworld.agents.environment  # noqa: F401
        import textworld  # noqa: F401
    except ImportError as exc:
        raise BenchmarkSetupError(
            f"alfworld: the real environment needs the alfworld package ({exc}); install it with "
            f"{INSTALL_HINT}, then run alfworld-download and set ${DATA_VARIABLE} (or "
            "benchmark.alfworld_data), or set benchmark.env_manager: fake for the simulated world") from None


def alfworld_config(data_root: Path, trial_dir: Path, max_steps: int) -> dict[str, Any]:
    """The packaged TextWorld settings for one game: handcoded expert, no domain randomisation,
    task types 1–6, every dataset path pointing at the game's own trial folder (so the environment
    collects exactly that game)."""
    trial = str(trial_dir)
    return {
        "dataset": {"data_path": trial, "eval_id_data_path": trial, "eval_ood_data_path": trial,
                    "num_train_games": -1, "num_eval_games": -1},
        "logic": {"domain": str(data_root / "logic" / "alfred.pddl"),
                  "grammar": str(data_root / "logic" / "alfred.twl2")},
        "env": {"type": "AlfredTWEnv", "regen_game_files": False, "domain_randomization": False,
                "task_types": [1, 2, 3, 4, 5, 6], "expert_timeout_steps": 150, "expert_type": "handcoded",
                "goal_desc_human_anns_prob": 0.0},
        "general": {"training_method": "dagger", "random_seed": 42},
        "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
        "rl": {"training": {"max_nb_steps_per_episode": max_steps}},
    }


class AlfworldEnvManager:
    """One real ALFWorld game through ``alfworld.agents.environment.AlfredTWEnv`` (batch size 1).

    The package is imported here, when the game starts; ``check_alfworld_installed`` and
    ``game_data_root`` run at preflight so a missing extra or download never reaches a rollout.
    """

    def __init__(self, gamefile: str, *, data_root: Path, seed: int, max_steps: int) -> None:
        from alfworld.agents.environment import get_environment

        env_class = get_environment("AlfredTWEnv")
        config = alfworld_config(data_root, Path(gamefile).parent, max_steps)
        self.gamefile = gamefile
        self._env = env_class(config, train_eval=eval_split_of(gamefile)).init_env(batch_size=1)
        seed_env = getattr(self._env, "seed", None)
        if callable(seed_env):
            seed_env(seed)
        self._anchor: list[str] = []

    @staticmethod
    def _obs(texts: Sequence[str], anchor: Sequence[str]) -> dict[str, Any]:
        return {"text": list(texts), "image": None, "anchor": list(anchor)}

    def _infos(self, infos: Mapping[str, Any]) -> list[dict[str, Any]]:
        won = infos.get("won") or [False]
        commands = infos.get("admissible_commands") or [[]]
        gamefile = infos.get("extra.gamefile") or [self.gamefile]
        return [
            {"extra.gamefile": gamefile[0], "admissible_commands": list(commands[0]), "won": bool(won[0])}
        ]

    def reset(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        texts, infos = self._env.reset()
        self._anchor = list(texts)
        return self._obs(texts, self._anchor), self._infos(infos)

    def step(
        self, actions: Sequence[str]
    ) -> tuple[dict[str, Any], list[float], list[bool], list[dict[str, Any]]]:
        texts, scores, dones, infos = self._env.step(list(actions))
        won = self._infos(infos)
        rewards = [WIN_REWARD * float(entry["won"]) for entry in won]
        return self._obs(texts, self._anchor), rewards, [bool(done) for done in dones], won

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()


def first_text(obs: Mapping[str, Any]) -> str:
    texts = obs.get("text") or [""]
    return str(texts[0])


def task_from_observation(text: str) -> str:
    """The task sentence: the first observation's text after ``Your task is to: ``."""
    _, found, rest = text.partition(TASK_MARKER)
    return rest.strip().splitlines()[0].strip() if found and rest.strip() else ""


_WS = re.compile(r"\s+")


def normalise_command(text: str) -> str:
    """Lowercased, whitespace collapsed: how actions are compared with the admissible commands."""
    return _WS.sub(" ", text.strip().lower())
