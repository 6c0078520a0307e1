"""Environment workers: N environments stepped together, in the main process or in subprocesses.

Shapes: N environments, A action branches (1 for Discrete), obs_shape of one observation.

Episodes restart inside the worker at the step that ends them ("same-step autoreset"): ``StepResult.obs`` already holds
the first observation of the next episode for every environment that reported terminated or truncated, while the last
observation of the finished episode is kept in ``StepResult.final_obs`` (needed to bootstrap truncated episodes).

With ``n_processes >= 1`` the environments are split into contiguous groups, one subprocess each. A child sends back
either its results or the traceback of the exception it hit; the parent polls each pipe with a timeout and checks that
the child is alive, so a crashed child is reported within a fraction of a second instead of hanging the training run.

Seeding and restoring: environment i starts its k-th episode (k = 0 at the first reset, counting on through every
autoreset and every further ``reset()``) with ``reset(seed=episode_seed(seed, i, k))``. An environment's state is then
fixed by its episode number and the actions taken since that reset, as long as the environment is deterministic given
its reset seed and actions, which every environment of this repo is. ``Workers.state()`` returns exactly these, as plain
ints and lists that ``torch.load(weights_only=True)`` accepts; ``Workers.restore()`` rebuilds the environments from them
by resetting and replaying the actions. Replaying also rebuilds what the environment wrappers accumulate for
``info["episode"]`` (return, length), so a resumed run continues bit for bit. The state and the replay grow with the
length of the running episodes: at most one episode of actions per environment.
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
_STATE_KEYS = ("episode", "actions")  # keys of one environment's entry in Workers.state()


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


def _is_int(value: object) -> bool:
    """Whether value is a Python or NumPy integer and not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


