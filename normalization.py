"""Observation and reward normalisation, as Stable-Baselines3's VecNormalize does it (config ``normalize_observations``,
``normalize_skip_keys``, ``normalize_one_hot``, ``normalize_rewards``, ``normalize_clip``).

- Observations: each feature of a vector observation (each vector key of a dict) is shifted and scaled by the running
  mean and standard deviation of that feature over every observation of training so far, then clipped to
  [-clip, clip]. Images are left as they are, and so are one-hot codes (the parts an environment declares as
  ``OneHot``: Discrete and MultiDiscrete observations, MiniGrid's symbolic view) and the dict keys the config names in
  ``normalize_skip_keys``. SB3 never normalises one-hot codes either: its VecNormalize refuses a Dict key that is no
  Box (it must be left out through ``norm_obs_keys``), and its policy one-hot encodes Discrete parts after it.
  Normalised, a code never seen so far has variance 0 and jumps to the clip on its first appearance; a rare one stands
  out. ``normalize_one_hot`` normalises them anyway, as VecNormalize does any Box of codes (rl-baselines3-zoo's
  MiniGrid runs normalise the integer grid codes of MiniGrid's FlatObsWrapper). The statistics
  are buffers of the model's ``normalizer``, applied before the encoder, so they are in every checkpoint and model
  file, and enjoy.py and every evaluation apply them, frozen. The reconstruction loss (ppo.py) reconstructs the
  observation as the encoder sees it, normalised.
- Rewards: each reward is divided by the running standard deviation of the discounted return (each worker's
  ``return = gamma * return + reward``, restarted where an episode ends, by termination or time limit, and where a
  resumed run restarts an episode it could not replay), then clipped. Not shifted: a shift would change which policy
  is best where episodes end. Reported episode rewards stay unscaled.

Both sets of statistics are updated once per rollout, from the whole batch of all workers and, under torchrun, of all
ranks (the sums are all-reduced), so every rank holds the same numbers. Observation statistics move after the
update's optimisation: the rollout and the epochs that train on it see the same normalisation, so training
recomputes exactly the log-probabilities and values the rollout stored. Before the first rollout of a new run, a
warm-up of ``worker_steps`` steps of uniformly random actions in every worker fills them
(``RolloutCollector.start_observation_statistics``), so the first rollout and update already see normalised inputs
instead of training on raw ones and then seeing the statistics jump.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import torch
from torch import nn

import observations
from distributed import SINGLE, Ranks, all_reduce_sum
from environments.gymnasium_env import OneHot

EPSILON = 1e-8  # added to the variance before its square root, as VecNormalize


class RunningMeanStd(nn.Module):
    """Running mean and (population) variance of a stream of batches, per feature, in float64 buffers.

    Float64, so that writing a model in half precision (checkpoint.write_half_precision, which halves float32 tensors)
    keeps the statistics exact.
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def update(self, batch: torch.Tensor, ranks: Ranks = SINGLE) -> None:
        """Take in ``batch`` (M, *shape) of this rank, with the batches of all other ranks (which must call too).

        The sums are taken around the current mean, so that one all-reduce of (count, sum, sum of squares) merges the
        ranks without the cancellation of raw sums of squares.
        """
        with torch.no_grad():  # a block, not a decorator: mutmut mutates only undecorated functions
            shifted = batch.to(torch.float64).reshape(-1, *self.mean.shape) - self.mean  # (M, *shape)
            sums = torch.cat([torch.tensor([float(len(shifted))], dtype=torch.float64, device=shifted.device),
                              shifted.sum(0).reshape(-1), shifted.square().sum(0).reshape(-1)])  # fmt: skip
            sums = all_reduce_sum(sums, ranks)
            n = sums[0]
            if n == 0:
                return
            size = self.mean.numel()
            batch_mean = sums[1 : 1 + size].view_as(self.mean) / n  # relative to the old mean
            batch_var = (sums[1 + size :].view_as(self.mean) / n - batch_mean.square()).clamp(min=0)
            total = self.count + n
            # Chan et al.'s parallel combination of two (count, mean, M2) triples, the old one's mean at 0 after the shift.
            m2 = self.var * self.count + batch_var * n + batch_mean.square() * self.count * n / total
            self.mean += batch_mean * n / total
            self.var.copy_(m2 / total)
            self.count.copy_(total)

    def std(self) -> torch.Tensor:
        """sqrt(var + EPSILON), float32."""
        return (self.var + EPSILON).sqrt().float()


