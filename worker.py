"""Environment workers: N environments stepped together, in the main process or in subprocesses.

Shapes: N environments, A action branches (1 for Discrete), obs_shape of one observation.

This module only carries commands and answers between ``Workers`` and the groups of environments. What a group does
lives in env_group.py: building the environments, same-step autoreset (``StepResult.obs`` already holds the first
observation of the next episode, ``StepResult.final_obs`` the last one of the episode that ended) and seeding (episode k
of environment i is reset with ``episode_seed(seed, i, k)``). What ``Workers.state()`` returns and how
``Workers.restore()`` rebuilds the environments from it by replaying their episodes lives in environments/replay.py.

With ``n_processes >= 1`` the environments are split into contiguous groups, one subprocess each. A child sends back
either its results or the traceback of the exception it hit; the parent polls each pipe with a timeout and checks that
the child is alive, so a crashed child is reported within a fraction of a second instead of hanging the training run.
An observation that does not fit its space (``observations.ObservationError``, whose message is complete) is raised
in the parent as that same error with that same message, not as a WorkerError, wherever the environments run.
Every group keeps its episode recorder in the process that steps it, and ``state()`` joins the groups' entries in
environment order, so a state taken with one number of processes restores with any other.
"""

import multiprocessing
import os
import signal
import time
import traceback
import weakref
from multiprocessing.connection import Connection

import gymnasium
import numpy as np

import observations
from env_group import EnvGroup, StepResult, WorkerError, episode_seed, is_int
from environments import agents_per_env, validate_env_config
from environments.action_spec import ActionSpec
from environments.replay import EpisodeRecorder, check_states, restore
from observations import ObservationError

# Re-exported: callers (trainer.py, evaluation.py, ...) import these from here, as before the split into modules.
__all__ = ["ObservationError", "StepResult", "WorkerError", "Workers", "episode_seed"]

_POLL_S = 0.2  # how often the parent checks whether a silent child is still alive
_JOIN_S = 2.0  # grace period for children to exit on "close" before they are terminated

_Spaces = tuple[gymnasium.Space, gymnasium.Space, int]  # observation space, action space, max_episode_steps


class _Local:
    """One group of environments with its episode recorder, answering commands in the process that holds them.

    It serves the main process when n_processes = 0 and every child otherwise, so both run the same dispatch.

    Attributes:
        splits: [(start, stop)], the environment indices of the group.
        spaces: Observation space, action space and max_episode_steps of one environment.
    """

    def __init__(self, env_config: dict, indices: range, seed: int, evaluation: bool) -> None:
        """Builds the environments.

        Args:
            env_config: A validated ``environment:`` config section.
            indices: Global indices of the environments.
            seed: Base seed of the episode seeds.
            evaluation: Passed on to ``create_env``; also selects evaluation episode seeds.

        Raises:
            WorkerError: If an environment cannot be built.
        """
        self._recorder = EpisodeRecorder(len(indices))
        self._group = EnvGroup(env_config, indices, seed, evaluation, self._recorder)
        self.splits = [(indices.start, indices.stop)]
        self.spaces: _Spaces = self._group.spaces()
        # A finalizer instead of __del__: it also runs at interpreter exit and holds no reference to self.
        self._finalizer = weakref.finalize(self, self._group.close)

    def handle(self, command: str, data: object) -> object:
        """Runs one command on the group.

        Args:
            command: "reset", "step" (data: (n, A) actions), "state" or "restore" (data: the group's slice of the states).
            data: The command's argument, None where it takes none.

        Returns:
            The answer of the group, its recorder or the replay.
        """
        if command == "reset":
            return self._group.reset()
        if command == "step":
            return self._group.step(data)
        if command == "state":
            return self._recorder.state()
        if command == "restore":
            return restore(self._group, data)
        raise ValueError(f"command = {command!r} is unknown; use 'reset', 'step', 'state', 'restore' or 'close'")

    def exchange(self, messages: list[tuple[str, object]]) -> list:
        """Runs the one (command, data) message, the same way as ``_Children.exchange`` runs one per child.

        Returns:
            [the answer].
        """
        return [self.handle(command, data) for command, data in messages]

    def close(self) -> None:
        """Closes the environments. Safe to call more than once."""
        self._finalizer()


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
    local = None
    try:
        local = _Local(env_config, indices, seed, evaluation)
        conn.send(("ok", local.spaces))
        while True:
            command, data = conn.recv()
            if command == "close":
                break
            conn.send(("ok", local.handle(command, data)))
    except EOFError:
        pass  # the parent is gone; nobody is left to report to
    except ObservationError as error:
        conn.send(("observation", str(error)))  # raised again as an ObservationError in the parent
    except WorkerError as error:
        conn.send(("error", str(error)))  # already names the environment and holds its traceback
    except Exception:
        conn.send(
            ("error", f"worker process for environments {indices.start}..{indices.stop - 1} failed:\n{traceback.format_exc()}")
        )
    finally:
        if local is not None:
            local.close()
        conn.close()


