"""CartPole, optionally made partially observable by hiding the velocities."""

import warnings

import gymnasium
import numpy as np

from environments.registry import EnvFamily, Key, invalid

_STEP_LIMITS = {"CartPole-v0": 200, "CartPole-v1": 500}


class CartPoleEnv(gymnasium.Wrapper):
    """Gymnasium CartPole with masked velocities and a scaled reward.

    The observation is [cart position, cart velocity, pole angle, pole angular velocity] as float32; with
    ``mask_velocity`` indices 1 and 3 are always 0, so the agent has to infer velocities from its memory.
    The reward is scaled by ``reward_scale`` for training, while ``info["episode"]["reward"]`` reports the unscaled
    return (up to 200 on CartPole-v0) so that it reads like the familiar benchmark numbers.
    """

    def __init__(
        self,
        name: str = "CartPole-v0",
        mask_velocity: bool = True,
        reward_scale: float = 0.01,
        render_mode: str | None = None,
    ) -> None:
        """Builds the environment.

        Args:
            name: "CartPole-v0" (200-step limit) or "CartPole-v1" (500-step limit).
            mask_velocity: Whether to zero both velocities in every observation.
            reward_scale: Factor applied to each step's reward (the reference used 1/100).
            render_mode: None, "rgb_array" or "human".
        """
        with warnings.catch_warnings():
            # CartPole-v0 is the reference's benchmark; gymnasium's "out of date" notice would repeat in every worker.
            warnings.filterwarnings("ignore", message=".*CartPole-v0 is out of date", category=DeprecationWarning)
            super().__init__(gymnasium.make(name, render_mode=render_mode))
        self._mask = np.array([1.0, 0.0, 1.0, 0.0] if mask_velocity else [1.0] * 4, dtype=np.float32)
        self._reward_scale = reward_scale
        inner = self.env.observation_space
        self.observation_space = gymnasium.spaces.Box(
            low=np.where(self._mask > 0, inner.low, 0.0), high=np.where(self._mask > 0, inner.high, 0.0), dtype=np.float32
        )
        self.max_episode_steps = int(self.env.spec.max_episode_steps)
        self._return = 0.0
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Re-seeds the inner CartPole when given.
            options: Passed on to the inner CartPole.

        Returns:
            The first observation (4,) and the inner info dict.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self._length = 0
        return self._observe(obs), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Pushes the cart left (0) or right (1).

        Args:
            action: 0 or 1.

        Returns:
            Observation (4,), scaled reward, terminated, truncated (the time limit) and info.
        """
        obs, reward, terminated, truncated, info = self.env.step(action)
        truncated = truncated and not terminated  # a pole falling on the last step is a real ending
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            info = {**info, "episode": {"reward": self._return, "length": float(self._length)}}
        return self._observe(obs), float(reward) * self._reward_scale, terminated, truncated, info

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        """Returns the observation (4,) as float32 with the masked entries zeroed."""
        return np.asarray(obs, dtype=np.float32) * self._mask


def _check(config: dict) -> None:
    """Checks the values of a validated CartPole section."""
    if config["name"] not in _STEP_LIMITS:
        raise invalid("name", config["name"], "use 'CartPole-v0' or 'CartPole-v1'")
    if config["reward_scale"] <= 0:
        raise invalid("reward_scale", config["reward_scale"], "use a factor > 0, e.g. 0.01")


FAMILY = EnvFamily(
    name="CartPole",
    schema={
        "name": Key("CartPole-v0", "CartPole-v0 (200 steps) or CartPole-v1 (500 steps)"),
        "mask_velocity": Key(True, "hide both velocities so that the agent needs memory"),
        "reward_scale": Key(0.01, "factor on each step's reward; episode stats stay unscaled"),
    },
    check=_check,
    render_modes=(None, "rgb_array", "human"),
    make=lambda config, render_mode, evaluation: CartPoleEnv(**config, render_mode=render_mode),
    episode_limit=lambda config: _STEP_LIMITS[config["name"]],
)
