"""Multi-agent environments on PettingZoo's parallel API, trained with parameter sharing: every agent is a worker lane.

Config::

    environment:
      type: PettingZoo
      entry_point: "my_package.my_module:parallel_env"  # a function (or class) that returns a pettingzoo.ParallelEnv
      kwargs: {}                                         # passed to it
      max_episode_steps: -1                              # > 0: truncate every agent after this many steps; -1: none
      episode_info: [success]                            # numeric keys of an agent's final info reported per agent

One policy (one set of weights) acts for every agent, and each agent keeps its own memory: an environment with K
agents fills K consecutive worker lanes, so ``n_workers`` must be a multiple of K and the trainer steps n_workers / K
environments (env_group.py). Every agent must see the same observation space and act in the same action space (those
of the Gymnasium family: images, vectors, one-hot, dicts of them; Discrete, MultiDiscrete, finite Box); observations
are checked against that space and converted, and actions converted, as there.

The agent count is fixed: every agent of ``possible_agents`` is in every step of every episode, and all agents end
their episode at the same step (all terminated or truncated). An environment whose agents leave or join during an
episode (dying agents, agents that finish early) is refused with an error that names the agent and the step; wrap it
so that a finished agent stays in the episode with a no-op until the others finish. Evaluation and enjoy.py play any
agent count: set it through ``kwargs`` (e.g. ``--set environment.kwargs.agents=4``), since every lane is one memory
stream of the same policy.

At the step that ends an episode ``info["episodes"]`` holds one dict per agent, in the order of ``possible_agents``:
"reward" (that agent's return), "length", each ``episode_info`` key its final info holds as a number, and the episode's
totals "team_reward" (the sum of all agents' returns) and, where every agent reports "success", "team_success" (1 when
every agent succeeded). Means over these dicts are means per agent; the team values are the same for every agent of an
episode, so their means are means per episode.

Checking a config builds the environment once (cached per entry point and kwargs) and resets it, so that an entry point
that does not import, a function that does not return a parallel environment, agents with different spaces or a reset
without all of ``possible_agents`` stop training before any worker starts.
"""

import importlib
from typing import NamedTuple

import numpy as np
from gymnasium import spaces

from environments.action_spec import ActionSpec
from environments.gymnasium_env import (
    SUPPORTED,
    _convert,
    _converted_space,
    _hashable,
    _layout,
    _number,
    check_episode_info,
    check_kwargs,
    check_raw,
    inner_action,
    model_action_space,
    raw_leaves,
)
from environments.registry import REQUIRED, EnvFamily, Key, import_failure, invalid
from observations import ObservationError

_RESERVED_KWARGS = {"render_mode": "it is set by the caller of create_env (train.py, enjoy.py)"}


class AgentChangeError(RuntimeError):
    """A parallel environment's agents changed during an episode, which a fixed set of worker lanes cannot follow."""


class _Probe(NamedTuple):
    """What checking a config learns from building the environment once."""

    agents: tuple[str, ...]
    observation_space: spaces.Space
    action_space: spaces.Space
    render_modes: tuple[str, ...]


_probes: dict[tuple, _Probe] = {}  # by (entry_point, _hashable(kwargs)); forked worker processes inherit it