def _shutdown(processes: list[multiprocessing.Process], connections: list[Connection]) -> None:
    """Stops every child: asks politely, then terminates, then kills. Never blocks longer than a few seconds."""
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


class _Children:
    """Worker processes, one per contiguous group of environments, each reached through a pipe.

    Attributes:
        splits: (start, stop) environment indices of each child's group, in child order.
        spaces: Observation space, action space and max_episode_steps of one environment, reported by the first child.
    """

    def __init__(self, env_config: dict, indices: range, n_processes: int, seed: int, evaluation: bool) -> None:
        """Starts the children and waits until all of them have built their environments.

        Args:
            env_config: A validated ``environment:`` config section.
            indices: Global indices of the environments.
            n_processes: Number of children, 1..N.
            seed: Base seed of the episode seeds.
            evaluation: Passed on to ``create_env``.

        Raises:
            WorkerError: If an environment cannot be built or a child dies; every child is stopped then.
        """
        self.splits: list[tuple[int, int]] = []
        self._processes: list[multiprocessing.Process] = []
        self._connections: list[Connection] = []
        # Set up before the first child starts, so that children started before a failure are stopped as well.
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._connections)
        # fork starts fast and needs no importable __main__; children never touch torch, so forking after it is loaded
        # is safe.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        bounds = indices.start + np.linspace(0, len(indices), n_processes + 1).round().astype(int)
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            parent_conn, child_conn = context.Pipe()
            process = context.Process(
                target=_child_main,
                args=(child_conn, parent_conn, env_config, range(start, stop), seed, evaluation),
                daemon=True,
                name=f"env-worker-{start}-{stop - 1}",
            )
            process.start()
            child_conn.close()
            self._processes.append(process)
            self._connections.append(parent_conn)
            self.splits.append((int(start), int(stop)))
        try:
            self.spaces: _Spaces = self.exchange(None)[0]
        except WorkerError:
            self.close()
            raise

    def _died(self, k: int) -> WorkerError:
        """Builds the error for child k, which is gone, naming its environments and exit code."""
        process = self._processes[k]
        process.join(1.0)
        start, stop = self.splits[k]
        return WorkerError(
            f"worker process {process.pid} running environments {start}..{stop - 1} died with exit code {process.exitcode}"
        )

    def _receive(self, k: int) -> object:
        """Waits for the answer of child k, checking every _POLL_S seconds that the child is alive.

        Raises:
            WorkerError: With the environment's traceback if the child reported an exception, or if the child died.
            ObservationError: If an observation of the child's environments did not fit their space.
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
        if status == "observation":
            raise ObservationError(payload)
        return payload

    def exchange(self, messages: list[tuple[str, object]] | None) -> list:
        """Sends each child its message (if any), then collects one answer per child.

        Args:
            messages: One (command, data) per child, or None to only collect answers (after start-up).

        Returns:
            The answers, in child order.

        Raises:
            WorkerError: If a child reported an exception or died; the children are left to the caller to stop.
            ObservationError: If an observation did not fit its space; the children are left to the caller to stop.
        """
        for k, message in enumerate(messages or []):
            try:
                self._connections[k].send(message)
            except (BrokenPipeError, ConnectionResetError):
                raise self._died(k) from None
        return [self._receive(k) for k in range(len(self._processes))]

    def close(self) -> None:
        """Stops every child. Safe to call more than once."""
        self._finalizer()


def _merge(results: list[StepResult]) -> StepResult:
    """Joins the StepResults of consecutive groups into the StepResult of all environments."""
    if len(results) == 1:
        return results[0]
    return StepResult(
        obs=observations.concatenate([result.obs for result in results]),
        rewards=np.concatenate([result.rewards for result in results]),
        terminated=np.concatenate([result.terminated for result in results]),
        truncated=np.concatenate([result.truncated for result in results]),
        final_obs={index: ob for result in results for index, ob in result.final_obs.items()},
        episodes=[episode for result in results for episode in result.episodes],
    )


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def environment_processes(requested: int, environments: int, device_type: str, cores: int, ranks: int = 1) -> int:
    """The environment subprocesses one training process starts for the config's ``n_processes`` = ``requested``.

    Args:
        requested: >= 0: that many, shared among the ``ranks`` training processes; -1 (auto): on "cuda", one per core
            of ``cores`` but the one the trainer runs on; on the CPU none. At most one per environment either way.
        environments: the environments this process steps.
        device_type: "cuda" or "cpu".
        cores: the cores this process may use (its share where several training processes share a machine).
        ranks: the training processes.
    """
    if requested >= 0:
        return min(-(-requested // ranks), environments)
    return max(0, min(cores - 1, environments)) if device_type == "cuda" else 0


class Workers:
    """N worker lanes stepped together with same-step autoreset, in the main process or in subprocesses.

    A lane is one agent with its own memory. Single-agent tasks have one environment per lane; a multi-agent
    environment with K agents fills K consecutive lanes (see env_group.py), so N / K environments run.

    Attributes:
        n_envs: Number of lanes N, the trainer's n_workers (the number of environments for single-agent tasks).
        agents: Lanes K of each environment, 1 for single-agent tasks.
        seed: Base seed: environment i's k-th episode is reset with ``episode_seed(seed, i, k)``.
        observation_space: Observation space of one environment.
        action_space: Action space of one environment (Discrete, MultiDiscrete or a 1-D Box).
        action_spec: The action space as the models see it (``heads.ActionSpec``); A = ``action_spec.width``.
        action_dims: [n] for Discrete(n), list(nvec) for MultiDiscrete; empty for a Box.
        max_episode_steps: Step limit of one environment's episodes, -1 when unbounded.
    """

    def __init__(
        self, env_config: dict, n_envs: int, n_processes: int, seed: int, evaluation: bool = False, first_lane: int = 0
    ) -> None:
        """Starts the environments.

        Args:
            env_config: The ``environment:`` config section; validated here.
            n_envs: Number of lanes N, a multiple of the environment's agent count K (any N for single-agent tasks).
            n_processes: 0 to step all environments in this process; otherwise the number of subprocesses, each
                stepping a contiguous group of environments (at most N / K).
            seed: Base seed of the episode seeds, >= 0; environment i's k-th episode is reset with
                ``episode_seed(seed, i, k)``.
            evaluation: Whether the environments draw episodes from evaluation seeds (see ``create_env``).
            first_lane: Global index of the first lane, a multiple of K, where these Workers step a share of all lanes
                (one training process of several, distributed.py): the environments are seeded by their global
                indices, so the lanes play the episodes they would play in one process stepping all of them.

        Raises:
            ValueError: For an invalid env_config, process count or seed.
            WorkerError: If an environment cannot be built.
        """
        env_config = validate_env_config(env_config)
        if n_envs < 1:
            raise ValueError(f"n_envs = {n_envs!r} must be >= 1")
        self.agents = agents_per_env(env_config)
        if n_envs % self.agents:
            raise ValueError(
                f"n_envs = {n_envs} lanes do not split into environments of {self.agents} agents each; use a multiple "
                f"of {self.agents}"
            )
        environments = n_envs // self.agents
        if first_lane < 0 or first_lane % self.agents:
            raise ValueError(f"first_lane = {first_lane!r} must be a multiple of the {self.agents} agents per environment")
        self.first_lane = first_lane
        if not 0 <= n_processes <= environments:
            raise ValueError(
                f"n_processes = {n_processes!r} must be between 0 (no subprocesses) and the number of environments, "
                f"{environments}"
            )
        if not is_int(seed) or seed < 0:
            raise ValueError(f"seed = {seed!r} must be an int >= 0, the base of every episode seed")
        self.n_envs = n_envs
        self.seed = int(seed)
        self._started = False  # whether reset() or restore() has given every environment an episode
        # Both transports split the environments into groups (self._transport.splits) and answer per group.
        self._transport: _Local | _Children
        first = first_lane // self.agents
        if n_processes == 0:
            self._transport = _Local(env_config, range(first, first + environments), self.seed, evaluation)
        else:
            self._transport = _Children(env_config, range(first, first + environments), n_processes, self.seed, evaluation)
        self.observation_space, self.action_space, self.max_episode_steps = self._transport.spaces
        self.action_spec = ActionSpec.of(self.action_space)
        self.action_dims = list(self.action_spec.counts)

    def _dispatch(self, command: str, data: list[object]) -> list:
        """Runs a command on every group, in this process or in the children; closes all workers on a failure.

        Args:
            command: See ``_Local.handle``.
            data: The command's argument for each group, in the order of the transport's splits.

        Returns:
            One answer per group, in environment order.
        """
        try:
            return self._transport.exchange([(command, item) for item in data])
        except (WorkerError, ObservationError):
            self.close()
            raise

    def _split(self, items: np.ndarray | list, per_env: int = 1) -> list:
        """Cuts items into the slices of the groups: per_env = 1 for per-environment items (states), K for per-lane
        items (actions)."""
        first = self.first_lane // self.agents
        return [items[(start - first) * per_env : (stop - first) * per_env] for start, stop in self._transport.splits]

    def reset(self) -> np.ndarray:
        """Starts the next episode of every environment: episode 0 on the first call, then one past the current one.

        Returns:
            First observations (N, *obs_shape) float32.

        Raises:
            ObservationError: If an observation does not fit the environment's space; the workers are closed then.
        """
        obs = observations.concatenate(self._dispatch("reset", [None] * len(self._transport.splits)))
        self._started = True
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        """Steps all environments and restarts those whose episode ended at this step.

        Args:
            actions: (N, A) int64 (Discrete, MultiDiscrete) or float (a Box: clipped to its bounds when stepping),
                A = action_spec.width.

        Returns:
            The StepResult of all N environments.

        Raises:
            RuntimeError: Before the first reset() or restore().
            ObservationError: If an observation does not fit the environment's space; the workers are closed then.
        """
        if not self._started:
            raise RuntimeError("step() was called before any episode started; call reset() or restore() first")
        actions = np.asarray(actions)
        if actions.shape != (self.n_envs, self.action_spec.width):
            raise ValueError(
                f"actions of shape {actions.shape} do not fit; pass (n_envs, action_spec.width) = "
                f"({self.n_envs}, {self.action_spec.width}), also for Discrete action spaces"
            )
        result = _merge(self._dispatch("step", self._split(actions, self.agents)))
        if self.first_lane:
            result = result._replace(final_obs={i - self.first_lane: ob for i, ob in result.final_obs.items()})
        return result

    def state(self) -> list[dict]:
        """Returns what ``restore`` needs to rebuild the environments exactly as they are now.

        Returns:
            Per environment (N / K entries) ``{"episode": k, "actions": [[a_1, ..., a_A], ...]}``: the number of its
            running episode and the actions taken since that episode's reset, oldest first (K A entries each: its
            lanes' actions one after the other). Only Python ints, lists, dicts and strings, so
            that a checkpoint holding it loads with ``torch.load(weights_only=True)``.

        Raises:
            RuntimeError: Before the first reset() or restore().
        """
        if not self._started:
            raise RuntimeError("state() was called before any episode started; call reset() or restore() first")
        return [state for states in self._dispatch("state", [None] * len(self._transport.splits)) for state in states]

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
        states = check_states(states, self.n_envs // self.agents, self.action_spec, self.agents)
        obs = observations.concatenate(self._dispatch("restore", self._split(states)))
        self._started = True
        return obs

    def close(self) -> None:
        """Closes all environments and stops all worker processes. Safe to call more than once."""
        self._transport.close()

    def __enter__(self) -> "Workers":
        """Returns self, so that ``with Workers(...) as workers:`` closes them on exit."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes the workers."""
        self.close()
