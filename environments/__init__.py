"""Environments and the one place that checks the ``environment:`` config section and builds environments from it.

Every environment is a gymnasium.Env with a float32 Box observation space (images channel-first in [0, 1]), a
Discrete or MultiDiscrete action space, the attribute ``max_episode_steps`` (-1 when unbounded) and, at the step that
ends an episode, ``info["episode"]`` with at least "reward" (undiscounted return) and "length". Time limits are
reported as truncated, never as terminated, and the two flags are never both set: a terminal state reached on the
last allowed step counts as terminated.

Modules of the heavier environments (MiniGrid, Memory Gym, which imports pygame) are imported only when needed.
"""

import functools

import gymnasium

from environments.cartpole_env import CartPoleEnv
from environments.failing_env import FailingEnv
from environments.poc_memory_env import PocMemoryEnv, step_ticks

ENV_TYPES = ("PocMemoryEnv", "CartPole", "MiniGrid", "MemoryGym", "Failing")

_REQUIRED = object()  # marks a key without a default

# Keys per environment type with their defaults; a value's type also fixes the type a config value must have.
_SCHEMAS: dict[str, dict[str, object]] = {
    "PocMemoryEnv": {
        "step_size": 0.2,  # distance of one move; 1 / step_size moves lead from the centre to a goal
        "glob": False,  # start anywhere between the goals instead of at the centre
        "freeze": True,  # the agent cannot move while the goals are shown
        "max_episode_steps": 32,  # truncation limit, -1 for none
    },
    "CartPole": {
        "name": "CartPole-v0",  # CartPole-v0 (200 steps) or CartPole-v1 (500 steps)
        "mask_velocity": True,  # hide both velocities so that the agent needs memory
        "reward_scale": 0.01,  # factor on each step's reward; episode stats stay unscaled
    },
    "MiniGrid": {
        "name": "MiniGrid-MemoryS9-v0",  # any registered MiniGrid-Memory* id
        "view_size": 3,  # side of the agent's view in cells (odd, >= 3)
        "tile_size": 28,  # pixels per cell; view_size * tile_size is the image side
        "max_episode_steps": 96,  # truncation limit
    },
    "MemoryGym": {
        "name": _REQUIRED,  # a Memory Gym id, e.g. MortarMayhem-Grid-v0
        "reset_params": {"start-seed": 0, "num-seeds": 100000},  # memory-gym reset parameters plus the seed range
    },
    "Failing": {
        "fail_at_step": 5,  # lifetime step at which the env fails
        "mode": "raise",  # "raise" a RuntimeError or "exit" the process with code 3
        "obs_size": 4,  # length of the observation vector
    },
}

_RENDER_MODES = {
    "PocMemoryEnv": (None, "rgb_array", "human"),
    "CartPole": (None, "rgb_array", "human"),
    "MiniGrid": (None, "rgb_array", "human"),
    "MemoryGym": (None, "rgb_array", "debug_rgb_array", "human"),
    "Failing": (None,),
}


def validate_env_config(env_config: dict) -> dict:
    """Checks the ``environment:`` section of a training config and fills in defaults.

    Args:
        env_config: The section as loaded from YAML; it is not modified.

    Returns:
        A new dict with every key of the environment type, defaults filled in (reset_params merged with their
        defaults for Memory Gym).

    Raises:
        ValueError: Naming the key as ``environment.<key>``, the bad value and what is allowed.
    """
    if not isinstance(env_config, dict):
        raise ValueError(f"environment = {env_config!r} must be a mapping with at least a 'type' key")
    env_type = env_config.get("type")
    if env_type not in ENV_TYPES:
        raise ValueError(f"environment.type = {env_type!r} is not a known environment type; use one of {', '.join(ENV_TYPES)}")
    schema = _SCHEMAS[env_type]
    unknown = sorted(set(env_config) - set(schema) - {"type"})
    if unknown:
        raise ValueError(
            f"environment.{unknown[0]} is not a key of a {env_type} environment; allowed keys: type, {', '.join(schema)}"
        )

    config = {"type": env_type}
    for key, default in schema.items():
        if key not in env_config:
            if default is _REQUIRED:
                raise ValueError(f"environment.{key} is required for {env_type}")
            config[key] = dict(default) if isinstance(default, dict) else default
            continue
        value = env_config[key]
        if default is not _REQUIRED and not _same_type(value, default):
            raise ValueError(f"environment.{key} = {value!r} must be of type {type(default).__name__}")
        config[key] = dict(value) if isinstance(value, dict) else value
    _VALUE_CHECKS[env_type](config)
    return config


