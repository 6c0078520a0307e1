"""ppo_loss against the clipped objective written out by hand, with and without advantage normalisation."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import small_config

from buffer import Minibatch
from distributed import SINGLE
from heads import MultiCategorical
from model import ActorCriticModel, PolicyOutput
from ppo import STAT_KEYS, PPOLearner, global_normalizer, ppo_loss, reconstruction_loss


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


class GivenPolicy:
    """A policy whose log-probabilities and entropies of the minibatch's actions are given, so that each step's ratio
    is set exactly (the rollout's log-probabilities are 0)."""

    def __init__(self, log_probs: torch.Tensor, entropies: torch.Tensor) -> None:
        self.log_probs, self.entropies = log_probs, entropies

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.log_probs

    def entropy(self) -> torch.Tensor:
        return self.entropies


def given_steps(
    ratios: list,
    advantages: list,
    values: list | None = None,
    old_values: list | None = None,
    returns: list | None = None,
    entropies: list | None = None,
    valid: list | None = None,
) -> tuple[PolicyOutput, Minibatch, torch.Tensor, torch.Tensor]:
    """The model output and minibatch of one chunk of steps (or, with ``valid``, of rows of single steps) with these
    ratios, advantages, values (new and the rollout's; default 0), returns (default: the values) and entropies
    (default 0); also the log-probabilities and values, which take gradients."""
    shape = (1, len(ratios)) if valid is None else (len(ratios), len(ratios[0]))

    def tensor(numbers: list | None, default: float = 0.0) -> torch.Tensor:
        return torch.full(shape, default) if numbers is None else torch.tensor(numbers, dtype=torch.float32).view(shape)

    log_probs = tensor(ratios).log().requires_grad_()
    new_values = tensor(values).requires_grad_()
    old = tensor(old_values)
    returns = tensor(returns) if returns is not None else new_values.detach().clone()
    out = PolicyOutput(GivenPolicy(log_probs, tensor(entropies)), new_values, record=None, attention=None)
    mask = None if valid is None else torch.tensor(valid)
    minibatch = Minibatch(torch.zeros(*shape, 1), torch.zeros(*shape, 1), torch.zeros(shape), old, tensor(advantages), returns,
                          memory=None, valid=mask)  # fmt: skip
    return out, minibatch, log_probs, new_values


def test_the_clipped_surrogate_takes_the_pessimistic_bound_and_no_gradient_where_clipped() -> None:
    # clip 0.2: a positive advantage counts the ratio up to 1.2, a negative one down to 0.8 (PPO's min of the two
    # surrogates); past that bound the objective is flat, so the step gets no gradient.
    ratios = [0.5, 1.0, 1.5, 0.5, 1.0, 1.5]
    advantages = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    out, minibatch, log_probs, _ = given_steps(ratios, advantages)
    loss, stats = ppo_loss(out, minibatch, clip_range=0.2, beta=0.0, value_coefficient=1.0, normalize_advantages=False)
    surrogate = [0.5, 1.0, 1.2, -0.8, -1.0, -1.5]
    assert stats["policy_loss"].item() == pytest.approx(-sum(surrogate) / 6)
    loss.backward()
    # d(-r A / 6) / d log r = -r A / 6 where the ratio counts; 0 where the bound holds it
    expected = torch.tensor([[-0.5, -1.0, 0.0, 0.0, 1.0, 1.5]]) / 6
    torch.testing.assert_close(log_probs.grad, expected)


def test_the_value_loss_is_the_larger_of_the_clipped_and_the_unclipped_squared_error() -> None:
    # The rollout's values are 0 and clip 0.2: a value of 1 counts as 0.2 and -1 as -0.2 where that is the worse
    # error; 0.1 is inside the range.
    out, minibatch, _, values = given_steps([1.0] * 3, [0.0] * 3, values=[1.0, -1.0, 0.1], returns=[1.0, -1.0, 0.5])
    loss, stats = ppo_loss(out, minibatch, clip_range=0.2, beta=0.0, value_coefficient=1.0, normalize_advantages=False)
    squared = [(0.2 - 1.0) ** 2, (-0.2 + 1.0) ** 2, (0.1 - 0.5) ** 2]  # the clipped error twice, then the plain one
    assert stats["value_loss"].item() == pytest.approx(sum(squared) / 3)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.0, 2 * (0.1 - 0.5) / 3]]))  # clipped: no gradient


