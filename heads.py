"""Heads: what the memory's output h (..., D) becomes, a distribution over actions and a value.

Shapes (legend as in buffer.py): A action dimensions (1 for Discrete, len(nvec) for MultiDiscrete).

The policy head is chosen from the action space (``ActionSpec``) in ``make_policy_head``; each kind of action space
is one class with the same small interface: ``head(h)`` gives a distribution with ``sample``, ``log_prob`` and
``entropy``: categorical branches for Discrete and MultiDiscrete actions, a diagonal Gaussian for a 1-D Box.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from distributed import Rows
from environments.action_spec import ActionSpec


def noise(
    shape: torch.Size,
    generator: torch.Generator | None,
    device: torch.device,
    dtype: torch.dtype,
    rows: Rows | None = None,
    normal: bool = False,
) -> torch.Tensor:
    """Uniform (or with ``normal`` standard normal) noise of ``shape`` (N, ...).

    With ``rows`` the noise of all ``rows.total`` rows is drawn and this batch's rows are returned: processes that
    share the generator's state and each step a share of the workers then draw exactly the numbers that one process
    stepping all workers draws (distributed.py).
    """
    full = shape if rows is None else torch.Size((rows.total, *shape[1:]))
    draw = torch.randn if normal else torch.rand
    values = draw(full, generator=generator, device=device, dtype=dtype)
    return values if rows is None else values[rows.first : rows.first + shape[0]]


def orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights with ``gain``, as the reference initialises its layers (biases keep PyTorch's default)."""
    nn.init.orthogonal_(layer.weight, gain)
    return layer


