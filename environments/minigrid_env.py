"""MiniGrid tasks (any registered MiniGrid-* id) with a small egocentric view, rendered or symbolic.

The Memory tasks are the reference's: a 3x3 view rendered to 84x84 RGB. The symbolic observation (MiniGrid's own grid
encoding, one-hot per cell) needs no rendering, which makes MiniGrid tasks cheap enough for a CPU; the seven actions
(``actions: all``) open the tasks that need pickup or toggle, such as DoorKey.

The minigrid package (and pygame with it) is imported only when an environment is built or a config is checked, so
that importing this module to declare the family stays cheap.
"""

import difflib
import functools

import gymnasium
import numpy as np

from environments.gymnasium_env import OneHot, one_hot_blocks
from environments.registry import EnvFamily, Key, invalid

OBSERVATIONS = ("rgb", "symbolic")
ACTION_SETS = {"navigation": 3, "all": 7}  # MiniGrid's first n actions
_ACTION_NAMES = ("left", "right", "forward", "pickup", "drop", "toggle", "done")


def _one_hot_sizes() -> tuple[int, int, int]:
    """The sizes of MiniGrid's object type, colour and state vocabularies: 11, 6 and 3 in minigrid 3.x."""
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

    return len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX)


class MiniGridEnv(gymnasium.Wrapper):
    """A MiniGrid task with a partial view, seen as an RGB image or as MiniGrid's symbolic grid encoding.

    The agent sees a view_size x view_size patch in front of it. ``rgb``: the patch rendered with tile_size pixels per
    cell, channel-first float32 in [0, 1]: (3, 84, 84) for the reference's 3 x 28. ``symbolic``: MiniGrid's own
    encoding of the patch (per cell an object type, a colour and a state), each of the three one-hot over MiniGrid's
    OBJECT_TO_IDX, COLOR_TO_IDX and STATE_TO_IDX and flattened to a float32 vector of view_size^2 * 20 entries (cells
    in MiniGrid's (column, row) order); no rendering, so it is several times faster. Shrinking the default 7x7 view to
    3x3 is what makes the Memory tasks need memory: the cue object is out of sight once the agent walks down the
    corridor.
    Actions: MiniGrid's own ids, ``navigation``: 0 turn left, 1 turn right, 2 move forward (all that Memory needs, the
    reference's); ``all`` adds 3 pickup, 4 drop, 5 toggle and 6 done (DoorKey needs pickup and toggle).
    Reward: MiniGrid's own, 1 - 0.9 * steps / max_steps on success, with MiniGrid's default max_steps (5 * size^2:
    405 for MemoryS9), as the reference implementation had it. Episodes are cut after ``max_episode_steps`` (96) by
    this wrapper, reported as truncated=True; a terminal step on the last allowed step counts as terminated only.
    Passing 96 as MiniGrid's max_steps instead would make every step 4x as expensive: the best possible mean reward on
    MemoryS9 would drop below 0.9, and turning round to look at the cue would hardly pay. An episode is a success
    where its final reward is positive (Memory: the matching object touched; DoorKey: the goal reached).
    """

    def __init__(
        self,
        name: str = "MiniGrid-MemoryS9-v0",
        view_size: int = 3,
        observation: str = "rgb",
        actions: str = "navigation",
        tile_size: int = 28,
        max_episode_steps: int = 96,
        render_mode: str | None = None,
    ) -> None:
        """Builds the environment.

        Args:
            name: A registered MiniGrid-* id.
            view_size: Side length of the agent's view in cells (odd, >= 3).
            observation: "rgb" (the rendered view) or "symbolic" (MiniGrid's grid encoding, one-hot).
            actions: "navigation" (left, right, forward) or "all" (MiniGrid's seven actions).
            tile_size: Pixels per cell of the rgb observation; unused for "symbolic".
            max_episode_steps: Steps after which the episode is truncated; at most MiniGrid's own max_steps (checked by
                ``create_env``).
            render_mode: None, "rgb_array" or "human".
        """
        from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper  # also registers the MiniGrid-* ids

        env = gymnasium.make(name, agent_view_size=view_size, render_mode=render_mode)
        if observation == "rgb":
            super().__init__(ImgObsWrapper(RGBImgPartialObsWrapper(env, tile_size=tile_size)))
            side = view_size * tile_size
            self.observation_space = gymnasium.spaces.Box(low=0.0, high=1.0, shape=(3, side, side), dtype=np.float32)
            self._observe = self._rgb
        else:
            super().__init__(ImgObsWrapper(env))  # MiniGrid's (view, view, 3) grid encoding, nothing rendered
            self._counts = _one_hot_sizes() * (view_size * view_size)  # per cell: object type, colour, state
            self.observation_space = OneHot(sum(self._counts))
            self._observe = self._symbolic
        self.action_space = gymnasium.spaces.Discrete(ACTION_SETS[actions])
        self.actions = actions
        self.max_episode_steps = max_episode_steps
        self._return = 0.0
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Re-seeds MiniGrid's generator when given; later resets continue from it.
            options: Passed on to MiniGrid.

        Returns:
            The first observation (3, side, side) or (view^2 * 20,) and the inner info dict.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self._length = 0
        return self._observe(obs), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Takes one of MiniGrid's actions: 0 left, 1 right, 2 forward, and with ``actions: all`` 3 pickup, 4 drop,
        5 toggle, 6 done.

        Args:
            action: An action id below the action count (3 or 7).

        Returns:
            Observation (3, side, side) or (view^2 * 20,), reward, terminated, truncated and info.
        """
        count = self.action_space.n
        if action not in range(count):
            allowed = ", ".join(f"{index} ({label})" for index, label in enumerate(_ACTION_NAMES[:count]))
            more = "; set environment.actions: all for pickup (3), drop (4), toggle (5) and done (6)" if count < 7 else ""
            raise ValueError(f"action = {action!r} is invalid for MiniGrid with actions: {self.actions}; use {allowed}{more}")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        truncated = (truncated or self._length >= self.max_episode_steps) and not terminated  # reaching the end wins
        if terminated or truncated:
            # MiniGrid pays a positive reward only on success (Memory: the matching object; DoorKey: the goal).
            episode = {"reward": self._return, "length": float(self._length), "success": float(reward > 0)}
            info = {**info, "episode": episode}
        return self._observe(obs), float(reward), terminated, truncated, info

    @staticmethod
    def _rgb(obs: np.ndarray) -> np.ndarray:
        """Turns MiniGrid's rendered (H, W, 3) uint8 view into a (3, H, W) float32 image in [0, 1]."""
        return np.ascontiguousarray(obs.transpose(2, 0, 1), dtype=np.float32) / 255.0

    def _symbolic(self, obs: np.ndarray) -> np.ndarray:
        """Turns MiniGrid's (view, view, 3) grid encoding into one-hot blocks, flattened to (view^2 * 20,) float32."""
        return one_hot_blocks(obs, self._counts)


