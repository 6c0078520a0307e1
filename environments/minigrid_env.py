"""MiniGrid Memory tasks with a small, image-based egocentric view.

The minigrid package (and pygame with it) is imported only when an environment is built or a config is checked, so
that importing this module to declare the family stays cheap.
"""

import functools

import gymnasium
import numpy as np

from environments.registry import EnvFamily, Key, invalid


class MiniGridMemoryEnv(gymnasium.Wrapper):
    """MiniGrid-Memory* with an RGB partial view and only the three actions the task needs.

    The agent sees a view_size x view_size patch in front of it, rendered with tile_size pixels per cell and returned
    channel-first as float32 in [0, 1]: (3, 84, 84) for the reference's 3 x 28. Shrinking the default 7x7 view to 3x3
    is what makes the task need memory: the cue object is out of sight once the agent walks down the corridor.
    The actions are 0: turn left, 1: turn right, 2: move forward (MiniGrid's own ids for these actions).
    Reward: MiniGrid's own, 1 - 0.9 * steps / max_steps for the matching object, with MiniGrid's default max_steps
    (5 * size^2: 405 for S9), as the reference implementation had it. Episodes are cut after ``max_episode_steps``
    (96) by this wrapper, reported as truncated=True; an object touched on the last step counts as terminated only.
    Passing 96 as MiniGrid's max_steps instead would make every step 4x as expensive: the best possible mean
    reward on S9 would drop below 0.9, and turning round to look at the cue would hardly pay.
    """

    def __init__(
        self,
        name: str = "MiniGrid-MemoryS9-v0",
        view_size: int = 3,
        tile_size: int = 28,
        max_episode_steps: int = 96,
        render_mode: str | None = None,
    ) -> None:
        """Builds the environment.

        Args:
            name: A registered MiniGrid-Memory* id.
            view_size: Side length of the agent's view in cells (odd, >= 3).
            tile_size: Pixels per cell in the observation.
            max_episode_steps: Steps after which the episode is truncated; at most MiniGrid's own max_steps (checked by
                ``create_env``).
            render_mode: None, "rgb_array" or "human".
        """
        from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper  # also registers the MiniGrid-* ids

        env = gymnasium.make(name, agent_view_size=view_size, render_mode=render_mode)
        super().__init__(ImgObsWrapper(RGBImgPartialObsWrapper(env, tile_size=tile_size)))
        side = view_size * tile_size
        self.observation_space = gymnasium.spaces.Box(low=0.0, high=1.0, shape=(3, side, side), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(3)
        self.max_episode_steps = max_episode_steps
        self._return = 0.0
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Re-seeds MiniGrid's generator when given; later resets continue from it.
            options: Passed on to MiniGrid.

        Returns:
            The first observation (3, side, side) and the inner info dict.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self._length = 0
        return self._observe(obs), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Turns left (0), turns right (1) or moves forward (2).

        Args:
            action: 0, 1 or 2.

        Returns:
            Observation (3, side, side), reward, terminated, truncated and info.
        """
        if action not in (0, 1, 2):
            raise ValueError(f"action = {action!r} is invalid for MiniGrid Memory; use 0 (left), 1 (right) or 2 (forward)")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        truncated = (truncated or self._length >= self.max_episode_steps) and not terminated  # touching wins
        if terminated or truncated:
            # MiniGrid Memory pays a positive reward only for touching the matching object.
            episode = {"reward": self._return, "length": float(self._length), "success": float(reward > 0)}
            info = {**info, "episode": episode}
        return self._observe(obs), float(reward), terminated, truncated, info

    @staticmethod
    def _observe(obs: np.ndarray) -> np.ndarray:
        """Turns MiniGrid's (H, W, 3) uint8 view into a (3, H, W) float32 image in [0, 1]."""
        return np.ascontiguousarray(obs.transpose(2, 0, 1), dtype=np.float32) / 255.0


def _check(config: dict) -> None:
    """Checks the values of a validated MiniGrid section against gymnasium's registry."""
    import minigrid  # noqa: F401  (importing registers the MiniGrid-* ids)

    names = sorted(name for name in gymnasium.registry if name.startswith("MiniGrid-Memory"))
    if config["name"] not in names:
        raise invalid("name", config["name"], f"use a registered MiniGrid Memory id: {', '.join(names)}")
    if config["view_size"] < 3 or config["view_size"] % 2 == 0:
        raise invalid("view_size", config["view_size"], "MiniGrid needs an odd view size >= 3")
    if config["tile_size"] < 1:
        raise invalid("tile_size", config["tile_size"], "use a pixel count >= 1, e.g. 28")
    if config["max_episode_steps"] < 1:
        raise invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1")
    own_limit = _step_limit(config["name"])
    if config["max_episode_steps"] > own_limit:
        raise invalid("max_episode_steps", config["max_episode_steps"], f"{config['name']} allows at most {own_limit}")


@functools.cache
def _step_limit(name: str) -> int:
    """MiniGrid's own max_steps of a task (it also scales the step penalty of the reward); built once per name."""
    env = gymnasium.make(name)
    try:
        return env.unwrapped.max_steps
    finally:
        env.close()


FAMILY = EnvFamily(
    name="MiniGrid",
    schema={
        "name": Key("MiniGrid-MemoryS9-v0", "any registered MiniGrid-Memory* id"),
        "view_size": Key(3, "side of the agent's view in cells (odd, >= 3)"),
        "tile_size": Key(28, "pixels per cell; view_size * tile_size is the image side"),
        "max_episode_steps": Key(96, "truncation limit"),
    },
    check=_check,
    render_modes=(None, "rgb_array", "human"),
    make=lambda config, render_mode, evaluation: MiniGridMemoryEnv(**config, render_mode=render_mode),
)
