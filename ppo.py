"""The PPO update: the clipped loss as a function of model outputs and a minibatch, gradient clipping, and the epochs.

Shapes follow the legend in buffer.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

import observations
from buffer import Buffer, Minibatch
from config import Config
from distributed import SINGLE, Ranks, all_reduce_sum
from model import ActorCriticModel, PolicyOutput


class NonFiniteError(RuntimeError):
    """A loss or gradient became NaN or infinite."""


def ppo_loss(
    out: PolicyOutput,
    minibatch: Minibatch,
    clip_range: float,
    beta: float,
    value_coefficient: float,
    normalize_advantages: bool = True,
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped PPO objective of one minibatch, as the reference computes it.

    Advantages are normalised over the minibatch (unless ``normalize_advantages`` is false); the value loss is
    clipped around the rollout's values with the same range as the policy ratio; the entropy bonus is weighted by
    ``beta``. In a minibatch of single steps only the valid entries (``minibatch.valid``) count, in the means and in
    the normalisation: the loss is the one of the M sampled steps alone, and padding gets no gradient.

    Args:
        out: the model's output for the minibatch's (B, C) steps (single steps: (B, Q)).
        minibatch: what the rollout stored for them.
        clip_range: PPO's epsilon.
        beta: entropy coefficient.
        value_coefficient: weight of the value loss.
        normalize_advantages: scale the advantages to mean 0 and std 1 over the minibatch, as the reference does.
        normalize: how to scale them where the minibatch is spread over several processes (``global_normalizer``);
            None: with this minibatch's mean and std.

    Returns:
        The loss, and its parts and diagnostics (scalars, no gradient needed).
    """
    per_step = [out.policy.log_prob(minibatch.actions), out.policy.entropy(), out.value]  # each (B, C)
    per_step += [minibatch.log_probs, minibatch.values, minibatch.advantages, minibatch.returns]
    if minibatch.valid is not None:
        # Keep the M real steps, each (M,), and drop the padding: what follows is then the loss of those steps alone.
        # Chunks skip this, so that their numbers stay exactly what they were.
        per_step = [x[minibatch.valid] for x in per_step]
    log_probs, entropies, values, old_log_probs, old_values, advantages, returns = per_step
    if normalize_advantages:
        if normalize is None:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        else:
            advantages = normalize(advantages)
    log_ratio = log_probs - old_log_probs
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip_range, 1 + clip_range) * advantages)
    policy_loss = -surrogate.mean()
    clipped_value = old_values + (values - old_values).clamp(-clip_range, clip_range)
    value_loss = torch.max((values - returns) ** 2, (clipped_value - returns) ** 2).mean()
    entropy = entropies.mean()
    loss = policy_loss + value_coefficient * value_loss - beta * entropy
    with torch.no_grad():
        stats = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "total_loss": loss,
            "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clip_fraction": ((ratio - 1).abs() > clip_range).float().mean(),
        }
    return loss, stats


def global_normalizer(ranks: Ranks) -> Callable[[torch.Tensor], torch.Tensor]:
    """Advantage normalisation over a minibatch spread over several processes: every rank's part is scaled with the
    whole minibatch's mean and (unbiased) standard deviation, from one all-reduce of sums. A rank that holds none of
    the minibatch calls it with an empty tensor, to take part in the all-reduce."""

    buffers: dict[torch.device, torch.Tensor] = {}  # one per device, reused: see PPOLearner.sum_over_ranks

    def normalize(advantages: torch.Tensor) -> torch.Tensor:
        sums = buffers.setdefault(advantages.device, torch.empty(3, dtype=torch.float64, device=advantages.device))
        sums[0], sums[1], sums[2] = advantages.sum(), advantages.square().sum(), float(advantages.numel())
        total, squares, count = all_reduce_sum(sums, ranks).tolist()
        mean = total / count
        std = max((squares - count * mean * mean) / (count - 1), 0.0) ** 0.5
        return (advantages - mean) / (std + 1e-8)

    return normalize


