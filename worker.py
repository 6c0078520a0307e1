"""Environment workers: N environments stepped together, in the main process or in subprocesses.

Shapes: N environments, A action branches (1 for Discrete), obs_shape of one observation.

Episodes restart inside the worker at the step that ends them ("same-step autoreset"): ``StepResult.obs`` already holds
the first observation of the next episode for every environment that reported terminated or truncated, while the last
observation of the finished episode is kept in ``StepResult.final_obs`` (needed to bootstrap truncated episodes).

With ``n_processes >= 1`` the environments are split into contiguous groups, one subprocess each. A child sends back
either its results or the traceback of the exception it hit; the parent polls each pipe with a timeout and checks that
the child is alive, so a crashed child is reported within a fraction of a second instead of hanging the training run.
"""

import multiprocessing
import signal
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NamedTuple

import gymnasium
import numpy as np

from environments import create_env, validate_env_config

_POLL_S = 0.2  # how often the parent checks whether a silent child is still alive
_JOIN_S = 2.0  # grace period for children to exit on "close" before they are terminated


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


class _EnvGroup:
    """Environments with consecutive indices, stepped one after the other; used in the main process and in children."""

    def __init__(self, env_config: dict, indices: range, evaluation: bool) -> None:
        """Builds the environments.

        Args:
            env_config: A validated ``environment:`` config section.
            indices: Global indices of the environments of this group.
            evaluation: Passed on to ``create_env``.
        """
        self.indices = indices
        self.envs: list[gymnasium.Env] = []
        for index in indices:
            self.envs.append(self._call(index, "construction", create_env, env_config, evaluation=evaluation))
        self._discrete = isinstance(self.envs[0].action_space, gymnasium.spaces.Discrete)

    @staticmethod
    def _call(index: int, what: str, function: Callable[..., object], *args: object, **kwargs: object) -> object:
        """Calls function and turns any exception into a WorkerError that names the environment and holds the traceback."""
        try:
            return function(*args, **kwargs)
        except Exception:
            raise WorkerError(f"environment {index} failed during {what}:\n{traceback.format_exc()}") from None

    def reset(self, seed: int | None) -> np.ndarray:
        """Resets every environment.

        Args:
            seed: Environment i is reset with seed + i; None resets without a seed.

        Returns:
            First observations (n, *obs_shape) float32.
        """
        obs = []
        for index, env in zip(self.indices, self.envs, strict=True):
            env_seed = None if seed is None else seed + index
            obs.append(self._call(index, "reset", env.reset, seed=env_seed)[0])
        return np.stack(obs).astype(np.float32, copy=False)

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps every environment and restarts those whose episode ended.

        Args:
            actions: (n, A) int64 actions of this group's environments.

        Returns:
            The StepResult of this group, with final_obs keyed by global environment index.
        """
        obs, rewards, terminated, truncated, final_obs, episodes = [], [], [], [], {}, []
        for index, env, action in zip(self.indices, self.envs, actions, strict=True):
            env_action = int(action[0]) if self._discrete else action
            ob, reward, term, trunc, info = self._call(index, "step", env.step, env_action)
            if term or trunc:
                final_obs[index] = ob
                episodes.append(info["episode"])
                ob = self._call(index, "reset", env.reset)[0]  # the env keeps its own options, see MemoryGymEnv
            obs.append(ob)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
        return StepResult(
            obs=np.stack(obs).astype(np.float32, copy=False),
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


def _child_main(conn: Connection, parent_conn: Connection, env_config: dict, indices: range, evaluation: bool) -> None:
    """Runs in a worker process: builds a group of environments and serves "reset" / "step" / "close" requests.

    Args:
        conn: The child's end of the pipe.
        parent_conn: The parent's end, closed here so that the child sees EOF if the parent dies.
        env_config: A validated ``environment:`` config section.
        indices: Global indices of this child's environments.
        evaluation: Passed on to ``create_env``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which then closes the children
    parent_conn.close()
    group = None
    try:
        group = _EnvGroup(env_config, indices, evaluation)
        env = group.envs[0]
        conn.send(("ok", (env.observation_space, env.action_space, int(env.max_episode_steps))))
        while True:
            command, data = conn.recv()
            if command == "close":
                break
            conn.send(("ok", group.reset(data) if command == "reset" else group.step(data)))
    except EOFError:
        pass  # the parent is gone; nobody is left to report to
    except WorkerError as error:
        conn.send(("error", str(error)))  # already names the environment and holds its traceback
    except Exception:
        conn.send(
            ("error", f"worker process for environments {indices.start}..{indices.stop - 1} failed:\n{traceback.format_exc()}")
        )
    finally:
        if group is not None:
            group.close()
        conn.close()


