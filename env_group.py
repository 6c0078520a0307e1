"""Environment groups: environments with consecutive indices, built, seeded and stepped together in one process.

Shapes: n environments in a group, K lanes (agents) per environment (1 for single-agent tasks), A action branches (1
for Discrete), obs_shape of one observation. A lane is what the trainer calls a worker: one agent with its own memory.

Episodes restart inside the group at the step that ends them ("same-step autoreset"): ``StepResult.obs`` already holds
the first observation of the next episode for every environment that reported terminated or truncated, while the last
observation of the finished episode is kept in ``StepResult.final_obs`` (needed to bootstrap truncated episodes).

Seeding: environment i starts its k-th episode (k = 0 at the first reset, counting on through every autoreset and every
further ``reset()``) with ``reset(seed=episode_seed(seed, i, k))``. The group does not count episodes itself: it asks
its recorder (see ``Recorder``) for each environment's next episode number and tells it every episode start and every
action, so that the recorder holds all that restoring an environment needs (see environments/replay.py) while this module stays
free of the state format.

Every observation an environment hands over is checked against its declared observation space (``observations.check``)
here, in whichever process steps the group, so that one that does not fit stops the run with an
``observations.ObservationError`` naming the environment, its episode and step, instead of being quantised, cut or
mixed up silently, or failing later as a bare shape error in the model.
"""

import traceback
from collections.abc import Callable
from typing import NamedTuple, Protocol

import gymnasium
import numpy as np

import observations
from environments import create_env, environment_id
from observations import ObservationError


class StepResult(NamedTuple):
    """What one step of all environments returns."""

    obs: np.ndarray  # (N, *obs_shape) float32 per lane; after an episode end already the first obs of the next episode
    rewards: np.ndarray  # (N,) float32
    terminated: np.ndarray  # (N,) bool
    truncated: np.ndarray  # (N,) bool
    final_obs: dict[int, np.ndarray]  # lane index -> last obs (*obs_shape) of the episode that just ended
    episodes: list[dict[str, float]]  # info["episode"] of every lane whose episode ended at this step


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
        """Notes that environment j took action (K A numbers, its lanes' actions one after the other) in its episode."""
        ...


def to_env_action(space: gymnasium.Space, action: list | np.ndarray) -> int | np.ndarray:
    """One action of the models, A entries, as the environment takes it: an int for Discrete, an int64 array for
    MultiDiscrete, and for a Box an array of its dtype clipped to its bounds (the models' Gaussian samples are not)."""
    if isinstance(space, gymnasium.spaces.Box):
        return np.clip(np.asarray(action, dtype=space.dtype), space.low, space.high)
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(action[0])
    return np.asarray(action, dtype=np.int64)


def lanes_of(env: object) -> int:
    """The worker lanes (agents, each with its own memory) of an environment: K for a multi-agent adapter such as
    ``environments.pettingzoo_env.ParallelAgents``, which has a ``lanes`` attribute, else 1."""
    return int(getattr(env, "lanes", 1))


def reset_lanes(env: gymnasium.Env, seed: int) -> list:
    """Resets an environment with the seed and returns its first observations, one per lane."""
    obs, _ = env.reset(seed=seed)
    return list(obs) if hasattr(env, "lanes") else [obs]


def step_lanes(env: gymnasium.Env, actions: list) -> tuple[list, list[float], list[bool], list[bool], list[dict]]:
    """Steps an environment with one action per lane (each as the models give it, A entries).

    Returns:
        One observation, one reward, one terminated and one truncated flag per lane (all lanes end their episode at
        the same step, each of them terminated or truncated) and, at the step that ends the episode, one
        ``info["episode"]`` dict per lane (else an empty list).

    Raises:
        RuntimeError: If the environment ended an episode without reporting it in its info.
    """
    space = env.action_space
    if hasattr(env, "lanes"):
        obs, rewards, terminated, truncated, info = env.step([to_env_action(space, action) for action in actions])
        terminated, truncated = [bool(t) for t in terminated], [bool(t) for t in truncated]
        episodes = info.get("episodes") if any(terminated) or any(truncated) else []
    else:
        ob, reward, term, trunc, info = env.step(to_env_action(space, actions[0]))
        obs, rewards, terminated, truncated = [ob], [reward], [bool(term)], [bool(trunc)]
        episodes = [info.get("episode")] if term or trunc else []
    if episodes is None or None in episodes:
        raise RuntimeError(f"{type(env).__name__} ended an episode without reporting it in info['episode']")
    return obs, rewards, terminated, truncated, episodes


