"""Any registered Gymnasium environment, by id, so that a task of one's own needs no change to this package.

Config::

    environment:
      type: Gymnasium
      id: "my_package.my_module:MyTask-v0"  # "module:Name-v0" imports the module first, which registers the id
      kwargs: {}                             # passed to gymnasium.make
      max_episode_steps: 0                   # 0: the spec's limit; > 0: this limit; -1: no limit
      episode_info: [success]                # numeric keys of the final info reported per episode, where present

Observations become what the models take: a uint8 Box image (H, W, C) or (C, H, W) with C in 1..4 becomes (C, H, W)
float32 in [0, 1] (a (H, W) image becomes (1, H, W)); a 1-D Box vector of any dtype becomes float32 unchanged; a
Discrete or 1-D MultiDiscrete observation becomes a one-hot float32 vector (one block per entry, its first entry for
the code ``start``); a Dict of these
(not nested) becomes a dict of them, each key encoded by its own encoder, and so does a Tuple of these, its parts
keyed "0", "1", ... (zero-padded: "00" to "11" for 12 parts).
Actions must be Discrete or (1-D) MultiDiscrete, where a nonzero ``start`` is shifted to 0, or a 1-D Box with finite
bounds (continuous actions; the workers clip them to the bounds). Time limits come from
gymnasium's TimeLimit wrapper and stay truncations; a step that is both terminated and truncated counts as terminated.

Every observation is checked against the environment's declared space before it is converted (``check_raw``): its
shape and dtype kind, the keys of a Dict and the parts of a Tuple, the codes of a Discrete or MultiDiscrete and the
levels of an image; one that does not fit raises ``observations.ObservationError``.

Checking a config builds the environment once (cached per id and kwargs) to read its spaces, so that an unknown id,
a module that fails to import or spaces the models cannot take stop training before any worker starts.
"""

import dataclasses
import difflib
import importlib
from typing import NamedTuple

import gymnasium
import numpy as np
from gymnasium import spaces

import observations
from environments.action_spec import ActionSpec
from environments.registry import REQUIRED, EnvFamily, Key, import_failure, invalid

SUPPORTED = (
    "supported: observations as a Box of uint8 images (H, W, C) or (C, H, W) with C in 1..4 or (H, W), a 1-D Box "
    "vector of any dtype, Discrete or 1-D MultiDiscrete (one-hot), or a Dict or Tuple of these; actions as Discrete, "
    "1-D MultiDiscrete or a 1-D Box with finite bounds"
)

_RESERVED_KWARGS = {
    "render_mode": "it is set by the caller of create_env (train.py, enjoy.py)",
    "max_episode_steps": "use environment.max_episode_steps",
}

_ALWAYS_REPORTED = ("reward", "length")


class _Probe(NamedTuple):
    """What checking a config learns from building the environment once."""

    spec: gymnasium.envs.registration.EnvSpec
    observation_space: spaces.Space
    action_space: spaces.Space
    render_modes: tuple[str, ...]


_probes: dict[tuple, _Probe] = {}  # by (id, _hashable(kwargs)); forked worker processes inherit it