def create_env(env_config: dict, render_mode: str | None = None, evaluation: bool = False) -> gymnasium.Env:
    """Validates an ``environment:`` config section and builds the environment.

    Args:
        env_config: The config section, see ``validate_env_config``.
        render_mode: None, "rgb_array" for frames from ``render()``, or "human" for a window (where supported).
        evaluation: Whether to draw episodes from seeds disjoint from training. Only Memory Gym needs this (it draws
            its own seeds); for the others the caller passes a different seed to the first reset.

    Returns:
        The environment.

    Raises:
        ValueError: For an invalid config or a render mode the environment does not support.
    """
    config = validate_env_config(env_config)
    env_type = config.pop("type")
    if render_mode not in _RENDER_MODES[env_type]:
        raise ValueError(f"render_mode = {render_mode!r} is not supported by {env_type}; use one of {_RENDER_MODES[env_type]}")
    if env_type == "PocMemoryEnv":
        return PocMemoryEnv(**config, render_mode=render_mode)
    if env_type == "CartPole":
        return CartPoleEnv(**config, render_mode=render_mode)
    if env_type == "MiniGrid":
        from environments.minigrid_env import MiniGridMemoryEnv

        return MiniGridMemoryEnv(**config, render_mode=render_mode)
    if env_type == "MemoryGym":
        from environments.memory_gym_env import MemoryGymEnv

        return MemoryGymEnv(**config, render_mode=render_mode, evaluation=evaluation)
    return FailingEnv(**config)  # the remaining entry of ENV_TYPES, guaranteed by validate_env_config


def _same_type(value: object, default: object) -> bool:
    """Whether value has the type of default; ints pass for floats, but bools never pass for numbers."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _invalid(key: str, value: object, allowed: str) -> ValueError:
    """Builds the error for a config value of the right type but outside the allowed values."""
    return ValueError(f"environment.{key} = {value!r} is invalid; {allowed}")


def _check_poc(config: dict) -> None:
    """Checks PocMemoryEnv values."""
    if step_ticks(config["step_size"]) is None:
        raise _invalid("step_size", config["step_size"], "use a value in (0, 1] that divides 1 evenly, e.g. 0.1, 0.2 or 0.25")
    if config["max_episode_steps"] < 1 and config["max_episode_steps"] != -1:
        raise _invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1, or -1 for no limit")


def _check_cartpole(config: dict) -> None:
    """Checks CartPole values."""
    if config["name"] not in ("CartPole-v0", "CartPole-v1"):
        raise _invalid("name", config["name"], "use 'CartPole-v0' or 'CartPole-v1'")
    if config["reward_scale"] <= 0:
        raise _invalid("reward_scale", config["reward_scale"], "use a factor > 0, e.g. 0.01")


def _check_minigrid(config: dict) -> None:
    """Checks MiniGrid values against gymnasium's registry."""
    import minigrid  # noqa: F401  (importing registers the MiniGrid-* ids)

    names = sorted(name for name in gymnasium.registry if name.startswith("MiniGrid-Memory"))
    if config["name"] not in names:
        raise _invalid("name", config["name"], f"use a registered MiniGrid Memory id: {', '.join(names)}")
    if config["view_size"] < 3 or config["view_size"] % 2 == 0:
        raise _invalid("view_size", config["view_size"], "MiniGrid needs an odd view size >= 3")
    if config["tile_size"] < 1:
        raise _invalid("tile_size", config["tile_size"], "use a pixel count >= 1, e.g. 28")
    if config["max_episode_steps"] < 1:
        raise _invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1")
    own_limit = _minigrid_step_limit(config["name"])
    if config["max_episode_steps"] > own_limit:
        raise _invalid("max_episode_steps", config["max_episode_steps"], f"{config['name']} allows at most {own_limit}")


@functools.cache
def _minigrid_step_limit(name: str) -> int:
    """MiniGrid's own max_steps of a task (it also scales the step penalty of the reward); built once per name."""
    env = gymnasium.make(name)
    try:
        return env.unwrapped.max_steps
    finally:
        env.close()


def _check_memory_gym(config: dict) -> None:
    """Checks the Memory Gym id and reset parameters; fills in the seed range defaults."""
    from environments.memory_gym_env import DEFAULT_RESET_PARAMS, check_reset_params, registered_ids

    names = registered_ids()
    if not isinstance(config["name"], str) or config["name"] not in names:
        raise _invalid("name", config["name"], f"use a registered Memory Gym id: {', '.join(names)}")
    config["reset_params"] = {**DEFAULT_RESET_PARAMS, **config["reset_params"]}
    check_reset_params(config["name"], config["reset_params"])


def _check_failing(config: dict) -> None:
    """Checks Failing values."""
    if config["fail_at_step"] < 1:
        raise _invalid("fail_at_step", config["fail_at_step"], "use a step count >= 1")
    if config["mode"] not in ("raise", "exit"):
        raise _invalid("mode", config["mode"], "use 'raise' or 'exit'")
    if config["obs_size"] < 1:
        raise _invalid("obs_size", config["obs_size"], "use a length >= 1")


_VALUE_CHECKS = {
    "PocMemoryEnv": _check_poc,
    "CartPole": _check_cartpole,
    "MiniGrid": _check_minigrid,
    "MemoryGym": _check_memory_gym,
    "Failing": _check_failing,
}
