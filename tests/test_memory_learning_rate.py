"""memory_learning_rate_scale: the memory's parameters take steps at that multiple of the learning rate, every other
parameter at the rate itself; at 1 the optimizer keeps its one group (checkpoints of either kind resume only as they
were trained). learning_rate_warmup: the rate rises from a tenth of the schedule's over the first updates.
transformer.max_learning_rate: the transformer's rate is bounded, the rest trains at the schedule's;
transformer.warmup_updates: with the transformer, every rate is warmed up."""

from __future__ import annotations

import pytest
import torch
from conftest import resume_matches_uninterrupted, small_config, train_small
from test_equivalence import L, N, T, make_model, rollouts

from config import ConfigError
from ppo import PPOLearner, group_rates

RATE = 1e-3


def one_step(
    scale: float, warmup: int = 0, update: int = 0, **transformer: object
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], PPOLearner]:
    """One minibatch's step (of update ``update``) from the same weights, rollout and minibatch; returns the weights
    before and after. ``transformer``: keys of the transformer section (its rate's bound and warm-up)."""
    torch.manual_seed(0)
    model = make_model("", "pre", False)
    buffer, _ = rollouts(model)
    config = small_config(
        {"memory_length": L, **transformer}, n_workers=N, worker_steps=T, n_mini_batch=1, epochs=1, sequence_length=T,
        memory_learning_rate_scale=scale, learning_rate_warmup=warmup,
        learning_rate_schedule={"initial": RATE, "final": RATE / 2, "max_decay_steps": 20},
    )  # fmt: skip
    learner = PPOLearner(model, config, torch.Generator().manual_seed(0))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    learner.optimize(buffer, update)
    return before, {name: p.detach().clone() for name, p in model.named_parameters()}, learner


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_the_memory_steps_at_its_scale_and_the_rest_at_the_rate() -> None:
    before, plain, _ = one_step(1.0)
    _, scaled, learner = one_step(0.25)
    assert [group["lr"] for group in learner.optimizer.param_groups] == [RATE, 0.25 * RATE]
    memory_moved = other_moved = 0
    for name, start in before.items():
        step_plain, step_scaled = plain[name] - start, scaled[name] - start
        if not step_plain.abs().max() > 0:
            continue  # a parameter without a gradient in this minibatch
        if name.startswith("memory."):
            # AdamW's first step is the rate times a unit-sized direction, and decay scales with the rate too.
            # (compared as norms: a float32 weight holds a step of 2.5e-4 to about 1e-7)
            assert relative_gap(step_scaled, 0.25 * step_plain) < 1e-2, name
            memory_moved += 1
        else:
            assert relative_gap(step_scaled, step_plain) < 1e-3, name
            other_moved += 1
    assert memory_moved and other_moved


def test_at_one_every_parameter_is_in_one_group() -> None:
    _, _, learner = one_step(1.0)
    (group,) = learner.optimizer.param_groups
    assert len(group["params"]) == len(list(learner.model.parameters()))


def test_the_scale_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="memory_learning_rate_scale"):
        small_config(memory_learning_rate_scale=0.0)


@pytest.mark.slow
def test_resume_across_the_scales_side_of_one_is_refused(tmp_path: str) -> None:
    first = train_small(tmp_path, "run", 1)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    with pytest.raises(ValueError, match="memory_learning_rate_scale"):
        train_small(tmp_path, "run", 2, checkpoint=checkpoint, memory_learning_rate_scale=0.5)
    scaled = train_small(tmp_path, "scaled", 1, memory_learning_rate_scale=0.5)
    checkpoint = torch.load(scaled.checkpoint_path, weights_only=True)
    resumed = train_small(tmp_path, "scaled", 2, checkpoint=checkpoint, memory_learning_rate_scale=0.3)
    groups = resumed.learner.optimizer.param_groups
    assert [group["lr"] / groups[0]["lr"] for group in groups] == pytest.approx([1.0, 0.3])


@pytest.mark.parametrize("update, share", [(0, 0.1), (3, 0.55), (6, 1.0), (10, 1.0)])
def test_the_warmup_rises_from_a_tenth_of_the_scheduled_rate_to_all_of_it(update: int, share: float) -> None:
    scheduled = RATE - (RATE / 2) * min(update, 20) / 20  # the schedule's own value at this update
    _, _, learner = one_step(0.5, warmup=6, update=update)
    rates = [group["lr"] for group in learner.optimizer.param_groups]
    assert rates == pytest.approx([share * scheduled, 0.5 * share * scheduled])
    _, _, plain = one_step(0.5, warmup=0, update=update)
    assert [group["lr"] for group in plain.optimizer.param_groups] == pytest.approx([scheduled, 0.5 * scheduled])


