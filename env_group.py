"""Environment groups: environments with consecutive indices, built, seeded and stepped together in one process.

Shapes: n environments in a group, A action branches (1 for Discrete), obs_shape of one observation.

Episodes restart inside the group at the step that ends them ("same-step autoreset"): ``StepResult.obs`` already holds
the first observation of the next episode for every environment that reported terminated or truncated, while the last
observation of the finished episode is kept in ``StepResult.final_obs`` (needed to bootstrap truncated episodes).

Seeding: environment i starts its k-th episode (k = 0 at the first reset, counting on through every autoreset and every
further ``reset()``) with ``reset(seed=episode_seed(seed, i, k))``. The group does not count episodes itself: it asks
its recorder (see ``Recorder``) for each environment's next episode number and tells it every episode start and every
action, so that the recorder holds all that restoring an environment needs (see replay.py) while this module stays
free of the state format.
"""

import traceback
from collections.abc import Callable
from typing import NamedTuple, Protocol

import gymnasium
import numpy as np

import observations
from environments import create_env


class StepResult(NamedTuple):
    """What one step of all environments returns."""

    obs: np.ndarray  # (N, *obs_shape) float32; after an episode end already the first obs of the next episode
    rewards: np.ndarray  # (N,) float32
    terminated: np.ndarray  # (N,) bool
    truncated: np.ndarray  # (N,) bool
    final_obs: dict[int, np.ndarray]  # env index -> last obs (*obs_shape) of the episode that just ended
    episodes: list[dict[str, float]]  # info["episode"] of every episode that ended at this step


class WorkerError(RuntimeError):
    """An environment failed (its traceback is in the message) or a worker process died."""


def is_int(value: object) -> bool:
    """Whether value is a Python or NumPy integer and not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def episode_seed(base_seed: int, index: int, episode: int, evaluation: bool = False) -> int:
    """Returns the reset seed of an environment's episode.

    The seed is a hash of the three numbers, ``np.random.SeedSequence([base_seed, index, episode]).generate_state(1)[0]``,
    so that it is fixed without knowing the number of environments and seeds every episode differently. It also keeps
    runs with neighbouring base seeds apart, which ``base_seed + index`` did not: there, environment 1 of base seed 0
    played the episodes of environment 0 of base seed 1. Its lowest bit is then set to 0 for training and to 1 for
    evaluation, so that evaluation episodes never share a seed with training episodes.

    Args:
        base_seed: The seed given to Workers, >= 0.
        index: Global index of the environment, >= 0.
        episode: Number of the episode in this environment, 0 for the one started by the first reset.
        evaluation: Whether the seed is for an evaluation episode (odd) or a training episode (even).

    Returns:
        A seed in [0, 2**32), which every environment of this repo accepts.
    """
    hashed = int(np.random.SeedSequence([base_seed, index, episode]).generate_state(1)[0])
    return (hashed & ~1) | int(evaluation)


def stack_observations(obs: list[np.ndarray] | list[dict]) -> np.ndarray | dict:
    """Stacks one observation (*obs_shape) per environment into (n, *obs_shape) float32 (per key for dicts)."""
    return observations.stack(obs)


class Recorder(Protocol):
    """What a group reports about its environments' episodes; ``replay.EpisodeRecorder`` is the one in use.

    j is the position of an environment in its group, not its global index.
    """

    def next_episode(self, j: int) -> int:
        """Returns the number of environment j's next episode: 0 before its first reset."""
        ...

    def start(self, j: int, episode: int) -> None:
        """Notes that environment j is being reset into the given episode."""
        ...

    def record(self, j: int, action: list[int]) -> None:
        """Notes that environment j took action (A ints) in its running episode."""
        ...


def to_env_action(space: gymnasium.Space, action: list | np.ndarray) -> int | np.ndarray:
    """One action of the models, A entries, as the environment takes it: an int for Discrete, an int64 array for
    MultiDiscrete, and for a Box an array of its dtype clipped to its bounds (the models' Gaussian samples are not)."""
    if isinstance(space, gymnasium.spaces.Box):
        return np.clip(np.asarray(action, dtype=space.dtype), space.low, space.high)
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(action[0])
    return np.asarray(action, dtype=np.int64)


