"""Memory Gym tasks (Mortar Mayhem, Mystery Path, Searing Spotlights and their Grid / Endless variants).

Memory Gym draws every environment on pygame's single display, so several instances in one process share it. That is
fine for stepping (each step redraws the whole frame before reading it back), but memory-gym's ``close()`` calls
``pygame.quit()``, which would break every other instance of the process; ``MemoryGymEnv.close`` therefore only closes
the inner environment when it is the last one open.

memory-gym (and pygame with it) is imported only when an environment is built or a config is checked, so that
importing this module to declare the family stays cheap.
"""

import os

import gymnasium
import numpy as np
from gymnasium.envs.registration import load_env_creator

from environments.registry import REQUIRED, EnvFamily, Key, invalid

SEED_KEYS = ("start-seed", "num-seeds")  # reset_params keys read by this wrapper, not passed to memory-gym
DEFAULT_RESET_PARAMS = {"start-seed": 0, "num-seeds": 100000}

# Mortar Mayhem tasks whose episode-end info memory-gym (1.0.2) gets wrong: it reports success 1 and commands_completed
# 1.0 once the last command is checked, even when the agent failed it (with 1 command a random agent "succeeds" in
# every episode), and counts a command as not completed when the agent executed it but then stepped onto an exploding
# tile. The wrapper counts the executed commands itself (_command_executed) and reports those.
_COMMANDS_COUNTED = ("MortarMayhem-v0", "MortarMayhem-Grid-v0")

# MortarMayhemB* observe a dict (vector + image), which the single-image models of this repo cannot take.
_UNSUPPORTED = ("MortarMayhemB-v0", "MortarMayhemB-Grid-v0")

_open_envs = 0  # MemoryGymEnv instances open in this process, see the module docstring


def _import_memory_gym() -> None:
    """Imports memory-gym, which registers its ids with gymnasium; a no-op after the first call."""
    # Silences pygame's import banner and keeps SDL from probing sound devices, which headless machines lack.
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import memory_gym  # noqa: F401


def registered_ids() -> list[str]:
    """Returns the Memory Gym ids that this wrapper supports, e.g. "MortarMayhem-Grid-v0"."""
    _import_memory_gym()
    ids = [name for name, spec in gymnasium.registry.items() if str(spec.entry_point).startswith("memory_gym")]
    return sorted(name for name in ids if name not in _UNSUPPORTED)


def check_reset_params(name: str, reset_params: dict) -> None:
    """Checks reset_params against the task's own defaults and value ranges.

    Args:
        name: A registered Memory Gym id.
        reset_params: The config's ``environment.reset_params``: memory-gym reset parameters plus "start-seed" and
            "num-seeds".

    Raises:
        ValueError: Naming the key as ``environment.reset_params.<key>``, the bad value and what is allowed.
    """
    _import_memory_gym()
    env_class = load_env_creator(gymnasium.registry[name].entry_point)
    defaults = env_class.default_reset_parameters
    for key, value in reset_params.items():
        where = f"environment.reset_params.{key}"
        if key in SEED_KEYS:
            minimum = 1 if key == "num-seeds" else 0
            if not _is_int(value) or value < minimum:
                raise ValueError(f"{where} = {value!r} must be an integer >= {minimum}")
        elif key not in defaults:
            allowed = ", ".join([*SEED_KEYS, *sorted(defaults)])
            raise ValueError(f"{where} is not a reset parameter of {name}; allowed: {allowed}")
        elif not _same_kind(value, defaults[key]):
            raise ValueError(f"{where} = {value!r} must have the type of its default {defaults[key]!r}")
    options = {key: value for key, value in reset_params.items() if key not in SEED_KEYS}
    try:
        env_class.process_reset_params(options)
    except AssertionError as error:  # memory-gym checks value ranges with asserts that mostly carry no message
        detail = str(error) or "a value is out of range"
        raise ValueError(
            f"environment.reset_params = {options!r} fail {env_class.__name__}.process_reset_params ({detail}); "
            f"compare with memory-gym's ranges, e.g. allowed_commands 4..9 and arena_size 2..6 for Mortar Mayhem"
        ) from None