class MultiCategorical:
    """Independent categorical distributions, one per action dimension; actions are (..., A) integer tensors."""

    def __init__(self, logits: list[torch.Tensor]) -> None:
        """``logits``: per action dimension a, (..., n_a)."""
        self.logits = logits
        # No argument validation: it checks every logit for NaN on each call, a cost on the rollout's hot path, and
        # non-finite values are caught where they start (NonFiniteError on the loss and the gradients).
        self.dists = [Categorical(logits=branch, validate_args=False) for branch in logits]

    def sample(
        self, deterministic: bool = False, generator: torch.Generator | None = None, rows: Rows | None = None
    ) -> torch.Tensor:
        """Actions (..., A): the most likely ones, or sampled (with ``generator``, else torch's global one).

        Sampling inverts each branch's cumulative distribution at a uniform number, drawn for all rows of ``rows`` at
        once (see ``noise``), so a worker's action does not depend on which process steps it.
        """
        if deterministic:
            return torch.stack([branch.argmax(dim=-1) for branch in self.logits], dim=-1)
        actions = []
        for branch in self.logits:
            cdf = branch.softmax(dim=-1).cumsum(dim=-1)[..., :-1]  # (..., n - 1): the last entry is 1 up to rounding
            u = noise(branch.shape[:-1], generator, branch.device, branch.dtype, rows)
            actions.append((cdf <= u.unsqueeze(-1)).sum(dim=-1))  # the action a with cdf[a - 1] <= u < cdf[a]
        return torch.stack(actions, dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Joint log-probability (...) of actions (..., A)."""
        return sum(dist.log_prob(actions[..., a]) for a, dist in enumerate(self.dists))

    def entropy(self) -> torch.Tensor:
        """Summed entropy (...) of the action dimensions."""
        return sum(dist.entropy() for dist in self.dists)


class DiagonalGaussian:
    """Independent normal distributions per action entry; actions are (..., A) float tensors, log-probabilities and
    entropies summed over the entries.

    With ``bounds`` (low, high), each (A,), the log-probability is that of the action the environment executes after
    clipping (Fujita and Maeda 2018, "Clipped Action Policy Gradient"): a sample at or beyond a bound gets the log of
    the normal's whole tail beyond it, one value for all of them, instead of its density. Then a mean that runs
    beyond a bound gains nothing (the tail's probability tends to 1 and its gradient to 0, as a saturated softmax),
    where the density of an unclipped sample keeps rewarding it. Without ``bounds``: the density of the sample.
    """

    def __init__(
        self, mean: torch.Tensor, log_std: torch.Tensor, bounds: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """``mean`` (..., A); ``log_std`` (A,), the same for every state; ``bounds`` see the class."""
        self.mean = mean
        self.log_std = log_std.expand_as(mean)
        self.bounds = bounds

    def sample(
        self, deterministic: bool = False, generator: torch.Generator | None = None, rows: Rows | None = None
    ) -> torch.Tensor:
        """Actions (..., A): the mean, or a sample (with ``generator``, else torch's global one; the noise of all rows
        of ``rows`` drawn at once, see ``noise``); not clipped."""
        if deterministic:
            return self.mean
        z = noise(self.mean.shape, generator, self.mean.device, self.mean.dtype, rows, normal=True)
        return self.mean + self.log_std.exp() * z

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Joint log-probability (...) of actions (..., A): summed densities, or with ``bounds`` see the class."""
        inv_std = torch.exp(-self.log_std)
        density = -0.5 * ((actions - self.mean) * inv_std).square() - self.log_std - 0.5 * math.log(2 * math.pi)
        if self.bounds is None:
            return density.sum(-1)
        low, high = self.bounds
        below = torch.special.log_ndtr((low - self.mean) * inv_std)  # log P(sample <= low)
        above = torch.special.log_ndtr((self.mean - high) * inv_std)  # log P(sample >= high)
        log_prob = torch.where(actions <= low, below, torch.where(actions >= high, above, density))
        return log_prob.sum(-1)

    def entropy(self) -> torch.Tensor:
        """Summed entropy (...) of the entries."""
        return (self.log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1)


class GaussianPolicy(nn.Module):
    """Linear(D, hidden) + ReLU, then the mean of each action entry (gain 0.01 and a zero bias, as CleanRL's continuous
    PPO: the first means are close to 0), with a learned log standard deviation per entry that does not depend on the
    state (starting at 0: std 1). With ``bounds`` (low, high), the log-probabilities of clipped actions (see
    ``DiagonalGaussian``)."""

    def __init__(
        self, in_dim: int, hidden: int, width: int, bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    ) -> None:
        super().__init__()
        self.hidden = orthogonal(nn.Linear(in_dim, hidden), np.sqrt(2))
        self.mean = orthogonal(nn.Linear(hidden, width), 0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.zeros(width))
        self.clipped = bounds is not None
        if self.clipped:
            # Buffers, so that they follow the model's device; not saved (they come from the action space).
            self.register_buffer("low", torch.tensor(bounds[0], dtype=torch.float32), persistent=False)
            self.register_buffer("high", torch.tensor(bounds[1], dtype=torch.float32), persistent=False)

    def forward(self, h: torch.Tensor) -> DiagonalGaussian:
        bounds = (self.low, self.high) if self.clipped else None
        return DiagonalGaussian(self.mean(torch.relu(self.hidden(h))), self.log_std, bounds)


class CategoricalPolicy(nn.Module):
    """Linear(D, hidden) + ReLU, then one linear branch of logits per action dimension (Discrete and MultiDiscrete)."""

    def __init__(self, in_dim: int, hidden: int, action_dims: list[int]) -> None:
        super().__init__()
        self.hidden = orthogonal(nn.Linear(in_dim, hidden), np.sqrt(2))
        # Gain sqrt(0.01), as the reference and CleanRL: near-uniform first policies.
        self.branches = nn.ModuleList([orthogonal(nn.Linear(hidden, n), np.sqrt(0.01)) for n in action_dims])

    def forward(self, h: torch.Tensor) -> MultiCategorical:
        """The action distribution for features ``h`` (..., D)."""
        x = torch.relu(self.hidden(h))
        return MultiCategorical([branch(x) for branch in self.branches])


class ValueHead(nn.Module):
    """Linear(D, hidden) + ReLU + Linear(hidden, 1): the state value (...) of features (..., D)."""

    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = orthogonal(nn.Linear(in_dim, hidden), np.sqrt(2))
        self.out = orthogonal(nn.Linear(hidden, 1), 1.0)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(h))).squeeze(-1)


def make_policy_head(actions: ActionSpec | list[int], in_dim: int, hidden: int, clipped_log_prob: bool = False) -> nn.Module:
    """The policy head for an action space (an ``ActionSpec``, or per-dimension action counts: Discrete [n]);
    ``clipped_log_prob``: continuous actions' log-probabilities of the clipped action (``DiagonalGaussian``)."""
    spec = ActionSpec.coerce(actions)
    if spec.continuous:
        return GaussianPolicy(in_dim, hidden, spec.width, (spec.low, spec.high) if clipped_log_prob else None)
    if not spec.counts or any(n < 1 for n in spec.counts):
        raise ValueError(f"action counts {list(spec.counts)!r}: a Discrete or MultiDiscrete space needs counts >= 1")
    return CategoricalPolicy(in_dim, hidden, list(spec.counts))