def reconstruction_loss(model: ActorCriticModel, out: PolicyOutput, minibatch: Minibatch) -> torch.Tensor:
    """The observation-reconstruction loss of a minibatch's real steps: the model's decoder reconstructs each step's
    observation from the memory's output (images: binary cross-entropy per pixel; vectors: mean squared error; dicts:
    the sum over the keys). The target is the observation as the encoder saw it (``model.normalized``): with
    ``normalize_observations``, every normalised feature weighs about alike in the squared error, where the raw one
    would weigh each by its variance, in the environment's units."""
    features, obs = out.features, minibatch.obs
    if minibatch.valid is not None:
        valid = minibatch.valid
        features, obs = features[valid], observations.apply(lambda x: x[valid], obs)
    return model.decoder.loss(model.decoder(features), model.normalized(obs))


def forward_minibatch(model: ActorCriticModel, minibatch: Minibatch) -> PolicyOutput:
    """The model's output for a minibatch's (B, C) steps: chunks through ``forward``, single steps through
    ``forward_steps``."""
    if minibatch.single_steps:
        return model.forward_steps(minibatch.obs, minibatch.memory, minibatch.valid)
    return model(minibatch.obs, minibatch.memory)


def clip_gradients(model: nn.Module, max_norm: float) -> tuple[dict[str, float], float]:
    """Clip the gradients to a total norm of ``max_norm``, as torch.nn.utils.clip_grad_norm_ does.

    Returns each top-level module's gradient norm before clipping (for the summaries) and the total norm; every
    tensor's norm is computed once for both.
    """
    names, counts, grads = [], [], []
    groups = [(name, module.parameters()) for name, module in model.named_children()]
    groups.append(("model", model.parameters(recurse=False)))  # parameters outside the modules, if any
    for name, parameters in groups:
        module_grads = [p.grad for p in parameters if p.grad is not None]
        if module_grads:
            names.append(name)
            counts.append(len(module_grads))
            grads += module_grads
    # Every tensor's norm in one fused call (as clip_grad_norm_ computes them), not one call per tensor.
    tensor_norms = torch.stack(torch._foreach_norm(grads))
    module_norms = dict(zip(names, [part.norm() for part in tensor_norms.split(counts)], strict=True))
    total_norm = torch.stack(list(module_norms.values())).norm()
    scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    *norms, total = torch.stack([*module_norms.values(), total_norm]).tolist()  # one host copy for all of them
    return {f"grad_norm/{name}": norm for name, norm in zip(module_norms, norms, strict=True)}, total


def update_clipping_scales(optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, float]]:
    """StableAdamW's update clipping (Wortsman et al., 2023), before an AdamW step: each parameter whose gradient is
    large against AdamW's second-moment estimate, with the scale 1 / RMS(g^2 / v_hat) < 1 its step is to be multiplied
    by. v_hat is the bias-corrected estimate AdamW's step will use (this gradient included), floored at epsilon^2. A
    gradient as large as the recent ones gives RMS ~1 (no change); one 100 times larger, as a rare failure brings to a
    solved policy, gives RMS ~30. The first step has no estimate yet (v_hat = g^2): nothing is scaled."""
    scaled, ratios = [], []
    for group in optimizer.param_groups:
        beta2, floor = group["betas"][1], group["eps"] ** 2
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if parameter.grad is None or not state:
                continue
            correction = 1 - beta2 ** (state["step"] + 1)  # a tensor op: no host copy per parameter on a GPU
            squared = parameter.grad.square()
            v_hat = (state["exp_avg_sq"] * beta2 + (1 - beta2) * squared) / correction
            ratios.append((squared / v_hat.clamp(min=floor)).mean())
            scaled.append(parameter)
    if not ratios:
        return []
    rms = torch.stack(ratios).sqrt().tolist()  # one host copy
    return [(parameter, 1 / value) for parameter, value in zip(scaled, rms, strict=True) if value > 1]


def clipped_step(optimizer: torch.optim.Optimizer) -> float:
    """An AdamW step with update clipping (see update_clipping_scales): the step of each parameter to scale is
    taken whole, then shortened to its scale (AdamW's step is linear in the learning rate, weight decay included,
    so this is the step with that parameter's learning rate scaled). Returns the smallest scale (1: none)."""
    scales = update_clipping_scales(optimizer)
    before = [parameter.detach().clone() for parameter, _ in scales]
    optimizer.step()
    with torch.no_grad():
        for (parameter, scale), old in zip(scales, before, strict=True):
            parameter.lerp_(old, 1 - scale)  # old + scale * (new - old)
    return min((scale for _, scale in scales), default=1.0)