def _check(config: dict) -> None:
    """Checks the values of a validated MiniGrid section against gymnasium's registry."""
    import minigrid  # noqa: F401  (importing registers the MiniGrid-* ids)

    names = sorted(name for name in gymnasium.registry if name.startswith("MiniGrid-"))
    if config["name"] not in names:
        close = difflib.get_close_matches(str(config["name"]), names, n=3)
        hint = f"did you mean {' or '.join(repr(name) for name in close)}? " if close else ""
        memory = ", ".join(name for name in names if name.startswith("MiniGrid-Memory"))
        allowed = f"{hint}use a registered MiniGrid id: {memory}, or any MiniGrid-* id ({len(names)} in all)"
        raise invalid("name", config["name"], allowed)
    if config["view_size"] < 3 or config["view_size"] % 2 == 0:
        raise invalid("view_size", config["view_size"], "MiniGrid needs an odd view size >= 3")
    if config["observation"] not in OBSERVATIONS:
        raise invalid("observation", config["observation"], "use rgb (the rendered view) or symbolic (the grid encoding)")
    if config["actions"] not in ACTION_SETS:
        raise invalid("actions", config["actions"], "use navigation (left, right, forward) or all (MiniGrid's 7 actions)")
    if config["tile_size"] < 1:
        raise invalid("tile_size", config["tile_size"], "use a pixel count >= 1, e.g. 28")
    if config["max_episode_steps"] < 1:
        raise invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1")
    own_limit = _step_limit(config["name"])
    if config["max_episode_steps"] > own_limit:
        raise invalid("max_episode_steps", config["max_episode_steps"], f"{config['name']} allows at most {own_limit}")


@functools.cache
def _step_limit(name: str) -> int:
    """MiniGrid's own max_steps of a task (it also scales the step penalty of the reward); built and reset once per
    name, so that a task that cannot run stops the config check rather than a worker.

    Raises:
        ValueError: Naming ``environment.name`` when the task cannot be built or reset (minigrid 3.2's WFC-* tasks
            lack their pattern files).
    """
    env = None
    try:
        env = gymnasium.make(name)
        env.reset(seed=0)
        return env.unwrapped.max_steps
    except Exception as error:
        raise invalid("name", name, f"it failed to start ({type(error).__name__}: {error}); use another MiniGrid id") from None
    finally:
        if env is not None:
            env.close()


FAMILY = EnvFamily(
    name="MiniGrid",
    schema={
        "name": Key("MiniGrid-MemoryS9-v0", "a registered MiniGrid-* id, e.g. MiniGrid-MemoryS7-v0, MiniGrid-DoorKey-5x5-v0"),
        "view_size": Key(3, "side of the agent's view in cells (odd, >= 3; MiniGrid's own default is 7)"),
        "observation": Key("rgb", "rgb: the rendered view (3, side, side); symbolic: MiniGrid's grid encoding, one-hot, flat"),
        "actions": Key("navigation", "navigation: left, right, forward; all: MiniGrid's 7 (adds pickup, drop, toggle, done)"),
        "tile_size": Key(28, "pixels per cell; view_size * tile_size is the image side (ignored for symbolic)"),
        "max_episode_steps": Key(96, "truncation limit, at most the task's own max_steps"),
    },
    check=_check,
    render_modes=(None, "rgb_array", "human"),
    make=lambda config, render_mode, evaluation: MiniGridEnv(**config, render_mode=render_mode),
)