class _EnvGroup:
    """Environments with consecutive indices, stepped one after the other; used in the main process and in children.

    Besides the environments, the group keeps what restoring them needs: each environment's episode number and the
    actions (lists of A ints) it took since that episode's reset.
    """

    def __init__(self, env_config: dict, indices: range, seed: int, evaluation: bool) -> None:
        """Builds the environments.

        Args:
            env_config: A validated ``environment:`` config section.
            indices: Global indices of the environments of this group.
            seed: Base seed of the episode seeds, see ``episode_seed``.
            evaluation: Passed on to ``create_env``; also selects evaluation episode seeds.
        """
        self.indices = indices
        self._seed = seed
        self._evaluation = evaluation
        self.envs: list[gymnasium.Env] = []
        for index in indices:
            self.envs.append(self._call(index, "construction", create_env, env_config, evaluation=evaluation))
        self._discrete = isinstance(self.envs[0].action_space, gymnasium.spaces.Discrete)
        self._episodes = [-1] * len(indices)  # -1 before the first reset, so that it starts episode 0
        self._actions: list[list[list[int]]] = [[] for _ in indices]

    @staticmethod
    def _call(index: int, what: str, function: Callable[..., object], *args: object, **kwargs: object) -> object:
        """Calls function and turns any exception into a WorkerError that names the environment and holds the traceback."""
        try:
            return function(*args, **kwargs)
        except Exception:
            raise WorkerError(f"environment {index} failed during {what}:\n{traceback.format_exc()}") from None

    def _start_episode(self, j: int, episode: int) -> np.ndarray:
        """Resets the group's j-th environment into the given episode with that episode's seed.

        Returns:
            The first observation (*obs_shape).
        """
        index = self.indices[j]
        self._episodes[j] = episode
        self._actions[j] = []
        # No options: each environment keeps its own reset parameters, see MemoryGymEnv.
        seed = episode_seed(self._seed, index, episode, self._evaluation)
        return self._call(index, "reset", self.envs[j].reset, seed=seed)[0]

    def _step_env(self, j: int, action: list[int], what: str) -> tuple:
        """Steps the group's j-th environment and records the action.

        Args:
            j: Position of the environment in this group.
            action: A ints, one per action branch.
            what: Names the phase in error messages ("step" or "replay").

        Returns:
            The environment's (obs, reward, terminated, truncated, info).
        """
        # Replayed actions must reach the environment as the same types as the original ones: int, or an int64 array.
        env_action = action[0] if self._discrete else np.asarray(action, dtype=np.int64)
        result = self._call(self.indices[j], what, self.envs[j].step, env_action)
        self._actions[j].append(action)
        return result

    def reset(self) -> np.ndarray:
        """Starts the next episode of every environment.

        Returns:
            First observations (n, *obs_shape) float32.
        """
        obs = [self._start_episode(j, self._episodes[j] + 1) for j in range(len(self.envs))]
        return np.stack(obs).astype(np.float32, copy=False)

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps every environment and restarts those whose episode ended.

        Args:
            actions: (n, A) int64 actions of this group's environments.

        Returns:
            The StepResult of this group, with final_obs keyed by global environment index.
        """
        obs, rewards, terminated, truncated, final_obs, episodes = [], [], [], [], {}, []
        for j, (index, row) in enumerate(zip(self.indices, actions, strict=True)):
            ob, reward, term, trunc, info = self._step_env(j, [int(a) for a in row], "step")
            if term or trunc:
                final_obs[index] = ob
                episodes.append(info["episode"])
                ob = self._start_episode(j, self._episodes[j] + 1)
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

    def state(self) -> list[dict]:
        """Returns {"episode": k, "actions": [[int, ...], ...]} per environment, copied so that later steps leave it as is."""
        return [
            {"episode": episode, "actions": [list(action) for action in actions]}
            for episode, actions in zip(self._episodes, self._actions, strict=True)
        ]

    def restore(self, states: list[dict]) -> np.ndarray:
        """Resets every environment into its recorded episode and replays the recorded actions.

        Args:
            states: One entry per environment of this group, checked by ``Workers.restore``.

        Returns:
            Current observations (n, *obs_shape) float32.

        Raises:
            WorkerError: If an episode ends during the replay, which a state taken from these environments never does.
        """
        obs = []
        for j, (index, state) in enumerate(zip(self.indices, states, strict=True)):
            ob = self._start_episode(j, state["episode"])
            for t, action in enumerate(state["actions"]):
                ob, _, term, trunc, _ = self._step_env(j, action, "replay")
                if term or trunc:
                    raise WorkerError(
                        f"the state does not match environment {index}: its episode {state['episode']} ended at replayed "
                        f"action {t + 1} of {len(state['actions'])}; restore a state taken from Workers with the same "
                        "environment config and seed"
                    )
            obs.append(ob)
        return np.stack(obs).astype(np.float32, copy=False)

    def close(self) -> None:
        """Closes every environment."""
        for env in self.envs:
            env.close()


def _handle(group: _EnvGroup, command: str, data: object) -> object:
    """Runs one command on a group; the same dispatch serves the in-process group and every child.

    Args:
        group: The environments.
        command: "reset", "step" (data: (n, A) actions), "state" or "restore" (data: the group's slice of the states).
        data: The command's argument, None where it takes none.

    Returns:
        The group method's answer.
    """
    if command == "reset":
        return group.reset()
    if command == "step":
        return group.step(data)
    if command == "state":
        return group.state()
    if command == "restore":
        return group.restore(data)
    raise ValueError(f"command = {command!r} is unknown; use 'reset', 'step', 'state', 'restore' or 'close'")


def _child_main(
    conn: Connection, parent_conn: Connection, env_config: dict, indices: range, seed: int, evaluation: bool
) -> None:
    """Runs in a worker process: builds a group of environments and serves requests until "close".

    Args:
        conn: The child's end of the pipe.
        parent_conn: The parent's end, closed here so that the child sees EOF if the parent dies.
        env_config: A validated ``environment:`` config section.
        indices: Global indices of this child's environments.
        seed: Base seed of the episode seeds.
        evaluation: Passed on to ``create_env``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which then closes the children
    parent_conn.close()
    group = None
    try:
        group = _EnvGroup(env_config, indices, seed, evaluation)
        env = group.envs[0]
        conn.send(("ok", (env.observation_space, env.action_space, int(env.max_episode_steps))))
        while True:
            command, data = conn.recv()
            if command == "close":
                break
            conn.send(("ok", _handle(group, command, data)))
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


def _merge(results: list[StepResult]) -> StepResult:
    """Joins the StepResults of consecutive groups into the StepResult of all environments."""
    if len(results) == 1:
        return results[0]
    return StepResult(
        obs=np.concatenate([result.obs for result in results]),
        rewards=np.concatenate([result.rewards for result in results]),
        terminated=np.concatenate([result.terminated for result in results]),
        truncated=np.concatenate([result.truncated for result in results]),
        final_obs={index: ob for result in results for index, ob in result.final_obs.items()},
        episodes=[episode for result in results for episode in result.episodes],
    )


class Workers:
    """N environments stepped together with same-step autoreset, in the main process or in subprocesses.

    Attributes:
        n_envs: Number of environments N.
        seed: Base seed: environment i's k-th episode is reset with ``episode_seed(seed, i, k)``.
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
            seed: Base seed of the episode seeds, >= 0; environment i's k-th episode is reset with
                ``episode_seed(seed, i, k)``.
            evaluation: Whether the environments draw episodes from evaluation seeds (see ``create_env``).

        Raises:
            ValueError: For an invalid env_config, process count or seed.
            WorkerError: If an environment cannot be built.
        """
        env_config = validate_env_config(env_config)
        if n_envs < 1:
            raise ValueError(f"n_envs = {n_envs!r} must be >= 1")
        if not 0 <= n_processes <= n_envs:
            raise ValueError(f"n_processes = {n_processes!r} must be between 0 (no subprocesses) and n_envs = {n_envs}")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"seed = {seed!r} must be an int >= 0, the base of every episode seed")
        self.n_envs = n_envs
        self.seed = int(seed)
        self._started = False  # whether reset() or restore() has given every environment an episode
        self._processes: list[multiprocessing.Process] = []
        self._connections: list[Connection] = []
        self._groups: list[_EnvGroup] = []
        self._splits: list[tuple[int, int]] = []  # (start, stop) environment indices of each group or child
        # A finalizer instead of __del__: it also runs at interpreter exit and holds no reference to self.
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._connections, self._groups)

        if n_processes == 0:
            self._groups.append(_EnvGroup(env_config, range(n_envs), self.seed, evaluation))
            self._splits.append((0, n_envs))
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
                args=(child_conn, parent_conn, env_config, range(start, stop), self.seed, evaluation),
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

    def _dispatch(self, command: str, data: list[object]) -> list:
        """Runs a command on every group, in this process or in the children; closes all workers on a failure.

        Args:
            command: See ``_handle``.
            data: The command's argument for each group, in the order of ``_splits``.

        Returns:
            One answer per group, in environment order.
        """
        if not self._groups:
            return self._exchange([(command, item) for item in data])
        try:
            return [_handle(self._groups[0], command, data[0])]
        except WorkerError:
            self.close()
            raise

    def reset(self) -> np.ndarray:
        """Starts the next episode of every environment: episode 0 on the first call, then one past the current one.

        Returns:
            First observations (N, *obs_shape) float32.
        """
        obs = np.concatenate(self._dispatch("reset", [None] * len(self._splits)))
        self._started = True
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps all environments and restarts those whose episode ended at this step.

        Args:
            actions: (N, A) int64, A = len(action_dims).

        Returns:
            The StepResult of all N environments.

        Raises:
            RuntimeError: Before the first reset() or restore().
        """
        if not self._started:
            raise RuntimeError("step() was called before any episode started; call reset() or restore() first")
        actions = np.asarray(actions)
        if actions.shape != (self.n_envs, len(self.action_dims)):
            raise ValueError(
                f"actions of shape {actions.shape} do not fit; pass (n_envs, len(action_dims)) = "
                f"({self.n_envs}, {len(self.action_dims)}), also for Discrete action spaces"
            )
        return _merge(self._dispatch("step", [actions[start:stop] for start, stop in self._splits]))

    def state(self) -> list[dict]:
        """Returns what ``restore`` needs to rebuild the environments exactly as they are now.

        Returns:
            Per environment ``{"episode": k, "actions": [[a_1, ..., a_A], ...]}``: the number of its running episode and
            the actions taken since that episode's reset, oldest first. Only Python ints, lists, dicts and strings, so
            that a checkpoint holding it loads with ``torch.load(weights_only=True)``.

        Raises:
            RuntimeError: Before the first reset() or restore().
        """
        if not self._started:
            raise RuntimeError("state() was called before any episode started; call reset() or restore() first")
        return [state for states in self._dispatch("state", [None] * len(self._splits)) for state in states]

    def restore(self, states: list[dict]) -> np.ndarray:
        """Rebuilds the environments from ``state()`` of Workers with the same environment config, n_envs and seed.

        Each environment is reset into its recorded episode with that episode's seed and replays the recorded actions.
        The number of processes may differ from that of the Workers the state was taken from.

        Args:
            states: What ``state()`` returned, one entry per environment.

        Returns:
            The current observations (N, *obs_shape) float32, equal to those the original Workers last returned.

        Raises:
            ValueError: If states does not have the form that ``state()`` returns for these Workers.
            WorkerError: If an episode ends during the replay, so that the state cannot come from these environments,
                or if an environment fails; the workers are closed in both cases.
        """
        states = self._checked_states(states)
        obs = np.concatenate(self._dispatch("restore", [states[start:stop] for start, stop in self._splits]))
        self._started = True
        return obs

    def _checked_states(self, states: list[dict]) -> list[dict]:
        """Checks the argument of ``restore`` and copies it with every number as a Python int.

        Raises:
            ValueError: Naming the first entry that does not fit these Workers and what it should be.
        """
        if not isinstance(states, list | tuple):
            raise ValueError(f"states is a {type(states).__name__}; pass the list that Workers.state() returned")
        if len(states) != self.n_envs:
            raise ValueError(
                f"states has {len(states)} entries, but these Workers run n_envs = {self.n_envs} environments; "
                "restore a state taken from Workers with the same n_envs"
            )
        width = len(self.action_dims)
        checked = []
        for i, state in enumerate(states):
            if not isinstance(state, dict):
                raise ValueError(f"states[{i}] is a {type(state).__name__}; each entry must be a dict as state() returns")
            missing = [key for key in _STATE_KEYS if key not in state]
            if missing:
                raise ValueError(
                    f"states[{i}] lacks the key(s) {missing} (it has {list(state)}); each entry must be "
                    "{'episode': int, 'actions': [[int, ...], ...]} as state() returns"
                )
            episode, actions = state["episode"], state["actions"]
            if not _is_int(episode) or episode < 0:
                raise ValueError(f"states[{i}]['episode'] = {episode!r} must be an episode number, an int >= 0")
            if not isinstance(actions, list | tuple):
                raise ValueError(f"states[{i}]['actions'] is a {type(actions).__name__}; it must be a list of actions")
            for t, action in enumerate(actions):
                fits = isinstance(action, list | tuple) and len(action) == width
                if not fits or not all(_is_int(a) and 0 <= a < n for a, n in zip(action, self.action_dims, strict=True)):
                    raise ValueError(
                        f"states[{i}]['actions'][{t}] = {action!r} is not an action of this environment; each action is "
                        f"a list of {width} int(s) in [0, n) for n in action_dims = {self.action_dims}"
                    )
            checked.append({"episode": int(episode), "actions": [[int(a) for a in action] for action in actions]})
        return checked

    def close(self) -> None:
        """Closes all environments and stops all worker processes. Safe to call more than once."""
        self._finalizer()

    def __enter__(self) -> "Workers":
        """Returns self, so that ``with Workers(...) as workers:`` closes them on exit."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes the workers."""
        self.close()