class EnvGroup:
    """Environments with consecutive indices, stepped one after the other; used in the main process and in children.

    Attributes:
        indices: Global indices of the environments.
        envs: The environments, in the order of indices.
        recorder: Told every episode start and action; also decides each environment's next episode number.
    """

    def __init__(self, env_config: dict, indices: range, seed: int, evaluation: bool, recorder: Recorder) -> None:
        """Builds the environments.

        Args:
            env_config: A validated ``environment:`` config section.
            indices: Global indices of the environments of this group.
            seed: Base seed of the episode seeds, see ``episode_seed``.
            evaluation: Passed on to ``create_env``; also selects evaluation episode seeds.
            recorder: Keeps the episode numbers and actions of the len(indices) environments.

        Raises:
            WorkerError: If an environment cannot be built, naming it.
        """
        self.indices = indices
        self.recorder = recorder
        self._seed = seed
        self._evaluation = evaluation
        self.envs: list[gymnasium.Env] = []
        for index in indices:
            self.envs.append(self._call(index, "construction", create_env, env_config, evaluation=evaluation))
        self._action_space = self.envs[0].action_space
        self._box = isinstance(self._action_space, gymnasium.spaces.Box)

    @staticmethod
    def _call(index: int, what: str, function: Callable[..., object], *args: object, **kwargs: object) -> object:
        """Calls function and turns any exception into a WorkerError that names the environment and holds the traceback."""
        try:
            return function(*args, **kwargs)
        except Exception:
            raise WorkerError(f"environment {index} failed during {what}:\n{traceback.format_exc()}") from None

    def spaces(self) -> tuple[gymnasium.Space, gymnasium.Space, int]:
        """Returns observation space, action space and max_episode_steps of one environment (all are alike)."""
        env = self.envs[0]
        return env.observation_space, env.action_space, int(env.max_episode_steps)

    def start_episode(self, j: int, episode: int) -> np.ndarray:
        """Resets the group's j-th environment into the given episode with that episode's seed.

        Returns:
            The first observation (*obs_shape).
        """
        index = self.indices[j]
        self.recorder.start(j, episode)
        # No options: each environment keeps its own reset parameters, see MemoryGymEnv.
        seed = episode_seed(self._seed, index, episode, self._evaluation)
        return self._call(index, "reset", self.envs[j].reset, seed=seed)[0]

    def step_env(self, j: int, action: list[int] | list[float], what: str) -> tuple:
        """Steps the group's j-th environment and records the action.

        Args:
            j: Position of the environment in this group.
            action: A ints, one per action branch; or A floats for a Box, which the environment gets clipped to the
                Box's bounds (the unclipped action is recorded, and clipped again when replayed).
            what: Names the phase in error messages ("step" or "replay").

        Returns:
            The environment's (obs, reward, terminated, truncated, info).
        """
        # Replayed actions reach the environment as the same types as the original ones (env_action).
        env_action = to_env_action(self._action_space, action)
        result = self._call(self.indices[j], what, self.envs[j].step, env_action)
        self.recorder.record(j, action)
        return result

    def reset(self) -> np.ndarray:
        """Starts the next episode of every environment.

        Returns:
            First observations (n, *obs_shape) float32.
        """
        return stack_observations([self.start_episode(j, self.recorder.next_episode(j)) for j in range(len(self.envs))])

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps every environment and restarts those whose episode ended.

        Args:
            actions: (n, A) actions of this group's environments: int64, or floats for a Box.

        Returns:
            The StepResult of this group, with final_obs keyed by global environment index.
        """
        obs, rewards, terminated, truncated, final_obs, episodes = [], [], [], [], {}, []
        for j, (index, row) in enumerate(zip(self.indices, actions, strict=True)):
            action = [float(a) for a in row] if self._box else [int(a) for a in row]
            ob, reward, term, trunc, info = self.step_env(j, action, "step")
            if term or trunc:
                final_obs[index] = ob
                episodes.append(info["episode"])
                ob = self.start_episode(j, self.recorder.next_episode(j))
            obs.append(ob)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
        return StepResult(
            obs=stack_observations(obs),
            rewards=np.asarray(rewards, dtype=np.float32),
            terminated=np.asarray(terminated, dtype=bool),
            truncated=np.asarray(truncated, dtype=bool),
            final_obs=final_obs,
            episodes=episodes,
        )

    def close(self) -> None:
        """Closes every environment."""
        for env in self.envs:
            env.close()