def _hashable(value: object) -> object:
    """A hashable stand-in for a value loaded from YAML (dicts and lists nested in any way)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(key), _hashable(item)) for key, item in value.items())))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_hashable(item) for item in value))
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return value


def _resolve(env_id: str) -> gymnasium.envs.registration.EnvSpec:
    """Imports the module of a "module:Name" id and finds the spec of the name.

    Raises:
        ValueError: Naming ``environment.id`` when the module fails to import or the name is not registered.
    """
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as error:
            raise import_failure("id", env_id, module, error) from None
    try:
        return gymnasium.spec(name)
    except gymnasium.error.Error as error:
        close = difflib.get_close_matches(name, list(gymnasium.registry), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(match) for match in close)}?" if close else "no registered id is close"
        where = f"after importing {module!r}" if module else "(to register an id from your own module, use 'module:Name-v0')"
        if name.startswith("ALE/") and not module:
            hint = (
                f"Atari ids are registered by ale_py: write 'ale_py:{name}', or use the Atari type "
                f"(environment: {{type: Atari, game: {name[4:].split('-')[0]}}}), which adds the standard preprocessing"
            )
        raise ValueError(f"environment.id = {env_id!r} is not a registered gymnasium id {where}; {hint} ({error})") from None


def _probe(env_id: str, kwargs: dict) -> _Probe:
    """Builds the environment once per (id, kwargs) to read its spaces and render modes, then closes it.

    Raises:
        ValueError: For an id that cannot be resolved or built, or spaces the models cannot take.
    """
    key = (env_id, _hashable(kwargs))
    if key in _probes:
        return _probes[key]
    spec = _resolve(env_id)
    try:
        env = gymnasium.make(spec, **kwargs)
    except Exception as error:
        raise ValueError(
            f"environment.id = {env_id!r} with environment.kwargs = {kwargs!r} could not be built: "
            f"{type(error).__name__}: {error}"
        ) from None
    try:
        probe = _Probe(spec, env.observation_space, env.action_space, tuple(env.metadata.get("render_modes") or ()))
    finally:
        env.close()
    if _layout(probe.observation_space) is None:
        raise ValueError(
            f"environment.id = {env_id!r} has the observation space {probe.observation_space}, which the models cannot "
            f"take; {SUPPORTED}"
        )
    try:
        ActionSpec.of(probe.action_space)
    except ValueError as error:
        raise ValueError(f"environment.id = {env_id!r}: {error}") from None
    _probes[key] = probe
    return probe


def _layout(space: spaces.Space) -> str | tuple | dict | None:
    """How to turn an observation of the space into the models' input: "vector", "hwc", "chw", "hw", ("onehot", counts,
    starts) or a dict of these for a Dict space; None if unsupported (also when any key of a Dict is).

    A uint8 (H, W, C) whose first and last sides both fit a channel count is taken as gymnasium's usual HWC.
    """
    if isinstance(space, spaces.Dict | spaces.Tuple):
        if not space.spaces:
            return None
        layouts = {key: _layout(sub) for key, sub in _parts(space).items()}
        if any(layout is None or isinstance(layout, dict) for layout in layouts.values()):
            return None  # an unsupported part, or a nested Dict or Tuple
        return layouts
    if isinstance(space, spaces.Discrete):
        return ("onehot", (int(space.n),), (int(space.start),))
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return ("onehot", tuple(int(n) for n in space.nvec), tuple(int(start) for start in space.start))
    if not isinstance(space, spaces.Box):
        return None
    shape = space.shape
    if len(shape) == 1 and shape[0] >= 1:
        return "vector"
    if space.dtype != np.uint8:
        return None
    if len(shape) == 2:
        return "hw"
    if len(shape) == 3 and 1 <= shape[2] <= 4:
        return "hwc"
    if len(shape) == 3 and 1 <= shape[0] <= 4:
        return "chw"
    return None


def _parts(space: spaces.Dict | spaces.Tuple) -> dict[str, spaces.Space]:
    """The parts of a Dict space by key, or of a Tuple space by position as keys "0", "1", ... (zero-padded to one
    width, so that their sorted order is their order in the tuple)."""
    if isinstance(space, spaces.Dict):
        return dict(space.spaces)
    width = len(str(len(space.spaces) - 1))
    return {str(i).zfill(width): sub for i, sub in enumerate(space.spaces)}


def _part(container: object, key: str) -> object:
    """Part ``key`` of a Dict space or observation (by name) or of a Tuple one (by position, see ``_parts``)."""
    return container[int(key)] if isinstance(container, tuple | list | spaces.Tuple) else container[key]


def _converted_space(space: spaces.Space, layout: str | tuple | dict) -> spaces.Space:
    """The observation space the models see for a space of this layout (a Tuple's as a Dict of its parts)."""
    if isinstance(layout, dict):
        return spaces.Dict({key: _converted_space(_part(space, key), layout[key]) for key in sorted(layout)})
    if layout == "vector":
        return spaces.Box(low=space.low.astype(np.float32), high=space.high.astype(np.float32), dtype=np.float32)
    if isinstance(layout, tuple):
        return OneHot(sum(layout[1]))
    shape = _convert(np.zeros(space.shape, dtype=np.uint8), layout).shape
    return spaces.Box(low=0.0, high=1.0, shape=shape, dtype=np.float32)


class OneHot(spaces.Box):
    """The space of one-hot codes as the models see them: float32 0s and 1s, one block per entry of a Discrete or
    MultiDiscrete. A Box for everything else; observation normalisation leaves such parts as they are
    (normalization.py)."""

    def __init__(self, size: int) -> None:
        super().__init__(low=0.0, high=1.0, shape=(size,), dtype=np.float32)


def one_hot_blocks(codes: object, counts: tuple[int, ...], starts: tuple[int, ...] | None = None) -> np.ndarray:
    """Integer codes, one per entry (any shape, read in row-major order), as one-hot blocks of ``counts[i]`` entries
    each, concatenated into one float32 vector of sum(counts) entries (also MiniGrid's symbolic view's encoding).

    Entry i's codes run from ``starts[i]`` (0 where starts is None) to starts[i] + counts[i] - 1, as a gymnasium
    Discrete's or MultiDiscrete's ``start``: code starts[i] lights the first entry of block i. The codes must lie in
    that range (``check_raw``); one outside would light an entry of a neighbouring block.
    """
    out = np.zeros(sum(counts), dtype=np.float32)
    offsets = np.asarray(codes, dtype=np.int64).reshape(-1) - np.asarray(starts or 0, dtype=np.int64)
    out[np.cumsum((0,) + counts[:-1]) + offsets] = 1.0
    return out


def _convert(obs: object, layout: str | tuple | dict) -> np.ndarray | dict:
    """An observation of the environment as the models take it (see the module docstring)."""
    if isinstance(layout, dict):
        return {key: _convert(_part(obs, key), layout[key]) for key in sorted(layout)}
    if isinstance(layout, tuple):
        return one_hot_blocks(obs, layout[1], layout[2])
    obs = np.asarray(obs)
    if layout == "vector":
        return obs.astype(np.float32)
    if layout == "hwc":
        obs = obs.transpose(2, 0, 1)
    elif layout == "hw":
        obs = obs[None]
    return np.ascontiguousarray(obs, dtype=np.float32) / 255.0


def raw_leaves(space: spaces.Space, layout: str | tuple | dict) -> dict[str | None, observations.Leaf]:
    """What each array of an environment's observation must be before conversion (see ``observations.check``): a
    vector's shape and dtype kind; an image's shape, an integer dtype and levels within its Box's bounds; a Discrete's
    or MultiDiscrete's shape, an integer dtype and codes from its start to start + n - 1. Keyed as ``_parts`` keys a
    Dict's or Tuple's parts, or {None: leaf}."""
    if isinstance(layout, dict):
        return {key: raw_leaves(_part(space, key), layout[key])[None] for key in sorted(layout)}
    if isinstance(layout, tuple):  # codes of a Discrete or MultiDiscrete
        start = np.asarray(space.start, dtype=np.int64)
        last = start + np.asarray(space.n if isinstance(space, spaces.Discrete) else space.nvec, dtype=np.int64) - 1
        hint = f"its codes run from {start.tolist()} to {last.tolist()} (start to start + n - 1)"
        return {None: observations.Leaf(tuple(space.shape), np.dtype(np.int64), start, last, str(space), hint)}
    if layout == "vector":
        return {None: observations.Leaf(tuple(space.shape), space.dtype, None, None, str(space))}
    low, high = float(space.low.min()), float(space.high.max())  # an image's levels
    return {None: observations.Leaf(tuple(space.shape), space.dtype, low, high, str(space), "images are uint8 levels")}


def check_raw(obs: object, space: spaces.Space, expected: dict[str | None, observations.Leaf]) -> None:
    """Checks an environment's observation against its declared space (``raw_leaves``) before it is converted, where
    a wrong part would otherwise be cut, padded or encoded into a neighbouring block, or fail as a bare numpy error.

    Raises:
        observations.ObservationError: Naming the key (a Tuple's part by its position), the declared and the actual
            shape and dtype (or values), and the fix.
    """
    if isinstance(space, spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            found = f"a {type(obs).__name__}" + (f" of {len(obs)} parts" if isinstance(obs, tuple | list) else "")
            raise observations.ObservationError(
                f"the observation is {found}, but its space {space} declares a tuple of {len(space.spaces)} parts; "
                f"{observations.FIX}"
            )
        obs = {key: obs[int(key)] for key in expected}
    observations.check(obs, expected)


def model_action_space(space: spaces.Space) -> spaces.Space:
    """The action space the models act in for an environment's space: Discrete and MultiDiscrete from 0, a Box as it
    is."""
    if isinstance(space, spaces.Discrete):
        return spaces.Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return spaces.Box(low=space.low, high=space.high, dtype=space.dtype)
    return spaces.MultiDiscrete(space.nvec)


def inner_action(action: int | np.ndarray, space: spaces.Space) -> int | np.ndarray:
    """Shifts an action of ``model_action_space(space)`` (from 0) into ``space`` (by its ``start``; a Box's as it is)."""
    if isinstance(space, spaces.Discrete):
        return int(action) + int(space.start)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(action, dtype=np.int64) + np.asarray(space.start, dtype=np.int64)
    return np.asarray(action, dtype=space.dtype)


def _number(value: object) -> float | None:
    """value as a float if it is a number (or a one-element array of one), else None."""
    if isinstance(value, bool | int | float | np.number | np.bool_):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and np.issubdtype(value.dtype, np.number):
        return float(value.reshape(()))
    return None


class GymnasiumEnv(gymnasium.Wrapper):
    """A registered Gymnasium environment with float32 observations, actions from 0 and per-episode statistics.

    At the step that ends an episode ``info["episode"]`` holds "reward" (the sum of the raw rewards), "length" and each
    key of ``episode_info`` that the final step's info holds as a number, all as floats.
    """

    def __init__(
        self,
        id: str,
        kwargs: dict | None = None,
        max_episode_steps: int = 0,
        episode_info: list[str] | tuple[str, ...] = (),
        render_mode: str | None = None,
    ) -> None:
        """Builds the environment.

        Args:
            id: A gymnasium id; "module:Name-v0" imports the module first.
            kwargs: Keyword arguments for gymnasium.make (and so for the environment's constructor).
            max_episode_steps: 0 for the limit of the id's spec, > 0 for this limit, -1 for none.
            episode_info: Keys of the final step's info to report in ``info["episode"]``.
            render_mode: None, or one of the environment's render modes ("rgb_array", "human").
        """
        kwargs = dict(kwargs or {})
        probe = _probe(id, kwargs)
        limit = probe.spec.max_episode_steps if max_episode_steps == 0 else max_episode_steps
        self.max_episode_steps = int(limit) if limit is not None and limit > 0 else -1
        # A spec copy with the limit built in makes gymnasium's own TimeLimit cut the episodes, or none at all.
        spec_limit = self.max_episode_steps if self.max_episode_steps > 0 else None
        spec = dataclasses.replace(probe.spec, max_episode_steps=spec_limit)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        super().__init__(gymnasium.make(spec, **kwargs))

        inner = self.env.observation_space
        self._layout = _layout(inner)
        self._raw_leaves = raw_leaves(inner, self._layout)
        self.observation_space = _converted_space(inner, self._layout)
        self.action_space = model_action_space(self.env.action_space)
        self._episode_info = tuple(episode_info)
        self._return = 0.0
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Passed on to the environment's reset, which seeds its generator when given.
            options: Passed on to the environment's reset.

        Returns:
            The first observation and the environment's reset info.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self._length = 0
        return self._observe(obs), info

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Runs one step.

        Args:
            action: An int in [0, n) for Discrete spaces, an int array (branches,) for MultiDiscrete spaces.

        Returns:
            Observation, reward, terminated, truncated (never together with terminated) and info, with
            ``info["episode"]`` at the episode's last step.
        """
        obs, reward, terminated, truncated, info = self.env.step(self._inner_action(action))
        terminated = bool(terminated)
        truncated = bool(truncated) and not terminated
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            episode = {"reward": self._return, "length": float(self._length)}
            for key in self._episode_info:
                value = _number(info.get(key))
                if value is not None:
                    episode[key] = value
            info = {**info, "episode": episode}
        return self._observe(obs), float(reward), terminated, truncated, info

    def _inner_action(self, action: int | np.ndarray) -> int | np.ndarray:
        """Shifts an action of this wrapper's space (from 0) into the environment's space (a Box's as it is)."""
        return inner_action(action, self.env.action_space)

    def _observe(self, obs: object) -> np.ndarray | dict:
        """The environment's observation as the models take it: a float32 vector, a (C, H, W) float32 image in
        [0, 1], or a dict of them.

        Raises:
            observations.ObservationError: If the observation does not fit the environment's declared space.
        """
        check_raw(obs, self.env.observation_space, self._raw_leaves)
        return _convert(obs, self._layout)


def check_kwargs(kwargs: dict, reserved: dict[str, str]) -> None:
    """Checks the ``kwargs`` key of a section: string keys, none of the reserved ones (name -> why)."""
    for key in kwargs:
        if not isinstance(key, str):
            raise invalid("kwargs", kwargs, "keys must be strings (keyword argument names)")
        if key in reserved:
            raise invalid("kwargs", kwargs, f"remove {key!r}: {reserved[key]}")


def check_episode_info(episode_info: list) -> None:
    """Checks the ``episode_info`` key of a section: info keys as strings, not those always reported."""
    for key in episode_info:
        if not isinstance(key, str):
            raise invalid("episode_info", episode_info, "list the info keys as strings, e.g. [success]")
        if key in _ALWAYS_REPORTED:
            raise invalid("episode_info", episode_info, f"{key!r} is always reported; list only the other keys")


def _check(config: dict) -> None:
    """Checks the values of a validated Gymnasium section and builds the environment once to check its spaces."""
    env_id = config["id"]
    if not isinstance(env_id, str) or not env_id.strip():
        raise invalid("id", env_id, "use a registered gymnasium id, e.g. 'CartPole-v1' or 'my_module:MyTask-v0'")
    check_kwargs(config["kwargs"], _RESERVED_KWARGS)
    if config["max_episode_steps"] < -1:
        allowed = "use 0 for the id's own limit, a step count >= 1, or -1 for none"
        raise invalid("max_episode_steps", config["max_episode_steps"], allowed)
    check_episode_info(config["episode_info"])
    _probe(env_id, config["kwargs"])


def _render_modes(config: dict) -> tuple[str | None, ...]:
    """None plus those of "rgb_array" and "human" that the environment lists in its metadata."""
    declared = _probe(config["id"], config["kwargs"]).render_modes
    return (None, *(mode for mode in ("rgb_array", "human") if mode in declared))


def _episode_limit(config: dict) -> int:
    """The configured limit, or the spec's when the key is 0; -1 for none."""
    if config["max_episode_steps"] != 0:
        return config["max_episode_steps"]
    limit = _probe(config["id"], config["kwargs"]).spec.max_episode_steps
    return int(limit) if limit is not None and limit > 0 else -1


FAMILY = EnvFamily(
    name="Gymnasium",
    schema={
        "id": Key(REQUIRED, "a gymnasium id; 'module:Name-v0' imports the module first, which registers the id"),
        "kwargs": Key({}, "keyword arguments passed to gymnasium.make"),
        "max_episode_steps": Key(0, "0: the limit of the id's spec; > 0: truncate after this many steps; -1: no limit"),
        "episode_info": Key(["success"], "numeric keys of the final step's info reported per episode, where present"),
    },
    check=_check,
    render_modes=_render_modes,
    make=lambda config, render_mode, evaluation: GymnasiumEnv(**config, render_mode=render_mode),
    episode_limit=_episode_limit,
)
