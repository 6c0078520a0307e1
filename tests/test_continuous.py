"""Continuous actions: the action spec, the diagonal Gaussian policy, clipping at the environment, exact replay,
training that reproduces the rollout, and a memory task learned with them."""

from __future__ import annotations

import math
import os

import gymnasium
import numpy as np
import pytest
import torch
from conftest import (
    assert_training_reproduces_the_rollout,
    collect_random_rollout,
    resume_matches_uninterrupted,
    small_config,
)

from buffer import Buffer
from env_group import step_lanes, to_env_action
from environments.action_spec import ActionSpec
from heads import DiagonalGaussian, make_policy_head
from model import ActorCriticModel
from trainer import PPOTrainer
from worker import Workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POC_CONTINUOUS = {"type": "PocMemoryEnv", "continuous": True}
SPEC = ActionSpec(low=(-1.0, -2.0), high=(1.0, 0.5))


def test_action_spec_of_each_supported_space_and_clear_errors() -> None:
    assert ActionSpec.of(gymnasium.spaces.Discrete(3)) == ActionSpec(counts=(3,))
    assert ActionSpec.of(gymnasium.spaces.MultiDiscrete([2, 4])).counts == (2, 4)
    box = ActionSpec.of(gymnasium.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), dtype=np.float32))
    assert box.continuous and box.width == 2 and box.low == (-1.0, 0.0) and box.high == (1.0, 2.0)
    assert ActionSpec.coerce(box.to_dict()) == box and ActionSpec.coerce([3, 2]) == ActionSpec(counts=(3, 2))
    with pytest.raises(ValueError, match="infinite bounds.*finite low and high"):
        ActionSpec.of(gymnasium.spaces.Box(-np.inf, np.inf, (2,)))
    with pytest.raises(ValueError, match="not supported.*1-D Box"):
        ActionSpec.of(gymnasium.spaces.Box(-1, 1, (2, 2)))
    with pytest.raises(ValueError, match="not supported"):
        ActionSpec.of(gymnasium.spaces.Tuple((gymnasium.spaces.Discrete(2), gymnasium.spaces.Discrete(2))))


def test_gaussian_matches_torch_normal() -> None:
    mean, log_std = torch.tensor([[0.5, -1.0], [0.0, 2.0]]), torch.tensor([0.3, -0.7])
    dist = DiagonalGaussian(mean, log_std)
    normal = torch.distributions.Normal(mean, log_std.exp())
    actions = torch.tensor([[1.0, 0.0], [-0.5, 2.5]])
    torch.testing.assert_close(dist.log_prob(actions), normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), normal.entropy().sum(-1))
    assert torch.equal(dist.sample(deterministic=True), mean)
    a = dist.sample(generator=torch.Generator().manual_seed(3))
    b = dist.sample(generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.equal(a, mean)


def test_gaussian_head_starts_near_zero_with_unit_std() -> None:
    torch.manual_seed(0)
    head = make_policy_head(SPEC, 8, 16)
    dist = head(torch.randn(5, 8))
    assert dist.mean.shape == (5, 2) and dist.mean.abs().max() < 0.1
    assert dist.entropy().shape == (5,)
    torch.testing.assert_close(dist.entropy(), torch.full((5,), 2 * 0.5 * (1 + math.log(2 * math.pi))))


def test_env_actions_are_clipped_to_the_box() -> None:
    box = gymnasium.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), dtype=np.float32)
    clipped = to_env_action(box, [3.0, -1.0])
    assert clipped.dtype == np.float32 and clipped.tolist() == [1.0, 0.0]
    assert to_env_action(gymnasium.spaces.Discrete(3), [2]) == 2
    assert to_env_action(gymnasium.spaces.MultiDiscrete([2, 3]), [1, 2]).dtype == np.int64


def test_workers_clip_record_unclipped_and_replay_exactly() -> None:
    rng = np.random.default_rng(0)
    with Workers(POC_CONTINUOUS, 2, 0, seed=0) as workers, Workers(POC_CONTINUOUS, 2, 0, seed=0) as copy:
        assert workers.action_spec == ActionSpec(low=(-1.0,), high=(1.0,)) and workers.action_dims == []
        workers.reset()
        for _ in range(4):  # out-of-bounds actions step the environments clipped
            result = workers.step(rng.normal(0, 2, size=(2, 1)).astype(np.float32))
        state = workers.state()
        assert any(abs(a[0]) > 1 for entry in state for a in entry["actions"]), "the unclipped actions are recorded"
        restored = copy.restore(state)
        np.testing.assert_array_equal(restored, result.obs)
        actions = rng.normal(0, 1, size=(2, 1)).astype(np.float32)
        np.testing.assert_array_equal(workers.step(actions).obs, copy.step(actions).obs)