def test_the_loss_adds_the_weighted_value_loss_and_subtracts_the_entropy_bonus_and_logs_each_part() -> None:
    ratios = [0.5, 1.1, 1.5]
    out, minibatch, _, _ = given_steps(ratios, [1.0, -2.0, 0.5], values=[0.3, 0.0, 1.0], returns=[1.0, 1.0, 1.0],
                                       entropies=[0.3, 0.7, 1.1])  # fmt: skip
    loss, stats = ppo_loss(out, minibatch, clip_range=0.2, beta=0.01, value_coefficient=0.5, normalize_advantages=False)
    assert set(stats) == set(STAT_KEYS)  # the names PPOLearner logs
    assert stats["entropy"].item() == pytest.approx(0.7)
    expected = stats["policy_loss"] + 0.5 * stats["value_loss"] - 0.01 * 0.7
    assert loss.item() == pytest.approx(expected.item()) and stats["total_loss"].item() == pytest.approx(loss.item())
    # the approximate KL divergence of the rollout's policy from the new one, (r - 1) - log r, and the share of
    # ratios further than the clip range from 1
    assert stats["approx_kl"].item() == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 3)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)


def test_a_minibatch_of_single_steps_is_the_loss_of_its_real_steps_alone() -> None:
    # Rows of single steps padded to Q = 3: the padding (loud numbers) counts neither in the loss and its statistics
    # nor in the advantage normalisation, and gets no gradient.
    valid = [[True, True, False], [True, False, False]]
    padded = given_steps([[0.9, 1.2, 9.0], [1.1, 9.0, 9.0]], [[1.0, -2.0, 99.0], [0.5, 99.0, 99.0]],
                         values=[[0.5, 0.0, 50.0], [1.0, 50.0, 50.0]], entropies=[[0.1, 0.2, 9.0], [0.3, 9.0, 9.0]],
                         returns=[[1.0, 1.0, -50.0], [0.0, -50.0, -50.0]], valid=valid)  # fmt: skip
    real = given_steps([0.9, 1.2, 1.1], [1.0, -2.0, 0.5], values=[0.5, 0.0, 1.0], entropies=[0.1, 0.2, 0.3],
                       returns=[1.0, 1.0, 0.0])  # fmt: skip
    results = []
    for out, minibatch, _, _ in (padded, real):
        loss, stats = ppo_loss(out, minibatch, clip_range=0.2, beta=0.01, value_coefficient=0.5)
        loss.backward()
        results.append((loss, stats))
    torch.testing.assert_close(results[0][0], results[1][0])
    for key in STAT_KEYS:
        torch.testing.assert_close(results[0][1][key], results[1][1][key])
    assert padded[2].grad[~torch.tensor(valid)].eq(0).all() and padded[3].grad[~torch.tensor(valid)].eq(0).all()


def test_advantages_are_normalised_by_default_and_with_the_normalizer_given() -> None:
    out, minibatch, _, _ = given_steps([0.9, 1.2, 1.0, 0.7], [1.0, -2.0, 0.5, 3.0])
    arguments = dict(clip_range=0.2, beta=0.0, value_coefficient=1.0)
    _, default = ppo_loss(out, minibatch, **arguments)
    _, normalised = ppo_loss(out, minibatch, **arguments, normalize_advantages=True)
    # several processes scale with global_normalizer, the mean and std over all ranks' parts (here one)
    _, over_ranks = ppo_loss(out, minibatch, **arguments, normalize=global_normalizer(SINGLE))
    _, raw = ppo_loss(out, minibatch, **arguments, normalize_advantages=False)
    assert default["policy_loss"].item() == normalised["policy_loss"].item()
    assert over_ranks["policy_loss"].item() == pytest.approx(normalised["policy_loss"].item(), rel=1e-6)
    assert abs(raw["policy_loss"].item() - normalised["policy_loss"].item()) > 0.1  # normalising changes the loss


def test_advantages_that_hardly_differ_keep_their_signs_when_normalised() -> None:
    # Their std (1e-10) is far below the 1e-8 added to it, which keeps the scale finite: the normalised advantages are
    # small but keep their signs, so the gradient still raises the probability of the better actions.
    advantages = [1e-10, -1e-10, 2e-10, -2e-10]
    out, minibatch, log_probs, _ = given_steps([1.0] * 4, advantages)
    loss, _ = ppo_loss(out, minibatch, clip_range=0.2, beta=0.0, value_coefficient=1.0)
    loss.backward()
    assert torch.equal(log_probs.grad.sign(), -torch.tensor([advantages]).sign())
    assert log_probs.grad.abs().max() < 0.1


def test_the_reconstruction_loss_of_single_steps_leaves_the_padding_out() -> None:
    config = small_config(reconstruction_coefficient=0.1)
    torch.manual_seed(0)
    model = ActorCriticModel(config, (4,), [3])
    valid = torch.tensor([[True, True, False], [True, False, False]])
    features = torch.randn(2, 3, model.decoder.linear.in_features)
    obs = torch.randn(2, 3, 4)
    features[~valid], obs[~valid] = 1e3, -1e3  # the padding
    out = PolicyOutput(None, None, record=None, attention=None, features=features)
    minibatch = Minibatch(obs, None, None, None, None, None, memory=None, valid=valid)
    expected = model.decoder.loss(model.decoder(features[valid]), obs[valid])
    torch.testing.assert_close(reconstruction_loss(model, out, minibatch), expected)