class StepSnapshot:
    """The weights and AdamW's moments before the last optimizer step, so that the step can be undone (kl_rollback).

    The copies are made into buffers allocated once (again only when the optimizer's state gains tensors, at the
    first step), so taking a snapshot costs a copy of the parameters and moments, no allocation.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self.saved_parameters = [torch.empty_like(p) for p in self.parameters]
        self.keys: list[tuple[int, str]] = []  # (parameter index, state key) of every saved state tensor
        self.saved_state: list[torch.Tensor] = []

    def _state(self) -> tuple[list[tuple[int, str]], list[torch.Tensor]]:
        pairs = [
            ((i, key), value)
            for i, p in enumerate(self.parameters)
            for key, value in self.optimizer.state.get(p, {}).items()
            if isinstance(value, torch.Tensor)
        ]
        return [key for key, _ in pairs], [value for _, value in pairs]

    def take(self) -> None:
        """Save the weights and the optimizer's moments as they are now."""
        keys, state = self._state()
        with torch.no_grad():
            torch._foreach_copy_(self.saved_parameters, [p.detach() for p in self.parameters])
            if keys != self.keys:
                self.keys, self.saved_state = keys, [value.detach().clone() for value in state]
            elif state:
                torch._foreach_copy_(self.saved_state, state)

    def restore(self) -> None:
        """Put back the weights and moments of the last take(); a parameter without state then has none again."""
        keys, state = self._state()
        with torch.no_grad():
            torch._foreach_copy_(self.parameters, self.saved_parameters)
            saved = dict(zip(self.keys, self.saved_state, strict=True))
            for (i, key), value in zip(keys, state, strict=True):
                if (i, key) in saved:
                    value.copy_(saved[(i, key)])
            for i in {i for i, _ in keys} - {i for i, _ in self.keys}:
                self.optimizer.state.pop(self.parameters[i], None)


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "total_loss", "approx_kl", "clip_fraction")


def warmup_factor(warmup: int, update: int) -> float:
    """The share of the scheduled learning rate that update ``update`` (0-based) trains at with ``learning_rate_warmup``
    = ``warmup``: 0.1 at the first update, rising linearly to 1 at update ``warmup`` and after it; 1 without a warm-up."""
    return 1.0 if warmup <= 0 else 0.1 + 0.9 * min(update, warmup) / warmup


def transformer_rate_settings(config: Config) -> tuple[float, int]:
    """The transformer's own rate settings, ``transformer.max_learning_rate`` (0: no bound) and
    ``transformer.warmup_updates`` (0: none); a GRU, an LSTM and no memory have neither."""
    if config.memory != "trxl":
        return 0.0, 0
    return config.transformer.max_learning_rate, config.transformer.warmup_updates


def parameter_groups(model: nn.Module, config: Config) -> list[dict]:
    """The optimizer's parameter groups: one group of every parameter where the memory's rate is the rate
    (``memory_learning_rate_scale`` 1 and no ``transformer.max_learning_rate``: the reference's), else the memory's
    parameters in a group of their own (``"memory": True``; ``PPOLearner.optimize`` sets each group's rate with
    ``group_rates``)."""
    memory = list(model.memory.parameters())
    bound, _ = transformer_rate_settings(config)
    if (config.memory_learning_rate_scale == 1.0 and bound <= 0) or not memory:  # memory: none has no parameters
        return [{"params": list(model.parameters()), "memory": False}]
    ids = {id(p) for p in memory}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": rest, "memory": False}, {"params": memory, "memory": True}]


def group_rates(config: Config, update: int) -> tuple[float, float]:
    """The learning rates of update ``update`` (0-based), every parameter's but the memory's and the memory's: the
    schedule's, the memory's times ``memory_learning_rate_scale`` and at most ``transformer.max_learning_rate``, both
    warmed up by ``learning_rate_warmup`` and the transformer's ``warmup_updates``."""
    scheduled = config.learning_rate_schedule.value(update)
    bound, transformer_warmup = transformer_rate_settings(config)
    warmup = warmup_factor(config.learning_rate_warmup, update) * warmup_factor(transformer_warmup, update)
    memory = scheduled * config.memory_learning_rate_scale
    memory = memory if bound <= 0 else min(memory, bound)
    return scheduled * warmup, memory * warmup