def _is_int(value: object) -> bool:
    """Whether value is an int and not a bool (YAML's true/false would otherwise pass as 1/0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _same_kind(value: object, default: object) -> bool:
    """Whether value can stand in for a memory-gym default: same bool/int/float/list kind, ints allowed for floats."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return _is_int(value)
    if isinstance(default, float):
        return _is_int(value) or isinstance(value, float)
    if isinstance(default, list):
        return isinstance(value, list) and len(value) > 0 and all(_is_int(item) for item in value)
    return isinstance(value, type(default))


class MemoryGymEnv(gymnasium.Wrapper):
    """A Memory Gym task that draws each episode's seed itself and keeps its reset parameters on every reset.

    memory-gym falls back to its default reset parameters whenever ``reset()`` gets no options, which is exactly what
    autoresetting vector envs do. This wrapper therefore ignores the caller's options and, on every reset, samples an
    episode seed uniformly from ``seed_range`` with its own generator and resets the task with that seed and the
    configured parameters. Training draws from [start-seed, start-seed + num-seeds); evaluation from the disjoint
    [start-seed + num-seeds, start-seed + 2 * num-seeds).

    Observations are (3, 84, 84) float32 in [0, 1]. memory-gym reports every episode end as terminated; an end caused
    only by the task's step limit (reset parameter "max_steps") is reported here as truncated instead (see
    ``is_time_limit``).
    """

    def __init__(
        self, name: str, reset_params: dict | None = None, render_mode: str | None = None, evaluation: bool = False
    ) -> None:
        """Builds the task.

        Args:
            name: A registered Memory Gym id, e.g. "MortarMayhem-Grid-v0".
            reset_params: memory-gym reset parameters plus "start-seed" and "num-seeds" (defaults 0 and 100000).
            render_mode: None, "rgb_array", "debug_rgb_array" (frame with the ground truth marked) or "human".
            evaluation: Whether to draw episode seeds from the range just above the training seeds.
        """
        _import_memory_gym()
        super().__init__(gymnasium.make(name, render_mode=render_mode, disable_env_checker=True))
        params = {**DEFAULT_RESET_PARAMS, **(reset_params or {})}
        self._options = {key: value for key, value in params.items() if key not in SEED_KEYS}
        start, count = params["start-seed"], params["num-seeds"]
        self.seed_range = (start + count, start + 2 * count) if evaluation else (start, start + count)
        self._seed_rng = np.random.default_rng()
        self.episode_seed: int | None = None

        width, height, channels = self.env.observation_space.shape  # pygame surfaces are indexed (x, y)
        self.observation_space = gymnasium.spaces.Box(low=0.0, high=1.0, shape=(channels, height, width), dtype=np.float32)

        # memory-gym derives its step limits from the reset parameters only inside reset().
        self.env.reset(seed=start, options=dict(self._options))
        self.max_episode_steps = int(self.env.unwrapped.max_episode_steps)
        self._time_limit = int(self.env.unwrapped.reset_params.get("max_steps", -1))
        self._count_commands = name in _COMMANDS_COUNTED
        self._commands_executed = 0
        self._return = 0.0
        self._length = 0
        self._closed = False
        global _open_envs
        _open_envs += 1

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts an episode with a freshly drawn seed and the configured reset parameters.

        Args:
            seed: Re-seeds the generator that draws episode seeds; None continues its sequence.
            options: Must be None or empty; configure the task through ``environment.reset_params`` instead.

        Returns:
            The first observation (3, 84, 84) and memory-gym's reset info.
        """
        if options:
            raise ValueError(f"options = {options!r}: MemoryGymEnv takes its reset parameters from environment.reset_params")
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        self.episode_seed = int(self._seed_rng.integers(*self.seed_range))
        obs, info = self.env.reset(seed=self.episode_seed, options=dict(self._options))
        self._return = 0.0
        self._length = 0
        self._commands_executed = 0
        if self.render_mode == "human":
            self.env.render()
        return self._observe(obs), info

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Runs one step.

        Args:
            action: An int for Discrete tasks, an int array (branches,) for MultiDiscrete tasks.

        Returns:
            Observation (3, 84, 84), reward, terminated, truncated and info; at the episode's end info["episode"] holds
            reward, length, success (where the task has it) and the task's progress metrics as floats.
        """
        commands_checked = self.env.unwrapped._current_command if self._count_commands else 0
        obs, reward, done, _, info = self.env.step(action)
        if self._count_commands and _command_executed(self.env.unwrapped, commands_checked):
            self._commands_executed += 1
        self._return += float(reward)
        self._length += 1
        truncated = done and is_time_limit(self._length, self._time_limit, info)
        if done:
            numbers = (bool, int, float, np.number, np.bool_)
            episode = {key: float(value) for key, value in info.items() if isinstance(value, numbers)}
            episode.update(reward=self._return, length=float(self._length))
            if self._count_commands:
                commands = self.env.unwrapped.num_commands
                executed = self._commands_executed
                episode.update(success=float(executed == commands), commands_completed=executed / commands)
            info = {**{key: value for key, value in info.items() if key not in episode}, "episode": episode}
        if self.render_mode == "human":
            self.env.render()
        return self._observe(obs), float(reward), done and not truncated, truncated, info

    @staticmethod
    def _observe(obs: np.ndarray) -> np.ndarray:
        """Turns memory-gym's (x, y, 3) uint8 frame into an upright (3, H, W) float32 image in [0, 1]."""
        return np.ascontiguousarray(obs.transpose(2, 1, 0), dtype=np.float32) / 255.0

    def close(self) -> None:
        """Closes the task; pygame itself is only shut down when no other Memory Gym env of this process is open."""
        global _open_envs
        if self._closed:
            return
        self._closed = True
        _open_envs -= 1
        if _open_envs == 0:
            self.env.close()


