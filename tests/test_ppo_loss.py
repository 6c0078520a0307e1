"""ppo_loss against the clipped objective written out by hand, with and without advantage normalisation."""

from __future__ import annotations

import torch
from conftest import small_config

from buffer import Minibatch
from heads import MultiCategorical
from model import ActorCriticModel, PolicyOutput
from ppo import PPOLearner, ppo_loss


def loss_parts(advantages: torch.Tensor, normalize: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Policy loss of a minibatch of 2 chunks x 3 steps with 2 actions, and the ratios and advantages it used."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 2, generator=generator)
    actions = torch.randint(0, 2, (2, 3, 1), generator=generator)
    policy = MultiCategorical([logits])
    old_log_probs = policy.log_prob(actions) + 0.3 * torch.randn(2, 3, generator=generator)  # ratios of 0.5 to 2
    values = torch.randn(2, 3, generator=generator)
    minibatch = Minibatch(torch.zeros(2, 3, 1), actions, old_log_probs, values, advantages, values, memory=None)
    out = PolicyOutput(policy, values, record=None, attention=None)
    _, stats = ppo_loss(out, minibatch, clip_range=0.2, beta=0.0, value_coefficient=1.0, normalize_advantages=normalize)
    ratio = (policy.log_prob(actions) - old_log_probs).exp()
    return float(stats["policy_loss"]), ratio, stats


def by_hand(ratio: torch.Tensor, advantages: torch.Tensor) -> float:
    return float(-torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean())


def test_raw_advantages_are_used_as_they_are() -> None:
    advantages = torch.tensor([[0.5, -2.0, 0.1], [1.5, 0.0, -0.3]])
    loss, ratio, stats = loss_parts(advantages, normalize=False)
    assert abs(loss - by_hand(ratio, advantages)) < 1e-6
    assert float(stats["value_loss"]) == 0.0  # values == returns here: only the policy part is under test
    scaled, _, _ = loss_parts(100 * advantages, normalize=False)
    assert abs(scaled - 100 * loss) < 1e-4  # the loss scales with the advantages


def test_normalised_advantages_have_mean_0_and_std_1() -> None:
    advantages = torch.tensor([[0.5, -2.0, 0.1], [1.5, 0.0, -0.3]])
    loss, ratio, _ = loss_parts(advantages, normalize=True)
    normalised = (advantages - advantages.mean()) / advantages.std()
    assert abs(loss - by_hand(ratio, normalised)) < 1e-5
    tiny, _, _ = loss_parts(1e-3 * advantages + 0.01, normalize=True)
    assert abs(tiny - loss) < 1e-4  # any scale and offset give the same loss: tiny advantages weigh as much as big ones


def test_optimizer_takes_the_configs_epsilon() -> None:
    for epsilon in (1e-8, 1e-5):
        config = small_config(adam_epsilon=epsilon)
        learner = PPOLearner(ActorCriticModel(config, (3,), [2]), config, torch.Generator())
        assert learner.optimizer.param_groups[0]["eps"] == epsilon
