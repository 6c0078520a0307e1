"""What an environment family declares, and the config checks that every family shares.

A family is one ``type`` of the ``environment:`` config section. Its module declares it once, as a module-level
``FAMILY = EnvFamily(...)``: the config keys with their defaults and one-line meanings, a check of the values, the
render modes and the constructor. ``environments/__init__.py`` lists the family modules and builds ``FAMILIES`` from
them. Declaring a family must stay cheap: a family whose environment needs a heavy package (pygame, MiniGrid) imports
it inside ``make`` and ``check``, never at module level.

This module imports nothing of the package, so that family modules can import it while the package is being imported.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium


class _Required:
    """Type of REQUIRED; its repr keeps generated docs and error messages readable."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()  # the default of a key that every config must set


class Key(NamedTuple):
    """One config key of a family: its default (or REQUIRED) and a one-line meaning for docs and errors.

    The type of the default is also the type a config value must have: ints pass for floats, bools never pass for
    numbers; a REQUIRED key is type-checked by the family's ``check``.
    """

    default: object
    meaning: str


RenderModes = tuple[str | None, ...]


def _no_check(config: dict) -> None:
    """The check of a family whose keys need no more than their type."""


def _one_agent(config: dict) -> int:
    """The agent count of a single-agent family."""
    return 1


def _limit_from_key(config: dict) -> int:
    """The episode limit of a family whose config has a ``max_episode_steps`` key, else -1 (unknown or unbounded)."""
    limit = config.get("max_episode_steps", -1)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else -1


@dataclass(frozen=True)
class EnvFamily:
    """The declaration of one environment type.

    Attributes:
        name: The ``environment.type`` that selects the family.
        schema: Config keys (besides ``type``) in documentation order, each a Key(default, meaning).
        make: Builds the environment: ``make(config, render_mode, evaluation)``, where config is the validated section
            without "type", render_mode one of the family's render modes and evaluation whether to draw episodes from
            seeds disjoint from training (only families that draw their own seeds need it).
        check: Checks the values of a section whose keys and types are already checked, raising ValueError naming
            ``environment.<key>`` (``invalid`` builds one). It may fill in derived values in place.
        render_modes: The render modes ``create_env`` accepts: a tuple, or a function of the validated section for
            families where they depend on the configured environment.
        episode_limit: The number of steps after which an episode always ends, from the validated section; -1 when
            unknown or unbounded. The default reads the key ``max_episode_steps`` where the family has it.
        agents: The number of agents K of one environment of the validated section, 1 for single-agent families. A
            multi-agent environment fills K consecutive worker lanes (memory streams), see env_group.py.
        test_only: Whether the family exists for the tests (it stays registered, but error messages do not offer it).
    """

    name: str
    schema: dict[str, Key]
    make: Callable[[dict, str | None, bool], gymnasium.Env]
    check: Callable[[dict], None] = _no_check
    render_modes: RenderModes | Callable[[dict], RenderModes] = (None,)
    episode_limit: Callable[[dict], int] = _limit_from_key
    agents: Callable[[dict], int] = _one_agent
    test_only: bool = False

    def validate(self, env_config: dict) -> dict:
        """Checks keys, types and values of a section of this family's type and fills in defaults.

        Args:
            env_config: The section, with ``type`` equal to this family's name; it is not modified.

        Returns:
            A new dict with "type" and every key of the schema (values copied, so changing them leaves the input alone).

        Raises:
            ValueError: Naming the key as ``environment.<key>``, the bad value and what is allowed.
        """
        unknown = sorted(set(env_config) - set(self.schema) - {"type"})
        if unknown:
            allowed = ", ".join(["type", *self.schema])
            raise ValueError(f"environment.{unknown[0]} is not a key of a {self.name} environment; allowed keys: {allowed}")
        config = {"type": self.name}
        for key, (default, _) in self.schema.items():
            if key not in env_config:
                if default is REQUIRED:
                    raise ValueError(f"environment.{key} is required for {self.name}")
                config[key] = copy.deepcopy(default)
                continue
            value = env_config[key]
            if default is not REQUIRED and not same_type(value, default):
                raise ValueError(f"environment.{key} = {value!r} must be of type {type(default).__name__}")
            config[key] = copy.deepcopy(value)
        self.check(config)
        return config

    def allowed_render_modes(self, config: dict) -> RenderModes:
        """The render modes of the validated section ``config``."""
        return self.render_modes(config) if callable(self.render_modes) else self.render_modes


def same_type(value: object, default: object) -> bool:
    """Whether value has the type of default; ints pass for floats, but bools never pass for numbers."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def import_failure(key: str, value: str, module: str, error: Exception) -> ValueError:
    """The error for a config's ``key`` = ``value`` whose module ``module`` failed to import with ``error``; a module
    that is not found may be the user's own file, which Python finds from the folder it runs in or on PYTHONPATH (a
    resumed run or a model played from another folder needs the same as the first run)."""
    message = f"environment.{key} = {value!r}: importing the module {module!r} failed with {type(error).__name__}: {error}"
    if isinstance(error, ModuleNotFoundError) and error.name is not None and module.startswith(error.name):
        message += (
            f"; if {module!r} is a file of your own, run from the folder that holds it or add that folder to "
            "PYTHONPATH, as for the run that trained with it (e.g. PYTHONPATH=/path/to/folder python train.py --resume=...)"
        )
    return ValueError(message)


def invalid(key: str, value: object, allowed: str) -> ValueError:
    """Builds the error for a config value of the right type but outside the allowed values."""
    return ValueError(f"environment.{key} = {value!r} is invalid; {allowed}")
