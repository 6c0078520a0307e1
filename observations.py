"""Observations are one array, or a dict of named arrays (a gymnasium Dict space: e.g. an image and a vector).

Everything that moves observations around (the environment groups and workers, the rollout, the buffer, the model,
evaluation) goes through these few helpers, so that both kinds take the same path. Leaves are numpy arrays or torch
tensors; a dict observation keeps its keys in sorted order everywhere.

Observations are checked where environments hand them over (``Leaf``, ``check``): an observation that does not fit
its declared space would otherwise be quantised, cut or padded silently, or fail much later as a bare shape error
inside the model. The check raises ``ObservationError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium
import numpy as np

Shape = tuple[int, ...] | dict[str, tuple[int, ...]]

FIX = "make the environment return observations of its declared observation_space, or declare the space it returns"


class ObservationError(RuntimeError):
    """An observation does not fit the declared observation space.

    The message is complete: where the observation came from (the environment and its step, added by the group that
    steps it, env_group.py), the key, the declared and the actual shape and dtype (or values), and what to fix. It
    travels from a worker process to the main process as an ObservationError, so that it can be shown as it is.
    """


class Leaf(NamedTuple):
    """What one array of an observation (the whole observation, or one key of a dict) must be.

    Attributes:
        shape: The declared shape.
        dtype: The declared dtype; any dtype of the same kind passes (``dtype_kind``).
        low: The lowest value allowed (a number, or an array that broadcasts to ``shape``), or None: not checked.
        high: The highest value allowed, as ``low``.
        declared: The declared space as error messages show it, e.g. "Discrete(3, start=1)".
        hint: What values out of bounds usually mean, added to their error message ("" for nothing).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    low: float | np.ndarray | None
    high: float | np.ndarray | None
    declared: str
    hint: str = ""


_KINDS = {"f": "float", "i": "integer", "u": "integer", "b": "bool"}


def dtype_kind(dtype: np.dtype) -> str:
    """ "float", "integer" (signed or unsigned), "bool", or the dtype's name for anything else (objects, strings)."""
    kind = _KINDS.get(dtype.kind)
    return dtype.name if kind is None else kind  # dtype.name only when needed: it costs microseconds


def box_leaf(space: gymnasium.spaces.Box) -> Leaf:
    """The Leaf of a Box: its shape and dtype; the values of an image (C, H, W) are checked against the Box's lowest and
    highest bound, since images out of range are quantised to levels silently (encoders.quantize_images), while
    vectors pass as they are (many environments exceed their declared vector bounds harmlessly)."""
    if len(space.shape) != 3:
        return Leaf(tuple(space.shape), space.dtype, None, None, str(space))
    low, high = float(space.low.min()), float(space.high.max())
    hint = "images are floats in [0, 1]: divide levels 0-255 by 255" if (low, high) == (0.0, 1.0) else ""
    return Leaf(tuple(space.shape), space.dtype, low, high, str(space), hint)


def leaves(space: gymnasium.Space) -> dict[str | None, Leaf]:
    """The Leaf of each array of a (converted) observation space: {None: leaf} for a Box, {key: leaf} for a Dict of
    Boxes.

    Raises:
        ValueError: For any other space, which no encoder takes.
    """
    if isinstance(space, gymnasium.spaces.Dict) and all(isinstance(sub, gymnasium.spaces.Box) for sub in space.values()):
        return {key: box_leaf(space[key]) for key in sorted(space.spaces)}
    if isinstance(space, gymnasium.spaces.Box):
        return {None: box_leaf(space)}
    raise ValueError(f"observation space {space} is neither a Box nor a Dict of Boxes, which the encoders take")


def check(obs: Any, expected: dict[str | None, Leaf]) -> None:
    """Checks one observation against the leaves of its declared space (``leaves``): one array, or a mapping with
    exactly the declared keys; each array's shape, dtype kind and, where its Leaf has bounds, values.

    Raises:
        ObservationError: Naming the key, the declared and the actual shape and dtype (or values), and the fix. The
            caller adds where the observation came from.
    """
    if None in expected:
        if isinstance(obs, Mapping):
            raise ObservationError(
                f"the observation is a dict with the keys {sorted(obs)}, but the declared space is "
                f"{expected[None].declared}; {FIX}"
            )
        check_array(obs, None, expected[None])
        return
    if not isinstance(obs, Mapping):
        raise ObservationError(
            f"the observation is a {type(obs).__name__}, not a dict with the declared keys {sorted(expected)}; {FIX}"
        )
    check_keys(list(obs), list(expected))
    for key, leaf in expected.items():
        check_array(obs[key], key, leaf)


def check_keys(actual: list, declared: list) -> None:
    """Refuses a dict observation whose keys are not the declared ones: a missing key would fail in the model, and an
    extra key would be dropped without notice (a part of the observation the agent never sees).

    Raises:
        ObservationError: Naming the extra and the missing keys.
    """
    extra = sorted(set(actual) - set(declared), key=str)
    missing = sorted(set(declared) - set(actual), key=str)
    if extra or missing:
        found = [f"the key(s) {extra} that the space does not declare"] if extra else []
        found += [f"not the declared key(s) {missing}"] if missing else []
        raise ObservationError(
            f"the observation has {' and '.join(found)} (declared: {sorted(declared, key=str)}); {FIX} (a Dict space "
            "with every key the observation holds, or an observation without the undeclared keys)"
        )


def check_array(value: Any, key: str | None, leaf: Leaf) -> None:
    """Checks one array of an observation against its Leaf.

    Raises:
        ObservationError: If its shape or dtype kind differs from the declared ones, or its values leave the Leaf's
            bounds (NaN included).
    """
    # Runs for every observation of every step: the messages are built only when something does not fit.
    array = np.asarray(value)
    if array.shape != leaf.shape or dtype_kind(array.dtype) != dtype_kind(leaf.dtype):
        raise ObservationError(
            f"{_name(key)} has shape {array.shape} and dtype {array.dtype}, but its space {leaf.declared} declares shape "
            f"{leaf.shape} and dtype {leaf.dtype} (any {dtype_kind(leaf.dtype)} dtype passes); {FIX}"
        )
    if leaf.low is None or array.size == 0:
        return
    if np.ndim(leaf.low) == 0 and np.ndim(leaf.high) == 0:  # one bound for all: two reductions instead of two masks
        inside = array.min() >= leaf.low and array.max() <= leaf.high
    else:
        inside = np.all((array >= leaf.low) & (array <= leaf.high))
    if not inside:
        raise ObservationError(
            f"{_name(key)} (shape {array.shape} and dtype {array.dtype}) holds values from {array.min()} to "
            f"{array.max()}, outside the bounds of its space {leaf.declared}; {leaf.hint + '; ' if leaf.hint else ''}{FIX}"
        )


def _name(key: str | None) -> str:
    """How messages name an observation's array: the whole observation, or one key of a dict."""
    return "the observation" if key is None else f"the observation's key {key!r}"


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