class EnvGroup:
    """Environments with consecutive indices, stepped one after the other; used in the main process and in children.

    An environment with K agents (a multi-agent adapter, see ``lanes_of``) fills K consecutive lanes: environment i of
    the group owns lanes i K .. i K + K - 1, every per-lane array (observations, actions, rewards) has n K rows, and
    the recorder keeps one joint action per step (the K lanes' actions one after the other, K A entries).

    Attributes:
        indices: Global indices of the environments.
        envs: The environments, in the order of indices.
        agents: Lanes K of every environment (1 for single-agent tasks).
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
        self._name = environment_id(env_config)
        self.envs: list[gymnasium.Env] = []
        for index in indices:
            self.envs.append(self._call(index, "construction", create_env, env_config, evaluation=evaluation))
        self.agents = lanes_of(self.envs[0])
        self._action_space = self.envs[0].action_space
        self._box = isinstance(self._action_space, gymnasium.spaces.Box)
        self._expected = observations.leaves(self.envs[0].observation_space)
        # Each environment's running episode and step, for the message of an observation that does not fit.
        self._episodes = [0] * len(indices)
        self._steps = [0] * len(indices)

    @staticmethod
    def _call(index: int, what: str, function: Callable[..., object], *args: object, **kwargs: object) -> object:
        """Calls function and turns any exception but an ObservationError, whose message is complete without a traceback,
        into a WorkerError that names the environment and holds the traceback."""
        try:
            return function(*args, **kwargs)
        except ObservationError:
            raise
        except Exception:
            raise WorkerError(f"environment {index} failed during {what}:\n{traceback.format_exc()}") from None

    def spaces(self) -> tuple[gymnasium.Space, gymnasium.Space, int]:
        """Returns observation space, action space and max_episode_steps of one environment's lane (all are alike)."""
        env = self.envs[0]
        return env.observation_space, env.action_space, int(env.max_episode_steps)

    def start_episode(self, j: int, episode: int) -> list:
        """Resets the group's j-th environment into the given episode with that episode's seed.

        Returns:
            The first observation (*obs_shape) of each of its K lanes.

        Raises:
            ObservationError: If one does not fit the environment's observation space.
        """
        index = self.indices[j]
        self.recorder.start(j, episode)
        self._episodes[j], self._steps[j] = episode, 0
        # No options: each environment keeps its own reset parameters, see MemoryGymEnv.
        seed = episode_seed(self._seed, index, episode, self._evaluation)
        try:
            obs = self._call(index, "reset", reset_lanes, self.envs[j], seed)
            self._check(obs)
        except ObservationError as error:
            raise self._located(j, "reset", error) from None
        return obs

    def _check(self, obs: list) -> None:
        """Checks the observations of an environment's K lanes against its declared observation space.

        Raises:
            ObservationError: For the first that does not fit, naming its lane where there are several.
        """
        for lane, ob in enumerate(obs):
            try:
                observations.check(ob, self._expected)
            except ObservationError as error:
                if self.agents == 1:
                    raise
                raise ObservationError(f"lane {lane}: {error}") from None

    def _located(self, j: int, what: str, error: ObservationError) -> ObservationError:
        """The error of an observation of the group's j-th environment, with the environment and its episode and step
        put in front of the message."""
        step = f"step {self._steps[j]}" if self._steps[j] else "the reset"
        during = " (replaying a checkpoint's episode)" if what == "replay" else ""
        where = f"environment {self.indices[j]} ({self._name}) at {step} of episode {self._episodes[j]}{during}"
        return ObservationError(f"{where}: {error}")

    def step_env(
        self, j: int, action: list[int] | list[float], what: str
    ) -> tuple[list, list[float], list[bool], list[bool], list]:
        """Steps the group's j-th environment and records the action.

        Args:
            j: Position of the environment in this group.
            action: K A numbers, the actions of its K lanes one after the other: ints, one per action branch; or
                floats for a Box, which the environment gets clipped to the Box's bounds (the unclipped action is
                recorded, and clipped again when replayed).
            what: Names the phase in error messages ("step" or "replay").

        Returns:
            See ``step_lanes``: K observations, K rewards, K terminated and K truncated flags and the ended episodes'
            dicts.

        Raises:
            ObservationError: If an observation does not fit the environment's observation space.
        """
        width = len(action) // self.agents
        lanes = [action[k * width : (k + 1) * width] for k in range(self.agents)]
        self._steps[j] += 1
        # Replayed actions reach the environment as the same types as the original ones (to_env_action).
        try:
            result = self._call(self.indices[j], what, step_lanes, self.envs[j], lanes)
            self._check(result[0])
        except ObservationError as error:
            raise self._located(j, what, error) from None
        self.recorder.record(j, action)
        return result

    def reset(self) -> np.ndarray:
        """Starts the next episode of every environment.

        Returns:
            First observations (n K, *obs_shape) float32.
        """
        obs = [self.start_episode(j, self.recorder.next_episode(j)) for j in range(len(self.envs))]
        return stack_observations([ob for lanes in obs for ob in lanes])

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps every environment and restarts those whose episode ended.

        Args:
            actions: (n K, A) actions of this group's lanes: int64, or floats for a Box.

        Returns:
            The StepResult of this group's lanes, with final_obs keyed by global lane index.
        """
        obs, rewards, terminated, truncated, final_obs, episodes = [], [], [], [], {}, []
        k = self.agents
        for j, index in enumerate(self.indices):
            rows = actions[j * k : (j + 1) * k]
            action = [float(a) for row in rows for a in row] if self._box else [int(a) for row in rows for a in row]
            obs_j, rewards_j, term, trunc, episodes_j = self.step_env(j, action, "step")
            if any(term) or any(trunc):
                final_obs.update({index * k + lane: ob for lane, ob in enumerate(obs_j)})
                episodes.extend(episodes_j)
                obs_j = self.start_episode(j, self.recorder.next_episode(j))
            obs.extend(obs_j)
            rewards.extend(rewards_j)
            terminated.extend(term)
            truncated.extend(trunc)
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