@pytest.mark.parametrize("memory", ["trxl", "gru"])
@pytest.mark.parametrize("sampling", ["chunks", "steps"])
def test_training_reproduces_the_rollout_with_continuous_actions(memory: str, sampling: str) -> None:
    torch.manual_seed(0)
    n, t = 3, 12
    config = small_config(memory=memory, n_workers=n, worker_steps=t, sequence_length=4, n_mini_batch=3)
    model = ActorCriticModel(config, (4,), SPEC)
    cpu = torch.device("cpu")
    buffer = Buffer(n, t, (4,), torch.float32, SPEC.width, model.memory.trace(n, t, cpu), cpu, torch.float32)
    collect_random_rollout(model, buffer, (4,))
    assert buffer.actions.dtype == torch.float32 and buffer.actions.abs().max() > 0
    assert_training_reproduces_the_rollout(model, buffer, sampling)


@pytest.mark.slow
def test_resumed_continuous_run_equals_uninterrupted_run(tmp_path: str) -> None:
    overrides = {"environment": dict(POC_CONTINUOUS), "worker_steps": 20, "sequence_length": 10}
    checkpoint = resume_matches_uninterrupted(tmp_path, **overrides)
    assert isinstance(checkpoint["workers"][0]["actions"][0][0], float)


@pytest.mark.slow
def test_continuous_proof_of_memory_task_is_learned(tmp_path: str) -> None:
    """Moving by a continuous amount, the agent still has to remember which end rewards: success >= 0.9 in 20 updates."""
    from config import load_config

    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env_continuous.yaml"), {"updates": 20})
    trainer = PPOTrainer(config, "continuous", torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    means = trainer.run(log_every=10)
    assert means["success"] >= 0.9, means


def test_random_play_draws_continuous_actions_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    import evaluation

    played = []

    def recording(env: object, actions: list) -> tuple:
        played.extend(actions)
        return step_lanes(env, actions)

    monkeypatch.setattr(evaluation, "step_lanes", recording)
    results = evaluation.random_play(dict(POC_CONTINUOUS), episodes=4)
    actions = np.stack(played)
    assert len(results) == 4 and actions.shape == (len(played), 1)
    assert actions.min() >= -1 and actions.max() <= 1 and actions.std() > 0.4  # uniform on [-1, 1]: std 0.58


def test_clipped_log_prob_is_the_tail_beyond_a_bound() -> None:
    mean, log_std = torch.tensor([[0.5, -2.0]]), torch.tensor([0.0, math.log(0.5)])
    low, high = torch.tensor([-1.0, -1.0]), torch.tensor([1.0, 1.0])
    clipped, plain = DiagonalGaussian(mean, log_std, (low, high)), DiagonalGaussian(mean, log_std)
    normal = torch.distributions.Normal(mean[0].double(), log_std.exp().double())  # float64: tails of 6 std
    inside = torch.tensor([[0.2, -0.5]])
    torch.testing.assert_close(clipped.log_prob(inside), plain.log_prob(inside))
    # At or beyond a bound every sample is the same action: the log of the tail's probability, however far it is.
    below, above = normal.cdf(low.double()).float(), (1 - normal.cdf(high.double())).float()
    for beyond in ([1.0, -1.0], [3.0, -7.0]):
        expected = torch.log(above[0]) + torch.log(below[1])
        torch.testing.assert_close(clipped.log_prob(torch.tensor([beyond])), expected.view(1))
    torch.testing.assert_close(
        clipped.log_prob(torch.tensor([[-4.0, 2.0]])), (torch.log(below[0]) + torch.log(above[1])).view(1)
    )
    # What the environment executes has probability 1 in all: both tails plus the density inside the bounds.
    grid = torch.linspace(-1, 1, 20001)
    density = torch.stack(
        [DiagonalGaussian(mean[:, e : e + 1], log_std[e : e + 1]).log_prob(grid.view(-1, 1)) for e in range(2)], -1
    )
    inside_mass = torch.trapezoid(density.exp(), grid, dim=0)
    torch.testing.assert_close(inside_mass + below + above, torch.ones(2), atol=1e-5, rtol=0)


def test_clipped_log_prob_stops_rewarding_a_mean_beyond_the_bound() -> None:
    # A mean already at 3 (bound 1): a sample beyond the bound pulls the mean further with the density, but hardly
    # with the clipped log-probability (its gradient vanishes as the tail's probability tends to 1).
    bounds = (torch.tensor([-1.0]), torch.tensor([1.0]))
    for clip, vanishes in ((None, False), (bounds, True)):
        mean = torch.tensor([[3.0]], requires_grad=True)
        DiagonalGaussian(mean, torch.zeros(1), clip).log_prob(torch.tensor([[4.0]])).sum().backward()
        assert (abs(mean.grad.item()) < 0.1) == vanishes, (clip, mean.grad)


def test_clipped_log_prob_reaches_the_head_from_the_action_space() -> None:
    head = make_policy_head(SPEC, 8, 16, clipped_log_prob=True)
    dist = head(torch.randn(3, 8))
    torch.testing.assert_close(dist.bounds[0], torch.tensor(SPEC.low))
    torch.testing.assert_close(dist.bounds[1], torch.tensor(SPEC.high))
    assert make_policy_head(SPEC, 8, 16)(torch.randn(3, 8)).bounds is None
    assert set(head.state_dict()) == set(make_policy_head(SPEC, 8, 16).state_dict())  # the same model files
