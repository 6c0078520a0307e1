"""What the models, the buffer and the environment workers need to know of an action space, without torch.

Discrete and MultiDiscrete actions are integer vectors (A,) with one count per entry; a 1-D Box with finite bounds
gives continuous actions, float vectors (A,) that the environment workers clip to the bounds (the policy's log-
probabilities stay those of the unclipped sample, which is what the buffer stores).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium
import numpy as np


@dataclass(frozen=True)
class ActionSpec:
    """An action space as the models and the buffer see it.

    Discrete(n) is ``counts`` (n,), MultiDiscrete ``counts`` nvec; a 1-D Box with finite bounds is ``low`` and
    ``high`` (A,) (continuous actions, stored as float32; the environments clip them to the bounds).
    """

    counts: tuple[int, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    @property
    def continuous(self) -> bool:
        return bool(self.low)

    @property
    def width(self) -> int:
        """A: the entries of one action."""
        return len(self.low) if self.continuous else len(self.counts)

    @classmethod
    def of(cls, space: gymnasium.Space) -> ActionSpec:
        """The spec of a Discrete, 1-D MultiDiscrete or 1-D finite Box space; ValueError naming the fix otherwise."""
        if isinstance(space, gymnasium.spaces.Discrete):
            return cls(counts=(int(space.n),))
        if isinstance(space, gymnasium.spaces.MultiDiscrete) and space.nvec.ndim == 1:
            return cls(counts=tuple(int(n) for n in space.nvec))
        if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1 and space.shape[0] >= 1:
            if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
                raise ValueError(
                    f"the action space {space} has infinite bounds, which a Gaussian policy cannot be clipped to: give "
                    "the Box finite low and high (e.g. -1 and 1) and scale the actions inside the environment"
                )
            return cls(low=tuple(float(x) for x in space.low), high=tuple(float(x) for x in space.high))
        raise ValueError(
            f"the action space {space} is not supported: use Discrete, a 1-D MultiDiscrete or a 1-D Box with finite bounds"
        )

    @classmethod
    def coerce(cls, value: ActionSpec | list[int] | tuple[int, ...] | dict) -> ActionSpec:
        """A spec from a spec, a list of counts (Discrete/MultiDiscrete) or ``to_dict``'s dict."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(tuple(value.get("counts", ())), tuple(value.get("low", ())), tuple(value.get("high", ())))
        return cls(counts=tuple(int(n) for n in value))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, A) actions drawn uniformly: each entry's codes (int64), or within the Box's bounds (float64)."""
        if self.continuous:
            return rng.uniform(self.low, self.high, size=(n, self.width))
        return rng.integers(0, self.counts, size=(n, self.width))

    def __str__(self) -> str:
        """The counts (e.g. [3]) or the Box's bounds, for messages."""
        if self.continuous:
            return f"continuous in [{list(self.low)}, {list(self.high)}]"
        return str(list(self.counts))

    def to_dict(self) -> dict:
        """Plain lists, for checkpoints and model files."""
        return {"counts": list(self.counts), "low": list(self.low), "high": list(self.high)}
