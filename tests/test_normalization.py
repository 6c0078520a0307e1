"""Observation and reward normalisation (normalization.py): the running statistics, what is normalised, that the
statistics travel with checkpoints and model files and stay frozen in evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import resume_matches_uninterrupted, train_small

import normalization
from checkpoint import load_model
from evaluation import evaluate
from normalization import RewardScaler, RunningMeanStd, VectorNormalizers


def test_running_statistics_of_batches_equal_those_of_their_concatenation() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(5.0, 3.0, size=(n, 3)) for n in (7, 1, 40, 13)]
    statistics = RunningMeanStd((3,))
    for batch in batches:
        statistics.update(torch.as_tensor(batch))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(statistics.mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(statistics.var.numpy(), everything.var(0), rtol=1e-10)
    assert statistics.count.item() == len(everything)


def test_ranks_merge_into_the_statistics_of_all_their_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks with different batches: each all-reduces (count, sum, sum of squares) around the same old mean.
    rng = np.random.default_rng(1)
    first, second = torch.as_tensor(rng.normal(size=(9, 2))), torch.as_tensor(rng.normal(3.0, 2.0, size=(30, 2)))
    history = torch.as_tensor(rng.normal(size=(5, 2)))
    ranks = [RunningMeanStd((2,)) for _ in range(2)]
    for statistics in ranks:
        statistics.update(history)
    sums = {}
    monkeypatch.setattr(normalization, "all_reduce_sum", lambda tensor, _: sums.setdefault("other", tensor.clone()))
    ranks[1].update(second)  # its own sums only, captured
    monkeypatch.setattr(normalization, "all_reduce_sum", lambda tensor, _: tensor + sums["other"])
    ranks[0].update(first)
    monkeypatch.undo()
    together = RunningMeanStd((2,))
    together.update(torch.cat([history, first, second]))
    torch.testing.assert_close(ranks[0].mean, together.mean)
    torch.testing.assert_close(ranks[0].var, together.var)


def test_vectors_are_normalised_and_clipped_and_images_pass_through() -> None:
    normalizers = VectorNormalizers({"image": (3, 8, 8), "vector": (2,)}, clip=2.0)
    normalizers.update({"image": torch.rand(4, 5, 3, 8, 8), "vector": torch.tensor([[0.0, 10.0], [2.0, 30.0]])})
    image = torch.rand(1, 3, 8, 8)
    out = normalizers({"image": image, "vector": torch.tensor([[1.0, 20.0], [3.0, 1000.0]])})
    assert out["image"] is image
    torch.testing.assert_close(out["vector"], torch.tensor([[0.0, 0.0], [2.0, 2.0]]))  # (1 - 1) / 1, (3 - 1) / 1 ...


def test_normalising_observations_without_a_vector_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="normalize_observations false"):
        VectorNormalizers((3, 84, 84), clip=10.0)


def test_rewards_are_divided_by_the_std_of_the_discounted_return_which_restarts_at_episode_ends() -> None:
    scaler = RewardScaler(2, gamma=0.5, clip=100.0, device=torch.device("cpu"))
    rewards = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 4.0]])
    ended = torch.tensor([[False, True, False], [False, False, False]])
    scaled = scaler.scale(rewards, ended)
    returns = np.array([1.0, 1.5, 1.0, 2.0, 1.0, 4.5])  # worker 0 restarts after its step 1
    torch.testing.assert_close(scaled, rewards / np.sqrt(returns.var() + normalization.EPSILON), check_dtype=False)
    torch.testing.assert_close(scaler.returns, torch.tensor([1.0, 4.5], dtype=torch.float64))


@pytest.mark.slow
def test_resumed_run_with_normalisation_equals_uninterrupted_run(tmp_path: str) -> None:
    checkpoint = resume_matches_uninterrupted(tmp_path, normalize_observations=True, normalize_rewards=True)
    assert checkpoint["rewards"]["count"] > 0 and checkpoint["rewards"]["returns"].shape == (4,)


@pytest.mark.slow
def test_statistics_travel_in_the_model_file_and_stay_frozen_in_evaluation(tmp_path: str) -> None:
    trainer = train_small(tmp_path, "normalised", 2, normalize_observations=True)
    statistics = trainer.model.normalizer.parts[0].statistics
    assert statistics.count.item() == 2 * 4 * 16  # both rollouts, every worker's step
    model, config = load_model(trainer.model_path, torch.device("cpu"))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    before = {name: value.clone() for name, value in model.normalizer.state_dict().items()}
    evaluate(model, config, torch.device("cpu"), episodes=2)
    for name, value in model.normalizer.state_dict().items():
        assert torch.equal(value, before[name]), name