def _resolve(entry_point: str) -> object:
    """Imports "module:name" and returns the name's object.

    Raises:
        ValueError: Naming ``environment.entry_point`` when it has no colon, its module fails to import or lacks the name.
    """
    module, _, name = entry_point.partition(":")
    if not module or not name:
        raise invalid("entry_point", entry_point, "write it as 'module:function', e.g. 'mpe2.simple_spread_v3:parallel_env'")
    try:
        imported = importlib.import_module(module)
    except Exception as error:
        raise import_failure("entry_point", entry_point, module, error) from None
    target = imported
    for part in name.split("."):
        if not hasattr(target, part):
            raise ValueError(f"environment.entry_point = {entry_point!r}: the module {module!r} has no {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"environment.entry_point = {entry_point!r}: {name!r} is not callable")
    return target


def _build(entry_point: str, kwargs: dict, render_mode: str | None = None) -> object:
    """Calls the entry point with kwargs (and render_mode when given) and checks that it returned a parallel env."""
    function = _resolve(entry_point)
    if render_mode is not None:
        kwargs = {**kwargs, "render_mode": render_mode}
    try:
        env = function(**kwargs)
    except Exception as error:
        raise ValueError(
            f"environment.entry_point = {entry_point!r} with environment.kwargs = {kwargs!r} failed: "
            f"{type(error).__name__}: {error}"
        ) from None
    needed = ("possible_agents", "reset", "step", "observation_space", "action_space")
    missing = [name for name in needed if not hasattr(env, name)]
    if missing:
        raise ValueError(
            f"environment.entry_point = {entry_point!r} returned a {type(env).__name__}, which lacks {missing}: return "
            "an environment of PettingZoo's parallel API (pettingzoo.ParallelEnv; for an AEC environment, convert it "
            "with pettingzoo.utils.conversions.aec_to_parallel)"
        )
    return env


def _probe(entry_point: str, kwargs: dict) -> _Probe:
    """Builds and resets the environment once per (entry point, kwargs) to read its agents and spaces, then closes it.

    Raises:
        ValueError: For an entry point that cannot be built, no agents, agents with different spaces, spaces the models
            cannot take, or a reset that does not start every one of ``possible_agents``.
    """
    key = (entry_point, _hashable(kwargs))
    if key in _probes:
        return _probes[key]
    env = _build(entry_point, kwargs)
    try:
        agents = tuple(env.possible_agents)
        if not agents:
            raise ValueError(f"environment.entry_point = {entry_point!r}: the environment has no possible_agents")
        observation_space, action_space = env.observation_space(agents[0]), env.action_space(agents[0])
        for agent in agents[1:]:
            for what, mine, first in (
                ("observation", env.observation_space(agent), observation_space),
                ("action", env.action_space(agent), action_space),
            ):
                if mine != first:
                    raise ValueError(
                        f"environment.entry_point = {entry_point!r}: agent {agent!r} has the {what} space {mine}, but "
                        f"agent {agents[0]!r} has {first}; one shared policy needs the same spaces for every agent "
                        "(pad observations and actions to a common space, e.g. with SuperSuit's pad wrappers)"
                    )
        env.reset(seed=0)
        started = list(env.agents)
        if sorted(started) != sorted(agents):
            raise ValueError(
                f"environment.entry_point = {entry_point!r}: reset started the agents {started}, not all of "
                f"possible_agents {list(agents)}; the trainer needs a fixed agent count, every agent in every episode"
            )
        render_modes = tuple((getattr(env, "metadata", None) or {}).get("render_modes") or ())
    finally:
        env.close()
    if _layout(observation_space) is None:
        raise ValueError(
            f"environment.entry_point = {entry_point!r} has the observation space {observation_space}, which the models "
            f"cannot take; {SUPPORTED}"
        )
    try:
        ActionSpec.of(action_space)
    except ValueError as error:
        raise ValueError(f"environment.entry_point = {entry_point!r}: {error}") from None
    _probes[key] = _Probe(agents, observation_space, action_space, render_modes)
    return _probes[key]


class ParallelAgents:
    """A PettingZoo parallel environment as K worker lanes: lists of K observations, rewards and actions.

    ``env_group.EnvGroup`` and evaluation.py recognise it by its ``lanes`` attribute. Observations and actions are
    converted as in the Gymnasium family; the observation and action spaces are those of one agent.

    Attributes:
        lanes: The number of agents K.
        agents: Their names, in the order of the lanes (possible_agents).
        observation_space: One agent's observation space as the models see it.
        action_space: One agent's action space as the models act in it (actions from 0).
        max_episode_steps: Steps after which every agent is truncated, -1 for none.
    """

    def __init__(
        self,
        entry_point: str,
        kwargs: dict | None = None,
        max_episode_steps: int = -1,
        episode_info: list[str] | tuple[str, ...] = (),
        render_mode: str | None = None,
    ) -> None:
        """Builds the environment; see the module docstring for the arguments."""
        kwargs = dict(kwargs or {})
        probe = _probe(entry_point, kwargs)
        self.env = _build(entry_point, kwargs, render_mode)
        self.agents = list(probe.agents)
        self.lanes = len(self.agents)
        self.max_episode_steps = max_episode_steps if max_episode_steps > 0 else -1
        self.render_mode = render_mode
        self.metadata = dict(getattr(self.env, "metadata", None) or {})
        self._name = entry_point
        self._inner_observations = probe.observation_space
        self._layout = _layout(probe.observation_space)
        self._raw_leaves = raw_leaves(probe.observation_space, self._layout)
        self.observation_space = _converted_space(probe.observation_space, self._layout)
        self._inner_actions = probe.action_space
        self.action_space = model_action_space(probe.action_space)
        self._episode_info = tuple(episode_info)
        self._returns = np.zeros(self.lanes, dtype=np.float64)
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list, dict]:
        """Starts a new episode of every agent.

        Returns:
            The K first observations, in lane order, and the environment's reset infos.

        Raises:
            AgentChangeError: If the reset did not start every one of ``agents``.
        """
        obs, infos = self.env.reset(seed=seed, options=options)
        self._check_agents(obs, "reset")
        self._returns[:] = 0.0
        self._length = 0
        return self._observe(obs), infos

    def step(self, actions: list) -> tuple[list, list[float], list[bool], list[bool], dict]:
        """Steps every agent.

        Args:
            actions: One action per lane, in lane order, each as for the Gymnasium family (from 0).

        Returns:
            K observations, K rewards, K terminated and K truncated flags and info: the environment's infos under
            "agents", and at the episode's last step "episodes", one dict per agent. At that step every agent is
            either terminated (by the environment) or truncated (by the environment or the step limit), never both:
            a truncated agent's value is bootstrapped even where others terminated on the same step.

        Raises:
            AgentChangeError: If some agents ended their episode while others went on, or the agents changed.
        """
        inner = self._inner_actions
        joint = {agent: inner_action(action, inner) for agent, action in zip(self.agents, actions, strict=True)}
        obs, rewards, terminations, truncations, infos = self.env.step(joint)
        self._length += 1
        self._check_agents(obs, f"step {self._length}")
        limit_reached = 0 < self.max_episode_steps <= self._length
        ended = [bool(terminations.get(agent, False)) or bool(truncations.get(agent, False)) for agent in self.agents]
        if any(ended) and not all(ended):
            went_on = [agent for agent, done in zip(self.agents, ended, strict=True) if not done]
            finished = [agent for agent, done in zip(self.agents, ended, strict=True) if done]
            raise AgentChangeError(self._change_message(f"agent(s) {finished} ended their episode while {went_on} went on"))
        over = all(ended) or limit_reached
        terminated = [over and bool(terminations.get(agent, False)) for agent in self.agents]
        truncated = [over and not term for term in terminated]
        step_rewards = [float(rewards.get(agent, 0.0)) for agent in self.agents]
        self._returns += step_rewards
        info = {"agents": infos}
        if over:
            info["episodes"] = self._episodes(infos)
        return self._observe(obs), step_rewards, terminated, truncated, info

    def _observe(self, obs: dict) -> list:
        """The agents' observations in lane order, each checked against the agents' space and converted as in the
        Gymnasium family.

        Raises:
            ObservationError: Naming the agent whose observation does not fit the space.
        """
        converted = []
        for agent in self.agents:
            try:
                check_raw(obs[agent], self._inner_observations, self._raw_leaves)
            except ObservationError as error:
                raise ObservationError(f"agent {agent!r}: {error}") from None
            converted.append(_convert(obs[agent], self._layout))
        return converted

    def _episodes(self, infos: dict) -> list[dict[str, float]]:
        """One dict per agent for the episode that just ended, see the module docstring."""
        episodes = []
        for k, agent in enumerate(self.agents):
            episode = {"reward": float(self._returns[k]), "length": float(self._length)}
            for key in self._episode_info:
                value = _number((infos.get(agent) or {}).get(key))
                if value is not None:
                    episode[key] = value
            episodes.append(episode)
        team = {"team_reward": float(self._returns.sum())}
        if all("success" in episode for episode in episodes):
            team["team_success"] = float(all(episode["success"] > 0 for episode in episodes))
        return [{**episode, **team} for episode in episodes]

    def _check_agents(self, obs: dict, when: str) -> None:
        """Raises AgentChangeError if the agents that got an observation are not exactly ``agents``."""
        if sorted(obs) != sorted(self.agents):
            raise AgentChangeError(self._change_message(f"at {when} the agents are {sorted(obs)}, not {self.agents}"))

    def _change_message(self, what: str) -> str:
        """The error text of an agent change."""
        return (
            f"environment {self._name!r}: {what}; the trainer needs a fixed agent count, every agent in every step "
            "until all end together: keep a finished agent in the episode (e.g. with a no-op and zero reward) until "
            "the others finish"
        )

    def render(self) -> object:
        """The environment's render() (a frame in "rgb_array" mode)."""
        return self.env.render()

    def close(self) -> None:
        """Closes the environment."""
        self.env.close()