def test_the_warmup_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="learning_rate_warmup"):
        small_config(learning_rate_warmup=-1)


@pytest.mark.parametrize("update", [0, 10, 20])
def test_the_transformers_rate_is_bounded_where_the_schedule_passes_the_bound(update: int) -> None:
    scheduled = RATE - (RATE / 2) * update / 20  # 1e-3 falling to 5e-4
    bound = 7e-4
    _, _, learner = one_step(1.0, update=update, max_learning_rate=bound)
    rates = [group["lr"] for group in learner.optimizer.param_groups]
    assert rates == pytest.approx([scheduled, min(scheduled, bound)])
    # after the scale: 0.5 x 1e-3 is below the bound
    _, _, scaled = one_step(0.5, update=update, max_learning_rate=bound)
    assert [group["lr"] for group in scaled.optimizer.param_groups] == pytest.approx([scheduled, 0.5 * scheduled])


def test_the_bound_moves_the_transformer_and_nothing_else() -> None:
    before, plain, _ = one_step(1.0)
    _, bounded, _ = one_step(1.0, max_learning_rate=RATE / 4)
    for name, start in before.items():
        step_plain, step_bounded = plain[name] - start, bounded[name] - start
        if not step_plain.abs().max() > 0:
            continue
        factor = 0.25 if name.startswith("memory.") else 1.0
        assert relative_gap(step_bounded, factor * step_plain) < 1e-2, name


@pytest.mark.parametrize("update, share", [(0, 0.1), (2, 0.55), (4, 1.0), (9, 1.0)])
def test_the_transformers_warmup_rises_on_every_rate(update: int, share: float) -> None:
    scheduled = RATE - (RATE / 2) * update / 20
    _, _, learner = one_step(1.0, update=update, max_learning_rate=8e-4, warmup_updates=4)
    rates = [group["lr"] for group in learner.optimizer.param_groups]
    assert rates == pytest.approx([share * scheduled, share * min(scheduled, 8e-4)])
    # alone it keeps one group; with learning_rate_warmup too, the two multiply
    _, _, both = one_step(1.0, warmup=8, update=update, warmup_updates=4)
    everything = 0.1 + 0.9 * min(update, 8) / 8
    assert [group["lr"] for group in both.optimizer.param_groups] == pytest.approx([everything * share * scheduled])


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_a_recurrent_memory_ignores_the_transformers_rate(memory: str) -> None:
    from model import ActorCriticModel

    config = small_config({"max_learning_rate": 1e-5, "warmup_updates": 5}, memory=memory)
    model = ActorCriticModel(config, (3,), [2])
    learner = PPOLearner(model, config, torch.Generator().manual_seed(0))
    (group,) = learner.optimizer.param_groups
    assert len(group["params"]) == len(list(model.parameters()))
    assert group_rates(config, 0) == (config.learning_rate_schedule.value(0),) * 2


@pytest.mark.parametrize("key", ["max_learning_rate", "warmup_updates"])
def test_the_transformers_rate_keys_must_not_be_negative(key: str) -> None:
    with pytest.raises(ConfigError, match=f"transformer.{key}"):
        small_config({key: -1})


@pytest.mark.slow
def test_resume_across_the_transformers_own_rate_is_refused(tmp_path: str) -> None:
    first = train_small(tmp_path, "run", 1)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    with pytest.raises(ValueError, match="max_learning_rate"):
        train_small(tmp_path, "run", 2, checkpoint=checkpoint, transformer={"max_learning_rate": 1e-4})


@pytest.mark.slow
def test_a_run_with_the_transformers_bound_and_warmup_resumes_exactly(tmp_path: str) -> None:
    # interrupted at update 2 of a 3-update warm-up, with the bound below the config's 3e-4: two groups, rates rising
    checkpoint = resume_matches_uninterrupted(tmp_path, transformer={"max_learning_rate": 1e-4, "warmup_updates": 3})
    assert len(checkpoint["optimizer"]["param_groups"]) == 2
