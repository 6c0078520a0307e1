"""Episode replay: what ``Workers.state()`` returns and how ``Workers.restore()`` rebuilds environments from it.

An environment's state is fixed by its episode number and the actions taken since that episode's reset, as long as the
environment is deterministic given its reset seed (see ``env_group.episode_seed``) and actions, which every environment
of this repo is. An ``EpisodeRecorder`` keeps exactly these for the environments of one group while the group runs.
Its ``state()`` is the payload that checkpoints hold, one entry per environment::

    {"episode": k, "actions": [[a_1, ..., a_A], ...]}

as plain ints (floats for continuous actions) and lists that ``torch.load(weights_only=True)`` accepts.
``check_states`` checks such a payload before any environment is touched, and ``restore`` rebuilds a group's
environments from it by resetting each into its recorded episode and replaying the actions. Replaying also rebuilds
what the environment wrappers accumulate for ``info["episode"]`` (return, length), so a resumed run continues bit for
bit. The state and the replay grow with the length of the running episodes: at most one episode of actions per
environment.
"""

import math

import numpy as np

from env_group import EnvGroup, WorkerError, is_int, stack_observations
from environments.action_spec import ActionSpec

STATE_KEYS = ("episode", "actions")  # keys of one environment's entry in the state
# An episode longer than this is not replayed: its entry holds "actions": None, and a restore starts the environment's
# next episode instead (its lanes' memory starts anew too). Without a bound, an Endless task's state would grow with
# every step of its episode, and so would every checkpoint and the time to resume.
MAX_REPLAY_ACTIONS = 10_000


class EpisodeRecorder:
    """Each environment's episode number and the actions it took since that episode's reset: lists of A ints (floats
    for a Box) per lane, the K lanes' actions one after the other.

    An ``EnvGroup`` reports every episode start and every action to its recorder; j is an environment's position in
    that group.
    """

    def __init__(self, n_envs: int) -> None:
        """Starts with no episode begun.

        Args:
            n_envs: Number of environments of the group.
        """
        self._episodes = [-1] * n_envs  # -1 before the first reset, so that it starts episode 0
        self._actions: list[list[list[int]]] = [[] for _ in range(n_envs)]

    def next_episode(self, j: int) -> int:
        """Returns the number of environment j's next episode: 0 before its first reset."""
        return self._episodes[j] + 1

    def start(self, j: int, episode: int) -> None:
        """Notes that environment j is being reset into the given episode, which forgets the actions of the last one."""
        self._episodes[j] = episode
        self._actions[j] = []

    def record(self, j: int, action: list[int]) -> None:
        """Notes that environment j took action (A ints) in its running episode; beyond ``MAX_REPLAY_ACTIONS`` the
        episode is too long to replay and its actions are dropped."""
        if self._actions[j] is not None:
            self._actions[j].append(action)
            if len(self._actions[j]) > MAX_REPLAY_ACTIONS:
                self._actions[j] = None

    def state(self) -> list[dict]:
        """Returns {"episode": k, "actions": [[int, ...], ...]} per environment (``None`` for an episode too long to
        replay), copied so that later steps leave it as is."""
        return [
            {"episode": episode, "actions": None if actions is None else [list(action) for action in actions]}
            for episode, actions in zip(self._episodes, self._actions, strict=True)
        ]


