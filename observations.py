"""Observations are one array, or a dict of named arrays (a gymnasium Dict space: e.g. an image and a vector).

Everything that moves observations around (the environment groups and workers, the rollout, the buffer, the model,
evaluation) goes through these few helpers, so that both kinds take the same path. Leaves are numpy arrays or torch
tensors; a dict observation keeps its keys in sorted order everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

Shape = tuple[int, ...] | dict[str, tuple[int, ...]]


def shape_of(space: gymnasium.Space) -> Shape:
    """The observation shape of a (converted) observation space: a Box's shape, or a Dict's shape per key."""
    if isinstance(space, gymnasium.spaces.Dict):
        return {key: tuple(space[key].shape) for key in sorted(space.spaces)}
    return tuple(space.shape)


def normalize_shape(shape: Any) -> Shape:
    """A shape as it comes back from a file (lists) as tuples: (..) or {key: (..)}."""
    if isinstance(shape, dict):
        return {key: tuple(int(n) for n in shape[key]) for key in sorted(shape)}
    return tuple(int(n) for n in shape)


def plain_shape(shape: Shape) -> list[int] | dict[str, list[int]]:
    """A shape as plain lists, for model and checkpoint files."""
    if isinstance(shape, dict):
        return {key: list(value) for key, value in shape.items()}
    return list(shape)


def apply(function: Callable[[Any], Any], obs: Any) -> Any:
    """``function`` on the array, or on each array of a dict observation."""
    if isinstance(obs, dict):
        return {key: function(value) for key, value in obs.items()}
    return function(obs)


def stack(items: list[Any]) -> Any:
    """One observation per environment, stacked into (n, ...) float32 arrays (per key for dict observations)."""
    if isinstance(items[0], dict):
        return {key: np.stack([item[key] for item in items]).astype(np.float32, copy=False) for key in sorted(items[0])}
    return np.stack(items).astype(np.float32, copy=False)


def concatenate(batches: list[Any]) -> Any:
    """Observations of consecutive groups of environments, (n_i, ...) each, joined along the first axis."""
    if isinstance(batches[0], dict):
        return {key: np.concatenate([batch[key] for batch in batches]) for key in batches[0]}
    return np.concatenate(batches)


def equal(a: Any, b: Any) -> bool:
    """Whether two observations (arrays, or dicts of arrays) hold the same values."""
    if isinstance(a, dict) != isinstance(b, dict):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)
    return np.array_equal(a, b)
