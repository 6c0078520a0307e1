"""adam_update_clipping: StableAdamW's update clipping against AdamW steps worked out by hand: nothing changes while
the gradients are as large as the recent ones; a gradient far above them has its step divided by RMS(g^2 / v_hat)."""

from __future__ import annotations

import torch
from conftest import small_config
from test_equivalence import L, N, T, make_model, rollouts

from ppo import PPOLearner, clipped_step

BETA2, LR, STEPS = 0.999, 1e-3, 3000  # long enough for AdamW's bias correction to fade


def optimizer_pair() -> tuple[torch.nn.Parameter, torch.optim.AdamW, torch.nn.Parameter, torch.optim.AdamW]:
    """Two equal parameters, each with the learner's AdamW (fused, weight decay 0.01)."""
    start = torch.tensor([0.5, -1.0, 2.0, 0.0])
    plain, clipped = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    make = lambda parameter: torch.optim.AdamW([parameter], lr=LR, eps=1e-8, weight_decay=0.01, fused=True)  # noqa: E731
    return plain, make(plain), clipped, make(clipped)


def test_steady_gradients_step_as_adamw_does() -> None:
    plain, plain_optimizer, clipped, clipped_optimizer = optimizer_pair()
    gradient = torch.tensor([0.01, -0.02, 0.03, 0.01])
    for step in range(20):
        plain.grad, clipped.grad = gradient.clone(), gradient.clone()
        plain_optimizer.step()
        assert clipped_step(clipped_optimizer) == 1.0  # g^2 / v_hat = 1: nothing to clip
        assert torch.allclose(plain, clipped, atol=1e-6), step


def test_a_gradient_far_above_the_recent_ones_has_its_step_divided_by_the_rms() -> None:
    plain, plain_optimizer, clipped, clipped_optimizer = optimizer_pair()
    small = torch.tensor([0.01, -0.02, 0.03, 0.01])
    for _ in range(STEPS):
        plain.grad, clipped.grad = small.clone(), small.clone()
        plain_optimizer.step()
        clipped_step(clipped_optimizer)
    assert torch.equal(plain, clipped)
    spike = 100 * small
    v = clipped_optimizer.state[clipped]["exp_avg_sq"]
    v_hat = (BETA2 * v + (1 - BETA2) * spike.square()) / (1 - BETA2 ** (STEPS + 1))
    rms = float((spike.square() / v_hat).mean().sqrt())
    assert rms > 20  # by hand: v_hat ~ (0.999 + 0.001 * 1e4) small^2, so g^2 / v_hat ~ 1e4 / 11 and the root ~30
    before = plain.detach().clone()
    plain.grad, clipped.grad = spike.clone(), spike.clone()
    plain_optimizer.step()
    scale = clipped_step(clipped_optimizer)
    assert abs(scale - 1 / rms) < 1e-5
    assert torch.allclose(clipped - before, (plain - before) / rms, rtol=0, atol=1e-6)  # weight decay included
    # Plain AdamW moved each entry by (0.9 + 0.1 * 100) / sqrt(11) ~ 3.3 learning rates at once; clipped: ~0.1.
    assert (plain - before).abs().min() > 3 * LR and (clipped - before).abs().max() < 0.2 * LR


def test_the_learner_clips_only_when_asked_and_reports_its_smallest_scale() -> None:
    for clipping in (False, True):
        model = make_model("", "pre", False)
        buffer, _ = rollouts(model)
        config = small_config(
            {"memory_length": L}, n_workers=N, worker_steps=T, n_mini_batch=3, epochs=2, sequence_length=T,
            adam_update_clipping=clipping,
        )  # fmt: skip
        stats = PPOLearner(model, config, torch.Generator().manual_seed(0)).optimize(buffer, 0)
        assert ("update_scale_min" in stats) == clipping
        if clipping:
            assert 0 < stats["update_scale_min"] <= 1
