"""Observation reconstruction: the decoder's shapes, its loss, and its place in the PPO update."""

from __future__ import annotations

import pytest
import torch
from conftest import random_rollout_buffer, small_config

from encoders import ImageDecoder, VectorDecoder, quantize_images
from model import ActorCriticModel
from ppo import PPOLearner, forward_minibatch, reconstruction_loss


@pytest.mark.parametrize("shape", [(3, 84, 84), (1, 84, 84), (3, 64, 64), (3, 96, 96), (3, 85, 90)])
def test_image_decoder_gives_the_observation_shape(shape: tuple) -> None:
    decoder = ImageDecoder(shape, 16)
    assert tuple(decoder(torch.zeros(2, 5, 16)).shape) == (2, 5, *shape)


def test_image_loss_is_the_binary_cross_entropy_of_the_sigmoid() -> None:
    logits = torch.tensor([[0.0, 2.0], [-1.0, 0.5]])
    images = torch.tensor([[0.0, 1.0], [0.2, 0.6]])
    p = torch.sigmoid(logits)
    expected = -(images * p.log() + (1 - images) * (1 - p).log()).mean()
    torch.testing.assert_close(ImageDecoder.loss(logits, images), expected)
    # uint8 levels, as the buffer stores images, give the same loss as the floats they stand for
    torch.testing.assert_close(
        ImageDecoder.loss(logits, quantize_images(images)), ImageDecoder.loss(logits, images), rtol=1e-2, atol=1e-2
    )
    assert VectorDecoder.loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(2.5)


@pytest.mark.parametrize("memory", ["trxl", "gru", "none"])
@pytest.mark.parametrize("obs_shape", [(4,), (3, 36, 36), {"image": (3, 12, 12), "vector": (4,)}])
def test_reconstruction_trains_the_decoder_and_is_logged(memory: str, obs_shape: tuple | dict) -> None:
    config = small_config(memory=memory, reconstruction_coefficient=0.1, epochs=3)
    torch.manual_seed(0)
    model = ActorCriticModel(config, obs_shape, [3])
    buffer = random_rollout_buffer(model, obs_shape, config.n_workers, config.worker_steps)
    minibatch = next(buffer.minibatches(1, config.worker_steps, torch.Generator().manual_seed(0)))
    before = reconstruction_loss(model, forward_minibatch(model, minibatch), minibatch).item()
    learner = PPOLearner(model, config, torch.Generator().manual_seed(0))
    stats = learner.optimize(buffer, 0)
    assert stats["reconstruction_loss"] > 0 and stats["grad_norm/decoder"] > 0
    after = reconstruction_loss(model, forward_minibatch(model, minibatch), minibatch).item()
    assert after < before, (before, after)


def test_no_decoder_without_reconstruction() -> None:
    config = small_config()
    model = ActorCriticModel(config, (4,), [3])
    assert model.decoder is None
    stats = PPOLearner(model, config, torch.Generator().manual_seed(0)).optimize(
        random_rollout_buffer(model, (4,), config.n_workers, config.worker_steps), 0
    )
    assert "reconstruction_loss" not in stats


@pytest.mark.parametrize("obs_shape", [(4,), {"image": (3, 12, 12), "vector": (4,)}])
def test_with_observation_normalisation_the_target_is_the_observation_the_encoder_saw(obs_shape: tuple | dict) -> None:
    config = small_config(reconstruction_coefficient=0.1, normalize_observations=True)
    torch.manual_seed(0)
    model = ActorCriticModel(config, obs_shape, [3])
    statistics = model.normalizer.parts[0].statistics  # raw features near 0.5 sit near -5 after normalisation
    statistics.mean.fill_(100.0), statistics.var.fill_(400.0), statistics.count.fill_(1000.0)
    buffer = random_rollout_buffer(model, obs_shape, config.n_workers, config.worker_steps)
    minibatch = next(buffer.minibatches(1, config.worker_steps, torch.Generator().manual_seed(0)))
    features = forward_minibatch(model, minibatch).features
    seen = model.normalizer(minibatch.obs)
    expected = model.decoder.loss(model.decoder(features), seen)
    loss = reconstruction_loss(model, forward_minibatch(model, minibatch), minibatch)
    torch.testing.assert_close(loss, expected)
    raw_target = model.decoder.loss(model.decoder(features), minibatch.obs)
    assert abs(loss - raw_target) > 1.0, (loss, raw_target)  # the two targets are told apart
