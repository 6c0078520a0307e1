"""Observation storage: images as uint8 levels without changing what the model sees."""

from __future__ import annotations

import torch

from buffer import Buffer, dequantize_images, quantize_images


def test_images_of_255_levels_round_trip_exactly() -> None:
    levels = torch.arange(256, dtype=torch.uint8).repeat(3, 4)
    images = torch.as_tensor(levels.numpy().astype("float32") / 255.0)  # as the environments compute them
    assert torch.equal(dequantize_images(quantize_images(images)), images)
    assert quantize_images(images).dtype == torch.uint8


def test_buffer_stores_images_as_uint8_and_returns_floats() -> None:
    buffer = Buffer(2, 4, 3, 1, 2, (3, 4, 4), 1, torch.float32, torch.device("cpu"))
    assert buffer.obs.dtype == torch.uint8
    images = torch.randint(0, 256, (2, 3, 4, 4)).float() / 255
    for t in range(4):
        buffer.record_step(
            t, images, torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), torch.zeros(2, 1, 2), torch.zeros(2), torch.zeros(2)
        )
    minibatch = next(buffer.minibatches(1, 4, torch.Generator().manual_seed(0)))
    assert minibatch.obs.dtype == torch.float32
    assert torch.equal(minibatch.obs[0, 0], images[0]) or torch.equal(minibatch.obs[0, 0], images[1])
    vectors = Buffer(2, 4, 3, 1, 2, (5,), 1, torch.float32, torch.device("cpu"))
    assert vectors.obs.dtype == torch.float32
