"""target_kl ends an update's epochs before the step of the first minibatch whose policy has moved too far, and
kl_rollback also undoes the step before it (weights and AdamW's moments); the optimizer's settings on resume come from
the run's config, not from the checkpoint, and adam_epsilon_schedule sets AdamW's epsilon of each update."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import resume_matches_uninterrupted, small_config, train_small
from test_equivalence import L, N, T, make_model, rollouts

from buffer import Buffer
from config import ConfigError
from ppo import PPOLearner
from summaries import console_line

MINIBATCHES, EPOCHS = 3, 2


def make_learner(target_kl: float, kl_rollback: bool = False) -> tuple[PPOLearner, Buffer]:
    model = make_model("", "pre", False)
    buffer, _ = rollouts(model)
    config = small_config(
        {"memory_length": L}, n_workers=N, worker_steps=T, n_mini_batch=MINIBATCHES, epochs=EPOCHS, sequence_length=T,
        target_kl=target_kl, kl_rollback=kl_rollback,
        learning_rate_schedule={"initial": 1e-2, "final": 1e-2, "max_decay_steps": 1},
    )  # fmt: skip
    return PPOLearner(model, config, torch.Generator().manual_seed(0)), buffer


def optimize(
    target_kl: float, kl_rollback: bool = False
) -> tuple[dict[str, float], int, list[torch.Tensor], list[torch.Tensor]]:
    """One update on a filled buffer; returns its statistics, the optimizer steps taken, the parameters before and
    after."""
    learner, buffer = make_learner(target_kl, kl_rollback)
    steps = []
    learner.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: steps.append(1))
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.optimize(buffer, 0)
    return stats, len(steps), before, [p.detach().clone() for p in learner.model.parameters()]


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


def test_kl_rollback_undoes_the_step_before_the_minibatch_that_exceeds_target_kl() -> None:
    # As above, the second minibatch passes 1e-9, so the first step is the one undone: the weights are the rollout's
    # again, and AdamW holds no moments, as before any step (the next step is a first step again).
    stats, steps, before, after = optimize(1e-9, kl_rollback=True)
    assert steps == 1 and stats["gradient_steps"] == 0
    assert stats["kl_stop"] == 1.0 and stats["kl_rollback"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # Without rollback the same update keeps its step; a target no minibatch reaches undoes nothing.
    kept, _, _, _ = optimize(1e-9)
    assert kept["kl_rollback"] == 0.0 and kept["gradient_steps"] == 1
    loose, loose_steps, _, _ = optimize(1e9, kl_rollback=True)
    assert loose_steps == loose["gradient_steps"] == EPOCHS * MINIBATCHES and loose["kl_rollback"] == 0.0


def test_kl_rollback_restores_the_moments_of_a_later_step() -> None:
    # After a first update, AdamW has moments; an update whose second minibatch passes the target must leave both the
    # weights and the moments exactly as they were before its first step (a check that can fail: the moments change
    # with every step).
    learner, buffer = make_learner(1e9, kl_rollback=True)
    learner.optimize(buffer, 0)
    weights = [p.detach().clone() for p in learner.model.parameters()]
    moments = {id(p): {k: v.clone() for k, v in state.items()} for p, state in learner.optimizer.state.items()}
    assert moments, "the first update must have stepped"
    learner.config = dataclasses.replace(learner.config, target_kl=1e-9)
    fresh, _ = rollouts(learner.model)  # the rollout of the current policy: its first minibatch has KL 0 and steps
    stats = learner.optimize(fresh, 1)
    assert stats["kl_rollback"] == 1.0 and stats["gradient_steps"] == 0
    assert all(torch.equal(a, p) for a, p in zip(weights, learner.model.parameters(), strict=True))
    for p, state in learner.optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, moments[id(p)][key]), key


def test_kl_rollback_needs_target_kl() -> None:
    with pytest.raises(ConfigError, match="kl_rollback.*target_kl"):
        small_config(kl_rollback=True)


def test_target_kl_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="target_kl"):
        small_config(target_kl=-0.01)


@pytest.mark.slow
def test_resume_takes_the_optimizer_settings_from_the_config(tmp_path: str) -> None:
    first = train_small(tmp_path, "run", 1)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    assert checkpoint["optimizer"]["param_groups"][0]["eps"] == first.config.adam_epsilon
    assert checkpoint["optimizer"]["param_groups"][0]["weight_decay"] == 0.01  # the reference's (torch's default)
    resumed = train_small(tmp_path, "run", 2, checkpoint=checkpoint, adam_epsilon=1e-3, weight_decay=0.0)
    assert resumed.learner.optimizer.param_groups[0]["eps"] == 1e-3
    assert resumed.learner.optimizer.param_groups[0]["weight_decay"] == 0.0
    assert resumed.learner.optimizer.state, "the moments must still come from the checkpoint"


def test_console_line_says_where_target_kl_stopped_and_whether_a_step_was_undone() -> None:
    stats = {"policy_loss": 0.1, "value_loss": 0.2, "entropy": 1.0, "approx_kl": 0.3, "kl_stop": 1.0}
    stopped = console_line(3, 10, 96, 100.0, {"reward": 0.5, "length": 9.0}, {**stats, "gradient_steps": 15.0})
    assert stopped.endswith("(target_kl: stopped after 15 steps)")
    undone = {**stats, "gradient_steps": 14.0, "kl_rollback": 1.0}  # 15 steps taken, the 15th undone
    assert console_line(3, 10, 96, 100.0, {}, undone).endswith("(target_kl: stopped after 15 steps, the last one undone)")


EPSILON_RISE = {"final": 10.0, "start": 1, "max_decay_steps": 2}  # epsilon: 1e-8 in updates 0-1, 5.0 in 2, 10 after


def test_adam_epsilon_schedule_sets_the_epsilon_each_update_steps_with() -> None:
    model = make_model("", "pre", False)
    buffer, _ = rollouts(model)
    config = small_config(
        {"memory_length": L}, n_workers=N, worker_steps=T, n_mini_batch=MINIBATCHES, epochs=EPOCHS, sequence_length=T,
        adam_epsilon_schedule=EPSILON_RISE,
    )  # fmt: skip
    constant = dataclasses.replace(config, adam_epsilon_schedule=small_config().adam_epsilon_schedule)
    moved = {}
    for name, setting in (("scheduled", config), ("constant", constant)):
        learner = PPOLearner(make_model("", "pre", False), setting, torch.Generator().manual_seed(0))
        epsilons = [learner.optimize(buffer, update)["adam_epsilon"] for update in range(2)]
        assert epsilons == [1e-8, 1e-8] and learner.optimizer.param_groups[0]["eps"] == 1e-8
        before = [p.detach().clone() for p in learner.model.parameters()]
        stats = learner.optimize(buffer, 2)
        moved[name] = sum((p.detach() - b).abs().sum().item() for p, b in zip(learner.model.parameters(), before, strict=True))
        if name == "scheduled":
            assert stats["adam_epsilon"] == learner.optimizer.param_groups[0]["eps"] == pytest.approx(5.0)
            assert learner.optimize(buffer, 3)["adam_epsilon"] == 10.0
    # An epsilon far above the root of the second moments shrinks every step: the optimizer uses the scheduled one.
    assert moved["scheduled"] < 0.1 * moved["constant"]


@pytest.mark.slow
def test_adam_epsilon_schedule_resumes_exactly(tmp_path: str) -> None:
    # The epsilon changes between the two updates before the checkpoint and the two after it.
    resume_matches_uninterrupted(
        tmp_path, adam_epsilon=1e-5, adam_epsilon_schedule={"final": 1e-3, "start": 1, "max_decay_steps": 2}
    )


def test_adam_epsilon_schedule_starts_from_adam_epsilon() -> None:
    config = small_config(adam_epsilon=1e-4, adam_epsilon_schedule={"final": 1e-3, "start": 99, "max_decay_steps": 1})
    values = [config.adam_epsilon_schedule.value(update) for update in (0, 99, 100, 500)]
    assert values == [1e-4, 1e-4, 1e-3, 1e-3]
    alone = small_config(adam_epsilon_schedule={"initial": 1e-4, "final": 1e-3, "max_decay_steps": 1})
    assert alone.adam_epsilon == alone.adam_epsilon_schedule.initial == 1e-4  # the schedule's initial, no adam_epsilon
    assert small_config(adam_epsilon=1e-4).adam_epsilon_schedule.value(1000) == 1e-4  # no schedule: constant


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"adam_epsilon": 1e-5, "adam_epsilon_schedule": {"initial": 1e-4, "final": 1e-3, "max_decay_steps": 1}},
         r"adam_epsilon_schedule.initial' \(0.0001\) differs from 'adam_epsilon' \(1e-05\)"),
        ({"adam_epsilon_schedule": {"final": 0.0, "max_decay_steps": 1}}, r"adam_epsilon_schedule.final' must be > 0"),
        ({"adam_epsilon_schedule": {"final": 1e-3}}, r"missing key 'adam_epsilon_schedule.max_decay_steps'"),
        ({"adam_epsilon_schedule": {"final": 1e-3, "max_decay_steps": 1, "start": -1}}, r"start' must be >= 0"),
    ],
)  # fmt: skip
def test_bad_adam_epsilon_schedule_is_named(overrides: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        small_config(**overrides)