def _command_executed(task: gymnasium.Env, commands_checked: int) -> bool:
    """Whether the Mortar Mayhem step just taken checked a command and found the agent on its target tile.

    Args:
        task: The unwrapped Mortar Mayhem task after the step.
        commands_checked: Its count of checked commands before the step.
    """
    return task._current_command > commands_checked and task.normalized_agent_position == task._target_pos


def is_time_limit(length: int, time_limit: int, info: dict) -> bool:
    """Whether an episode that ended after ``length`` steps ended only because of the step limit ``time_limit``.

    memory-gym sets its done flag at the limit whatever else happened at that step, so an end at the limit is a
    truncation only if the task itself did not end the episode there: no success, and (Searing Spotlights) the agent
    still alive. A death on the last allowed step is terminal and must not be bootstrapped.
    """
    if length != time_limit:
        return False
    return not info.get("success", 0) and info.get("agent_health", 1.0) > 0


def _check(config: dict) -> None:
    """Checks the Memory Gym id and reset parameters of a validated section; fills in the seed range defaults."""
    names = registered_ids()
    if not isinstance(config["name"], str) or config["name"] not in names:
        raise invalid("name", config["name"], f"use a registered Memory Gym id: {', '.join(names)}")
    config["reset_params"] = {**DEFAULT_RESET_PARAMS, **config["reset_params"]}
    check_reset_params(config["name"], config["reset_params"])


FAMILY = EnvFamily(
    name="MemoryGym",
    schema={
        "name": Key(REQUIRED, "a Memory Gym id, e.g. MortarMayhem-Grid-v0"),
        "reset_params": Key(dict(DEFAULT_RESET_PARAMS), "memory-gym reset parameters plus the seed range"),
    },
    check=_check,
    render_modes=(None, "rgb_array", "debug_rgb_array", "human"),
    make=lambda config, render_mode, evaluation: MemoryGymEnv(**config, render_mode=render_mode, evaluation=evaluation),
)