def _check(config: dict) -> None:
    """Checks the values of a validated PettingZoo section and builds the environment once to check it."""
    entry_point = config["entry_point"]
    if not isinstance(entry_point, str) or not entry_point.strip():
        raise invalid("entry_point", entry_point, "use 'module:function' of a function that returns a parallel env")
    check_kwargs(config["kwargs"], _RESERVED_KWARGS)
    if config["max_episode_steps"] == 0 or config["max_episode_steps"] < -1:
        raise invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1, or -1 for none")
    check_episode_info(config["episode_info"])
    _probe(entry_point, config["kwargs"])


def _render_modes(config: dict) -> tuple[str | None, ...]:
    """None plus those of "rgb_array" and "human" that the environment lists in its metadata."""
    declared = _probe(config["entry_point"], config["kwargs"]).render_modes
    return (None, *(mode for mode in ("rgb_array", "human") if mode in declared))


FAMILY = EnvFamily(
    name="PettingZoo",
    schema={
        "entry_point": Key(REQUIRED, "'module:function' of a function (or class) that returns a pettingzoo.ParallelEnv"),
        "kwargs": Key({}, "keyword arguments passed to the entry point"),
        "max_episode_steps": Key(-1, "> 0: truncate every agent after this many steps; -1: the environment's own end"),
        "episode_info": Key(["success"], "numeric keys of an agent's final info reported per agent, where present"),
    },
    check=_check,
    render_modes=_render_modes,
    make=lambda config, render_mode, evaluation: ParallelAgents(**config, render_mode=render_mode),
    agents=lambda config: len(_probe(config["entry_point"], config["kwargs"]).agents),
)