def _shutdown(processes: list[multiprocessing.Process], connections: list[Connection], groups: list[_EnvGroup]) -> None:
    """Stops every worker: asks politely, then terminates, then kills. Never blocks longer than a few seconds."""
    for conn in connections:
        try:
            conn.send(("close", None))
        except (BrokenPipeError, OSError):
            pass  # that child is already gone
    deadline = time.monotonic() + _JOIN_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in connections:
        conn.close()
    for group in groups:
        group.close()


class Workers:
    """N environments stepped together with same-step autoreset, in the main process or in subprocesses.

    Attributes:
        n_envs: Number of environments N.
        observation_space: Observation space of one environment.
        action_space: Action space of one environment (Discrete or MultiDiscrete).
        action_dims: [n] for Discrete(n), list(nvec) for MultiDiscrete; A = len(action_dims).
        max_episode_steps: Step limit of one environment's episodes, -1 when unbounded.
    """

    def __init__(self, env_config: dict, n_envs: int, n_processes: int, seed: int, evaluation: bool = False) -> None:
        """Starts the environments.

        Args:
            env_config: The ``environment:`` config section; validated here.
            n_envs: Number of environments N.
            n_processes: 0 to step all environments in this process; otherwise the number of subprocesses, each
                stepping a contiguous group of environments.
            seed: Environment i is reset with seed + i on the first reset.
            evaluation: Whether the environments draw episodes from evaluation seeds (see ``create_env``).

        Raises:
            ValueError: For an invalid env_config or process count.
            WorkerError: If an environment cannot be built.
        """
        env_config = validate_env_config(env_config)
        if n_envs < 1:
            raise ValueError(f"n_envs = {n_envs!r} must be >= 1")
        if not 0 <= n_processes <= n_envs:
            raise ValueError(f"n_processes = {n_processes!r} must be between 0 (no subprocesses) and n_envs = {n_envs}")
        self.n_envs = n_envs
        self._seed: int | None = seed
        self._processes: list[multiprocessing.Process] = []
        self._connections: list[Connection] = []
        self._groups: list[_EnvGroup] = []
        self._splits: list[tuple[int, int]] = []
        # A finalizer instead of __del__: it also runs at interpreter exit and holds no reference to self.
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._connections, self._groups)

        if n_processes == 0:
            self._groups.append(_EnvGroup(env_config, range(n_envs), evaluation))
            env = self._groups[0].envs[0]
            spaces = (env.observation_space, env.action_space, int(env.max_episode_steps))
        else:
            spaces = self._start_processes(env_config, n_processes, evaluation)
        self.observation_space, self.action_space, self.max_episode_steps = spaces
        if isinstance(self.action_space, gymnasium.spaces.Discrete):
            self.action_dims = [int(self.action_space.n)]
        else:
            self.action_dims = [int(n) for n in self.action_space.nvec]

    def _start_processes(
        self, env_config: dict, n_processes: int, evaluation: bool
    ) -> tuple[gymnasium.Space, gymnasium.Space, int]:
        """Starts one child per contiguous group of environments and waits until all of them are built.

        Returns:
            Observation space, action space and max_episode_steps of one environment, as reported by the first child.
        """
        # fork starts fast and needs no importable __main__; children never touch torch, so forking after it is loaded
        # is safe.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        bounds = np.linspace(0, self.n_envs, n_processes + 1).round().astype(int)
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            parent_conn, child_conn = context.Pipe()
            process = context.Process(
                target=_child_main,
                args=(child_conn, parent_conn, env_config, range(start, stop), evaluation),
                daemon=True,
                name=f"env-worker-{start}-{stop - 1}",
            )
            process.start()
            child_conn.close()
            self._processes.append(process)
            self._connections.append(parent_conn)
            self._splits.append((int(start), int(stop)))
        return self._exchange(None)[0]

    def _died(self, k: int) -> WorkerError:
        """Builds the error for child k, which is gone, naming its environments and exit code."""
        process = self._processes[k]
        process.join(1.0)
        start, stop = self._splits[k]
        return WorkerError(
            f"worker process {process.pid} running environments {start}..{stop - 1} died with exit code {process.exitcode}"
        )

    def _receive(self, k: int) -> object:
        """Waits for the answer of child k, checking every _POLL_S seconds that the child is alive.

        Raises:
            WorkerError: With the environment's traceback if the child reported an exception, or if the child died.
        """
        conn, process = self._connections[k], self._processes[k]
        while not conn.poll(_POLL_S):
            if not process.is_alive():
                break
        try:
            status, payload = conn.recv()
        except (EOFError, ConnectionResetError):
            raise self._died(k) from None
        if status == "error":
            raise WorkerError(payload)
        return payload

    def _exchange(self, messages: list[tuple[str, object]] | None) -> list:
        """Sends each child its message (if any), then collects one answer per child; closes all workers on a failure.

        Args:
            messages: One (command, data) per child, or None to only collect answers (after start-up).

        Returns:
            The answers, in child order.
        """
        try:
            for k, message in enumerate(messages or []):
                try:
                    self._connections[k].send(message)
                except (BrokenPipeError, ConnectionResetError):
                    raise self._died(k) from None
            return [self._receive(k) for k in range(len(self._processes))]
        except WorkerError:
            self.close()
            raise

    def reset(self) -> np.ndarray:
        """Resets all environments; environment i gets seed + i on the first reset only.

        Returns:
            First observations (N, *obs_shape) float32.
        """
        seed, self._seed = self._seed, None
        if self._groups:
            return self._in_process(lambda group: group.reset(seed))
        return np.concatenate(self._exchange([("reset", seed)] * len(self._connections)))

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps all environments and restarts those whose episode ended at this step.

        Args:
            actions: (N, A) int64, A = len(action_dims).

        Returns:
            The StepResult of all N environments.
        """
        actions = np.asarray(actions)
        if actions.shape != (self.n_envs, len(self.action_dims)):
            raise ValueError(
                f"actions of shape {actions.shape} do not fit; pass (n_envs, len(action_dims)) = "
                f"({self.n_envs}, {len(self.action_dims)}), also for Discrete action spaces"
            )
        if self._groups:
            return self._in_process(lambda group: group.step(actions))
        results = self._exchange([("step", actions[start:stop]) for start, stop in self._splits])
        return StepResult(
            obs=np.concatenate([result.obs for result in results]),
            rewards=np.concatenate([result.rewards for result in results]),
            terminated=np.concatenate([result.terminated for result in results]),
            truncated=np.concatenate([result.truncated for result in results]),
            final_obs={index: ob for result in results for index, ob in result.final_obs.items()},
            episodes=[episode for result in results for episode in result.episodes],
        )

    def _in_process(self, call: Callable[[_EnvGroup], object]) -> object:
        """Runs call on the in-process group; closes the environments if it fails, as with worker processes."""
        try:
            return call(self._groups[0])
        except WorkerError:
            self.close()
            raise

    def close(self) -> None:
        """Closes all environments and stops all worker processes. Safe to call more than once."""
        self._finalizer()

    def __enter__(self) -> "Workers":
        """Returns self, so that ``with Workers(...) as workers:`` closes them on exit."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes the workers."""
        self.close()