class PPOLearner:
    """Runs the PPO epochs over a filled buffer with the config's schedules.

    With several processes (``ranks``, distributed.py) each process trains on its part of every minibatch, weighted by
    its share of the minibatch's steps, and the gradients are summed over the processes before clipping.
    """

    def __init__(self, model: nn.Module, config: Config, generator: torch.Generator, ranks: Ranks = SINGLE) -> None:
        """``generator`` shuffles the minibatches (its state is part of a checkpoint; the same on every rank)."""
        self.model = model
        self.config = config
        self.generator = generator
        self.ranks = ranks
        self.rows = ranks.rows(config.n_workers)
        self.normalize = global_normalizer(ranks) if ranks.distributed else None
        self._reduce_buffer: torch.Tensor | None = None  # see sum_over_ranks
        self.stat_keys = STAT_KEYS + (("reconstruction_loss",) if config.reconstruction_coefficient > 0 else ())
        # The fused implementation is several times faster than the per-tensor loop, on the CPU too.
        self.optimizer = torch.optim.AdamW(
            parameter_groups(model, config),
            lr=config.learning_rate_schedule.initial,
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
            fused=True,
        )
        # With kl_rollback (which the config allows only with target_kl), the state before each step, to undo the last
        # one when the next minibatch passes target_kl.
        self.snapshot = StepSnapshot(self.optimizer) if config.kl_rollback else None

    def optimize(self, buffer: Buffer, update: int) -> dict[str, float]:
        """Run the epochs of update ``update`` (0-based, for the schedules); returns mean training statistics."""
        self.model.train()
        config = self.config
        rates = group_rates(config, update)
        beta = config.beta_schedule.value(update)
        clip_range = config.clip_range_schedule.value(update)
        epsilon = config.adam_epsilon_schedule.value(update)
        for group in self.optimizer.param_groups:
            group["lr"], group["eps"] = rates[group["memory"]], epsilon  # every group says (parameter_groups)
        stats: dict[str, list[float]] = defaultdict(list)
        minibatches = (  # each epoch cuts its minibatches when the one before is done
            minibatch
            for _ in range(config.epochs)
            for minibatch in buffer.minibatches(
                config.n_mini_batch, config.sequence_length, self.generator, config.minibatch_sampling, self.rows
            )
        )
        steps, stopped, rolled_back = 0, False, False
        for minibatch in minibatches:
            minibatch_stats, stopped = self.train_minibatch(minibatch, clip_range, beta, update)
            for key, value in minibatch_stats.items():
                stats[key].append(value)
            if stopped:
                if self.snapshot is not None and steps > 0:
                    self.snapshot.restore()  # the step that carried the policy past target_kl is not kept
                    steps, rolled_back = steps - 1, True
                break
            steps += 1
        values, returns = buffer.values.flatten(), buffer.returns.flatten()
        variance = returns.var()
        explained = (1 - (returns - values).var() / variance).item() if variance > 0 else float("nan")
        result = {key: float(np.mean(value)) for key, value in stats.items()}
        if "update_scale_min" in stats:  # the update's smallest step scale of update clipping, not a mean
            result["update_scale_min"] = float(np.min(stats["update_scale_min"]))
        # The largest KL of a minibatch, against which a target_kl is set (the mean hides the minibatches that pass it).
        result["approx_kl_max"] = float(np.max(stats["approx_kl"]))
        advantages = buffer.advantages
        value_mean, return_mean, advantage_mean, advantage_std = torch.stack(
            [values.mean(), returns.mean(), advantages.mean(), advantages.std()]
        ).tolist()  # one host copy
        result.update(
            value_mean=value_mean, return_mean=return_mean, advantage_mean=advantage_mean, advantage_std=advantage_std,
            explained_variance=explained, learning_rate=rates[0], memory_learning_rate=rates[1],
            entropy_coefficient=beta, clip_range=clip_range, adam_epsilon=epsilon, gradient_steps=steps,
            kl_stop=float(stopped), kl_rollback=float(rolled_back),
        )  # fmt: skip
        return result

    def train_minibatch(
        self, minibatch: Minibatch | None, clip_range: float, beta: float, update: int
    ) -> tuple[dict[str, float], bool]:
        """One gradient step on one minibatch (None: this process holds none of its steps); returns its losses and
        diagnostics, and whether the update stops here: with ``target_kl`` set, a minibatch whose approximate KL
        divergence from the rollout's policy exceeds it takes no step (every rank sees the same summed KL; with
        ``kl_rollback`` optimize() then undoes the step before it)."""
        self.optimizer.zero_grad(set_to_none=True)
        if minibatch is None:
            device = next(self.model.parameters()).device  # NCCL reduces only tensors on the GPU
            stats = {key: torch.zeros((), device=device) for key in self.stat_keys}
            if self.config.normalize_advantages:
                self.normalize(torch.zeros(0, device=device))  # take part in the minibatch's all-reduce
        else:
            stats = self.backward(minibatch, clip_range, beta)
        if self.ranks.distributed:
            stats = self.sum_over_ranks(stats)
        # One host copy of all the statistics, not one synchronisation per statistic.
        stats = dict(zip(stats, torch.stack([value.float() for value in stats.values()]).tolist(), strict=True))
        if not math.isfinite(stats["total_loss"]):  # summed over the ranks: every rank stops here together
            raise NonFiniteError(f"the loss became {stats['total_loss']} in update {update + 1}")
        if 0 < self.config.target_kl < stats["approx_kl"]:
            return stats, True
        grad_norms, total_norm = clip_gradients(self.model, self.config.max_grad_norm)
        if not math.isfinite(total_norm):
            raise NonFiniteError(f"the gradient norm became {total_norm} in update {update + 1}")
        if self.snapshot is not None:
            self.snapshot.take()
        if self.config.adam_update_clipping:
            stats["update_scale_min"] = clipped_step(self.optimizer)
        else:
            self.optimizer.step()
        return {**stats, **grad_norms}, False

    def backward(self, minibatch: Minibatch, clip_range: float, beta: float) -> dict[str, torch.Tensor]:
        """The loss of a minibatch, weighted by its share, and its gradients; returns the weighted losses."""
        out = forward_minibatch(self.model, minibatch)
        loss, stats = ppo_loss(
            out, minibatch, clip_range, beta, self.config.value_loss_coefficient, self.config.normalize_advantages,
            self.normalize,
        )  # fmt: skip
        if self.config.reconstruction_coefficient > 0:
            reconstruction = reconstruction_loss(self.model, out, minibatch)
            loss = loss + self.config.reconstruction_coefficient * reconstruction
            stats["reconstruction_loss"] = reconstruction.detach()
            stats["total_loss"] = loss.detach()
        if minibatch.share != 1.0:
            # This rank's mean weighted by its share of the steps: the weighted means of all ranks add up to the mean
            # over the whole minibatch.
            loss = loss * minibatch.share
            stats = {key: value * minibatch.share for key, value in stats.items()}
        loss.backward()
        return stats

    def sum_over_ranks(self, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sums the gradients and the weighted statistics over the ranks, in one flattened all-reduce.

        A parameter keeps no gradient (None, so AdamW leaves it alone, as one process would) only where no rank gave
        it one.
        """
        parameters = list(self.model.parameters())
        flat = [p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1) for p in parameters]
        has_grad = torch.tensor([float(p.grad is not None) for p in parameters], device=flat[0].device)
        values = torch.stack([stats[key].float() for key in self.stat_keys]).to(flat[0].device)
        size = sum(x.numel() for x in flat) + len(parameters) + len(values)
        if self._reduce_buffer is None or self._reduce_buffer.numel() != size:
            # One buffer for every all-reduce: gloo keeps state per tensor address, so a new tensor per minibatch made
            # each process grow by the gradients' size with every minibatch (1.1 GB per MiniGrid update).
            self._reduce_buffer = torch.empty(size, dtype=flat[0].dtype, device=flat[0].device)
        with torch.no_grad():
            torch.cat([*flat, has_grad, values], out=self._reduce_buffer)
        summed = all_reduce_sum(self._reduce_buffer, self.ranks)
        offset = 0
        for p in parameters:
            p.grad = summed[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        has_grad, values = summed[offset : offset + len(parameters)], summed[offset + len(parameters) :]
        for p, given in zip(parameters, has_grad.tolist(), strict=True):
            if not given:
                p.grad = None
        return dict(zip(self.stat_keys, values, strict=True))
