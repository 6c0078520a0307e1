"""target_kl ends an update's epochs before the step of the first minibatch whose policy has moved too far; the
optimizer's settings on resume come from the run's config, not from the checkpoint."""

from __future__ import annotations

import pytest
import torch
from conftest import small_config, train_small
from test_equivalence import L, N, T, make_model, rollouts

from config import ConfigError
from ppo import PPOLearner

MINIBATCHES, EPOCHS = 3, 2


def optimize(target_kl: float) -> tuple[dict[str, float], int, list[torch.Tensor], list[torch.Tensor]]:
    """One update on a filled buffer; returns its statistics, the optimizer steps taken, the parameters before and
    after."""
    model = make_model("", "pre", False)
    buffer, _ = rollouts(model)
    config = small_config(
        {"memory_length": L}, n_workers=N, worker_steps=T, n_mini_batch=MINIBATCHES, epochs=EPOCHS, sequence_length=T,
        target_kl=target_kl, learning_rate_schedule={"initial": 1e-2, "final": 1e-2, "max_decay_steps": 1},
    )  # fmt: skip
    learner = PPOLearner(model, config, torch.Generator().manual_seed(0))
    steps = []
    learner.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: steps.append(1))
    before = [p.detach().clone() for p in model.parameters()]
    stats = learner.optimize(buffer, 0)
    return stats, len(steps), before, [p.detach().clone() for p in model.parameters()]


def test_without_target_kl_every_minibatch_of_every_epoch_steps() -> None:
    stats, steps, _, _ = optimize(0.0)
    assert steps == stats["gradient_steps"] == EPOCHS * MINIBATCHES
    assert stats["kl_stop"] == 0.0
    # The first minibatch sees the rollout's own policy (KL 0); the largest is above the mean once the policy moved.
    assert stats["approx_kl_max"] > stats["approx_kl"] > 0


def test_target_kl_stops_before_the_step_of_the_minibatch_that_exceeds_it() -> None:
    # The first minibatch sees the rollout's own policy (KL 0), so it always steps; with a learning rate of 1e-2 the
    # policy has moved by far more than 1e-9 at the second one.
    stats, steps, before, after = optimize(1e-9)
    assert steps == stats["gradient_steps"] == 1
    assert stats["kl_stop"] == 1.0 and stats["approx_kl"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # A target no minibatch reaches changes nothing.
    loose, loose_steps, _, _ = optimize(1e9)
    assert loose_steps == EPOCHS * MINIBATCHES and loose["kl_stop"] == 0.0


def test_target_kl_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="target_kl"):
        small_config(target_kl=-0.01)


def test_resume_takes_the_optimizer_settings_from_the_config(tmp_path: str) -> None:
    first = train_small(tmp_path, "run", 1)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    assert checkpoint["optimizer"]["param_groups"][0]["eps"] == first.config.adam_epsilon
    assert checkpoint["optimizer"]["param_groups"][0]["weight_decay"] == 0.01  # the reference's (torch's default)
    resumed = train_small(tmp_path, "run", 2, checkpoint=checkpoint, adam_epsilon=1e-3, weight_decay=0.0)
    assert resumed.learner.optimizer.param_groups[0]["eps"] == 1e-3
    assert resumed.learner.optimizer.param_groups[0]["weight_decay"] == 0.0
    assert resumed.learner.optimizer.state, "the moments must still come from the checkpoint"
