"""Observation storage: images as uint8 levels without changing what the model sees."""

from __future__ import annotations

import torch

from buffer import Buffer
from model import dequantize_images, quantize_images


def test_images_of_255_levels_round_trip_exactly() -> None:
    levels = torch.arange(256, dtype=torch.uint8).repeat(3, 4)
    images = torch.as_tensor(levels.numpy().astype("float32") / 255.0)  # as the environments compute them
    assert torch.equal(dequantize_images(quantize_images(images)), images)
    assert quantize_images(images).dtype == torch.uint8


def test_buffer_stores_images_as_uint8() -> None:
    buffer = Buffer(2, 4, 3, 1, 2, (3, 4, 4), 1, torch.float32, torch.device("cpu"))
    assert buffer.obs.dtype == torch.uint8
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    for t in range(4):
        buffer.record_step(
            t, images, torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), torch.zeros(2, 1, 2), torch.zeros(2), torch.zeros(2)
        )
    minibatch = next(buffer.minibatches(1, 4, torch.Generator().manual_seed(0)))
    assert minibatch.obs.dtype == torch.uint8
    assert torch.equal(minibatch.obs[0, 0], images[0]) or torch.equal(minibatch.obs[0, 0], images[1])
    vectors = Buffer(2, 4, 3, 1, 2, (5,), 1, torch.float32, torch.device("cpu"))
    assert vectors.obs.dtype == torch.float32


def test_model_on_uint8_images_equals_float_images_with_gradients() -> None:
    from conftest import small_config

    from model import ActorCriticModel

    torch.manual_seed(0)
    model = ActorCriticModel(small_config(), (3, 84, 84), [3])
    levels = torch.randint(0, 256, (2, 3, 3, 84, 84), dtype=torch.uint8)
    memory, steps = torch.randn(2, 4, 2, 16), torch.arange(4).expand(2, 4)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    results = []
    for obs in (levels, dequantize_images(levels)):
        model.zero_grad()
        out = model(obs, model.project_memory(memory, steps), mask)
        out.value.sum().backward()
        results.append((out.value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (value_u8, grads_u8), (value_f, grads_f) = results
    torch.testing.assert_close(value_u8, value_f)  # the uint8 path folds 1/255 into the weights: rounding differs
    assert grads_u8.keys() == grads_f.keys() and "conv.0.weight" in grads_u8
    for name in grads_u8:
        torch.testing.assert_close(grads_u8[name], grads_f[name], rtol=1e-5, atol=1e-6, msg=name)