def _finite_number(value: object, k: int) -> bool:
    """Whether a recorded continuous action entry is a finite number (k, its position, is unused)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_states(states: list[dict], n_envs: int, actions_spec: ActionSpec | list[int], agents: int = 1) -> list[dict]:
    """Checks a state for Workers of n_envs environments and copies it with every number as a Python int (a float for
    continuous actions).

    Args:
        states: The argument of ``Workers.restore``, meant to be what ``Workers.state()`` returned.
        n_envs: Number of environments of the Workers to restore (not lanes: an environment with K agents is one).
        actions_spec: Their action space (or its action counts), which bounds every recorded discrete action
            (continuous ones must be finite numbers; they are clipped when replayed).
        agents: Lanes K of each environment; a recorded action holds the K lanes' actions one after the other.

    Returns:
        The checked copy, one entry per environment.

    Raises:
        ValueError: Naming the first entry that does not fit these Workers and what it should be.
    """
    if not isinstance(states, list | tuple):
        raise ValueError(f"states is a {type(states).__name__}; pass the list that Workers.state() returned")
    if len(states) != n_envs:
        raise ValueError(
            f"states has {len(states)} entries, but these Workers run n_envs = {n_envs} environments; "
            "restore a state taken from Workers with the same n_envs"
        )
    actions_spec = ActionSpec.coerce(actions_spec)
    width = actions_spec.width * agents
    if actions_spec.continuous:
        fits_entry, kind, convert = _finite_number, f"a list of {width} finite number(s)", float
    else:
        counts = list(actions_spec.counts) * agents
        kind, convert = f"a list of {width} int(s) in [0, n) for n in the action counts {counts}", int

        def fits_entry(a: object, k: int) -> bool:
            return is_int(a) and 0 <= a < counts[k]

    checked = []
    for i, state in enumerate(states):
        if not isinstance(state, dict):
            raise ValueError(f"states[{i}] is a {type(state).__name__}; each entry must be a dict as state() returns")
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"states[{i}] lacks the key(s) {missing} (it has {list(state)}); each entry must be "
                "{'episode': int, 'actions': [[int, ...], ...]} as state() returns"
            )
        episode, actions = state["episode"], state["actions"]
        if not is_int(episode) or episode < 0:
            raise ValueError(f"states[{i}]['episode'] = {episode!r} must be an episode number, an int >= 0")
        if actions is None:  # an episode too long to replay: the restore starts the next one
            checked.append({"episode": int(episode), "actions": None})
            continue
        if not isinstance(actions, list | tuple):
            raise ValueError(f"states[{i}]['actions'] is a {type(actions).__name__}; it must be a list of actions")
        for t, action in enumerate(actions):
            fits = isinstance(action, list | tuple) and len(action) == width
            if not fits or not all(fits_entry(a, k) for k, a in enumerate(action)):
                raise ValueError(
                    f"states[{i}]['actions'][{t}] = {action!r} is not an action of this environment; each action is {kind}"
                )
        checked.append({"episode": int(episode), "actions": [[convert(a) for a in action] for action in actions]})
    return checked


def replay_episode(group: EnvGroup, j: int, episode: int, actions: list[list[int]]) -> list:
    """Resets the group's j-th environment into the given episode and steps it through the recorded actions.

    The group records the episode start and every replayed action, so its recorder ends up with this entry again.

    Args:
        group: The environments.
        j: Position of the environment in the group.
        episode: Number of the episode to reset into.
        actions: The actions taken since that episode's reset, oldest first, each a list of K A numbers.

    Returns:
        The current observation (*obs_shape) of each of the environment's K lanes: the one after the last action, or the
        first one if there is none.

    Raises:
        WorkerError: If the episode ends during the replay, which a state taken from these environments never does.
    """
    ob = group.start_episode(j, episode)
    for t, action in enumerate(actions):
        ob, _, term, trunc, _ = group.step_env(j, action, "replay")  # ob: one observation per lane
        if any(term) or any(trunc):
            raise WorkerError(
                f"the state does not match environment {group.indices[j]}: its episode {episode} ended at replayed "
                f"action {t + 1} of {len(actions)}; restore a state taken from Workers with the same environment "
                "config and seed"
            )
    return ob


def restore(group: EnvGroup, states: list[dict]) -> np.ndarray:
    """Rebuilds every environment of a group from its entry of a state, see ``replay_episode``.

    Args:
        group: The environments.
        states: One entry per environment of the group, checked by ``check_states``.

    Returns:
        Current observations (n K, *obs_shape) float32, one per lane.

    Raises:
        WorkerError: If an episode ends during the replay or an environment fails.
    """
    obs = [
        group.start_episode(j, state["episode"] + 1)
        if state["actions"] is None
        else replay_episode(group, j, state["episode"], state["actions"])
        for j, state in zip(range(len(group.envs)), states, strict=True)
    ]
    return stack_observations([ob for lanes in obs for ob in lanes])