class ObservationNormalizer(nn.Module):
    """Normalises vector observations (..., F) feature by feature; one per vector of ``VectorNormalizers``.

    Attributes:
        statistics: the running mean and variance (F,) of every feature.
        active: (F,) bool, which features are normalised; the others (one-hot codes, skipped keys) pass as they are.
            A buffer, so that model files and checkpoints say which, where no environment is at hand to ask.
    """

    def __init__(self, features: int, clip: float) -> None:
        super().__init__()
        self.statistics = RunningMeanStd((features,))
        self.register_buffer("active", torch.ones(features, dtype=torch.bool))
        self.clip = clip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., F) -> (..., F) float32: the active features normalised and clipped, the others as they are."""
        normalised = ((obs - self.statistics.mean.float()) / self.statistics.std()).clamp(-self.clip, self.clip)
        return torch.where(self.active, normalised, obs)

    def update(self, obs: torch.Tensor, ranks: Ranks = SINGLE) -> None:
        """Take in observations (..., F) of this rank (all ranks call together)."""
        self.statistics.update(obs.reshape(-1, obs.shape[-1]), ranks)


class VectorNormalizers(nn.Module):
    """One ``ObservationNormalizer`` per vector of an observation: the observation itself if it is a vector (F,), or
    each vector key of a dict observation; images pass through. The model applies it before its encoder.

    Attributes:
        keys: the vectors' keys, sorted (None: the observation is one vector).
        parts: their normalisers, in the order of ``keys``.
    """

    def __init__(self, shape: observations.Shape, clip: float, skip_keys: Sequence[str] = ()) -> None:
        """``skip_keys``: keys of a dict observation left as they are (``normalize_skip_keys``).

        Raises:
            ValueError: Where the observations hold no vector, where ``skip_keys`` names a key the observations do not
                have (or they are no dict), or where it leaves no vector to normalise.
        """
        super().__init__()
        shapes = shape if isinstance(shape, dict) else {None: shape}
        unknown = [key for key in skip_keys if key not in shapes]
        if unknown:
            where = f"whose keys are {sorted(shapes)}" if isinstance(shape, dict) else "which are one array, not a dict"
            raise ValueError(
                f"normalize_skip_keys names {unknown}, which the observations {shape} do not have ({where}): list "
                "only keys of the environment's Dict observation, or leave normalize_skip_keys empty"
            )
        self.keys = [key for key in sorted(shapes, key=str) if len(shapes[key]) == 1]  # None: a plain vector
        if not self.keys:
            raise ValueError(
                f"normalize_observations normalises vector observations, and the observations {shape} hold none "
                "(images are left as they are): set normalize_observations false"
            )
        if all(key in skip_keys for key in self.keys):
            raise ValueError(
                f"normalize_skip_keys {list(skip_keys)} leaves none of the observations' vectors {self.keys} to "
                "normalise: set normalize_observations false, or skip fewer keys"
            )
        self.parts = nn.ModuleList([ObservationNormalizer(shapes[key][0], clip) for key in self.keys])
        for key, part in zip(self.keys, self.parts, strict=True):
            part.active.fill_(key not in skip_keys)

    def leave_one_hot_codes(self, space: gymnasium.Space) -> None:
        """Leave the parts that the environment's (converted) observation space declares ``OneHot`` as they are."""
        for key, part in zip(self.keys, self.parts, strict=True):
            if isinstance(space if key is None else space[key], OneHot):
                part.active.fill_(False)

    def normalises_anything(self) -> bool:
        """Whether any feature is normalised (not so where every vector is one-hot codes or skipped)."""
        return any(bool(part.active.any()) for part in self.parts)

    def forward(self, obs: Any) -> Any:
        """Observations (..., *shape) (or a dict of them) with every vector normalised."""
        if not isinstance(obs, dict):
            return self.parts[0](obs)
        return {**obs, **{key: part(obs[key]) for key, part in zip(self.keys, self.parts, strict=True)}}

    def update(self, obs: Any, ranks: Ranks = SINGLE) -> None:
        """Take in a batch of observations (..., *shape) (or a dict of them) of this rank; all ranks call together."""
        for key, part in zip(self.keys, self.parts, strict=True):
            part.update(obs if key is None else obs[key], ranks)


class RewardScaler:
    """Scales a rollout's rewards by the running standard deviation of the discounted return (module docstring).

    Attributes:
        statistics: the running variance of the discounted returns (its mean is tracked but not used).
        returns: (N,) each worker's discounted return so far in its running episode, carried from rollout to rollout.
    """

    def __init__(self, n_workers: int, gamma: float, clip: float, device: torch.device) -> None:
        self.gamma = gamma
        self.clip = clip
        self.statistics = RunningMeanStd().to(device)
        self.returns = torch.zeros(n_workers, dtype=torch.float64, device=device)

    def scale(self, rewards: torch.Tensor, ended: torch.Tensor, ranks: Ranks = SINGLE) -> torch.Tensor:
        """The rewards (N, T) of a rollout, scaled and clipped, after taking the rollout's returns into the statistics;
        ``ended`` (N, T) is True where an episode ended at that step (terminated or truncated)."""
        with torch.no_grad():  # a block, not a decorator: mutmut mutates only undecorated functions
            returns = torch.empty_like(rewards, dtype=torch.float64)  # (N, T)
            for t in range(rewards.shape[1]):
                self.returns = self.returns * self.gamma + rewards[:, t]
                returns[:, t] = self.returns
                self.end_episodes(ended[:, t])
            self.statistics.update(returns.reshape(-1), ranks)
            return (rewards / self.statistics.std()).clamp(-self.clip, self.clip)

    def end_episodes(self, ended: torch.Tensor) -> None:
        """Restart the running return of the workers whose episode ended, ``ended`` (N,) bool."""
        self.returns = self.returns * ~ended

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps: the statistics (the same on every rank) and this rank's workers' returns."""
        return {**{k: v.cpu().clone() for k, v in self.statistics.state_dict().items()}, "returns": self.returns.cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.statistics.load_state_dict({key: state[key] for key in ("mean", "var", "count")})
        self.returns.copy_(state["returns"])
