"""Environments and the one place that checks the ``environment:`` config section and builds environments from it.

Every environment is a gymnasium.Env with a float32 Box observation space (images channel-first in [0, 1]), a
Discrete or MultiDiscrete action space, the attribute ``max_episode_steps`` (-1 when unbounded) and, at the step that
ends an episode, ``info["episode"]`` with at least "reward" (undiscounted return) and "length". Time limits are
reported as truncated, never as terminated, and the two flags are never both set: a terminal state reached on the
last allowed step counts as terminated.

Each ``environment.type`` is a family declared in its own module as ``FAMILY = EnvFamily(...)`` (see
``environments/registry.py``): config keys with defaults and meanings, value checks, render modes and constructor.
Adding a family is one module plus one line in ``_FAMILY_MODULES``. The "Gymnasium" family runs any registered
gymnasium id, so a task of one's own needs no change here at all.

Modules of the heavier environments (MiniGrid, Memory Gym, which imports pygame; Atari's ale-py and OpenCV) are
imported only when needed.
"""

import difflib
import importlib

import gymnasium

from environments.registry import REQUIRED, EnvFamily, Key

# One module per family, each defining FAMILY; the order is the order of ENV_TYPES.
_FAMILY_MODULES = (
    "environments.poc_memory_env",
    "environments.cartpole_env",
    "environments.minigrid_env",
    "environments.memory_gym_env",
    "environments.atari_env",
    "environments.failing_env",
    "environments.gymnasium_env",
    "environments.pettingzoo_env",
)

FAMILIES: dict[str, EnvFamily] = {
    family.name: family for family in (importlib.import_module(module).FAMILY for module in _FAMILY_MODULES)
}
ENV_TYPES = tuple(FAMILIES)
# The types offered to users in error messages: the registered ones but those made for the tests (Failing).
USER_TYPES = tuple(name for name, family in FAMILIES.items() if not family.test_only)
# The key that names the task within a family, where it has one: the environment's id in error messages.
_ID_KEYS = ("id", "entry_point", "name", "game")

__all__ = [
    "ENV_TYPES",
    "FAMILIES",
    "REQUIRED",
    "EnvFamily",
    "Key",
    "USER_TYPES",
    "agents_per_env",
    "create_env",
    "environment_id",
    "episode_limit",
    "validate_env_config",
]


def _family(env_config: object) -> EnvFamily:
    """Returns the family of a section, or raises the ValueError for a section without a known type."""
    if not isinstance(env_config, dict):
        raise ValueError(f"environment = {env_config!r} must be a mapping with at least a 'type' key")
    env_type = env_config.get("type")
    if not isinstance(env_type, str) or env_type not in FAMILIES:
        close = difflib.get_close_matches(str(env_type), USER_TYPES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? Otherwise use" if close else "use"
        raise ValueError(
            f"environment.type = {env_type!r} is not a known environment type; {hint} one of {', '.join(USER_TYPES)}"
        )
    return FAMILIES[env_type]


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
    return _family(env_config).validate(env_config)


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
    family = _family(env_config)
    config = family.validate(env_config)
    modes = family.allowed_render_modes(config)
    if render_mode not in modes:
        raise ValueError(f"render_mode = {render_mode!r} is not supported by {family.name}; use one of {modes}")
    del config["type"]
    return family.make(config, render_mode, evaluation)


def episode_limit(env_config: dict) -> int:
    """The number of steps after which every episode of a validated ``environment:`` section ends.

    Args:
        env_config: A section as returned by ``validate_env_config``.

    Returns:
        The limit, or -1 when it is unknown or episodes are unbounded (e.g. Memory Gym, whose limit depends on its
        reset parameters; a Gymnasium id whose spec has no limit and no ``max_episode_steps`` is configured).
    """
    return _family(env_config).episode_limit(env_config)


def environment_id(env_config: dict) -> str:
    """How error messages name the environment of a validated ``environment:`` section: its type and, where the family
    has one, the key that names the task, e.g. "Gymnasium 'CartPole-v1'" or "PocMemoryEnv"."""
    key = next((key for key in _ID_KEYS if key in env_config), None)
    return env_config["type"] if key is None else f"{env_config['type']} {env_config[key]!r}"


def agents_per_env(env_config: dict) -> int:
    """The number of agents K of one environment of a validated ``environment:`` section: 1 for single-agent tasks.

    Each agent is a worker lane with its own memory, so ``n_workers`` lanes take n_workers / K environments.
    """
    return _family(env_config).agents(env_config)
