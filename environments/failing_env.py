"""A tiny vector environment that fails on purpose, for testing how workers report and survive failures."""

import os
import time

import numpy as np
from gymnasium import Env, spaces

from environments.registry import EnvFamily, Key, invalid

EPISODE_LENGTH = 8
EXIT_CODE = 3  # what mode "exit" ends the process with


class FailingEnv(Env):
    """Counts its steps over its whole lifetime and fails when the count reaches ``fail_at_step``.

    Until then it is a trivial task: the observation is filled with t / 8 for step t of the episode, every step pays
    1.0 and episodes terminate after 8 steps. Mode "raise" raises RuntimeError("deliberate failure at step k"); mode
    "exit" ends the whole process with os._exit(3), like a worker killed from outside (only use it in a subprocess).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        fail_at_step: int = 5,
        mode: str = "raise",
        obs_size: int = 4,
        rank: int = -1,
        evaluation_step_seconds: float = 0.0,
        evaluation: bool = False,
    ) -> None:
        """Builds the environment.

        Args:
            fail_at_step: Lifetime step count (1-based) at which to fail.
            mode: "raise" or "exit".
            obs_size: Length of the observation vector.
            rank: Fail only in the training process of this rank (torchrun's RANK; a single process is rank 0), or
                in every process with -1.
            evaluation_step_seconds: How long each step of an evaluation environment sleeps (a slow evaluation).
            evaluation: Whether this environment plays evaluation episodes.
        """
        if mode not in ("raise", "exit"):
            raise ValueError(f"mode = {mode!r} is not supported; use 'raise' or 'exit'")
        fails_here = rank in (-1, int(os.environ.get("RANK", "0")))
        self._fail_at_step = fail_at_step if fails_here else -1
        self._mode = mode
        self._step_seconds = evaluation_step_seconds if evaluation else 0.0
        self.observation_space = spaces.Box(low=0.0, high=1.0, shape=(obs_size,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.max_episode_steps = EPISODE_LENGTH
        self.lifetime_steps = 0
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Re-seeds the (unused) generator, for the gymnasium API.
            options: Unused.

        Returns:
            The first observation (obs_size,), all zeros, and an empty info dict.
        """
        super().reset(seed=seed)
        self._t = 0
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Advances one step, or fails if this is the lifetime step ``fail_at_step``.

        Args:
            action: Ignored.

        Returns:
            Observation (obs_size,), reward 1.0, terminated (after 8 steps), truncated (never) and info.
        """
        self.lifetime_steps += 1
        if self._step_seconds:
            time.sleep(self._step_seconds)
        if self.lifetime_steps == self._fail_at_step:
            if self._mode == "exit":
                os._exit(EXIT_CODE)
            raise RuntimeError(f"deliberate failure at step {self.lifetime_steps}")
        self._t += 1
        terminated = self._t == EPISODE_LENGTH
        info = {"episode": {"reward": float(self._t), "length": float(self._t)}} if terminated else {}
        return self._observation(), 1.0, terminated, False, info

    def _observation(self) -> np.ndarray:
        """Returns the observation (obs_size,) filled with t / 8."""
        return np.full(self.observation_space.shape, self._t / EPISODE_LENGTH, dtype=np.float32)


def _check(config: dict) -> None:
    """Checks the values of a validated Failing section."""
    if config["fail_at_step"] < 1:
        raise invalid("fail_at_step", config["fail_at_step"], "use a step count >= 1")
    if config["mode"] not in ("raise", "exit"):
        raise invalid("mode", config["mode"], "use 'raise' or 'exit'")
    if config["obs_size"] < 1:
        raise invalid("obs_size", config["obs_size"], "use a length >= 1")
    if config["rank"] < -1:
        raise invalid("rank", config["rank"], "use a process rank >= 0, or -1 for every process")


FAMILY = EnvFamily(
    name="Failing",
    schema={
        "fail_at_step": Key(5, "lifetime step at which the env fails"),
        "mode": Key("raise", '"raise" a RuntimeError or "exit" the process with code 3'),
        "obs_size": Key(4, "length of the observation vector"),
        "rank": Key(-1, "fail only in the training process of this rank (torchrun), -1 in every process"),
        "evaluation_step_seconds": Key(0.0, "seconds each step of an evaluation episode sleeps (a slow evaluation)"),
    },
    check=_check,
    render_modes=(None,),
    make=lambda config, render_mode, evaluation: FailingEnv(**config, evaluation=evaluation),
    test_only=True,
)
