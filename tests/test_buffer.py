"""Observation storage: images as uint8 levels without changing what the model sees."""

from __future__ import annotations

import pytest
import torch
from conftest import small_config

from buffer import Buffer
from encoders import ImageEncoder, channels_last_levels, dequantize_images, quantize_images
from memories.trxl import TrXLContext
from model import ActorCriticModel


def test_images_of_255_levels_round_trip_exactly() -> None:
    levels = torch.arange(256, dtype=torch.uint8).repeat(3, 4)
    images = torch.as_tensor(levels.numpy().astype("float32") / 255.0)  # as the environments compute them
    assert torch.equal(dequantize_images(quantize_images(images)), images)
    assert quantize_images(images).dtype == torch.uint8


def recorded_rollout(model: ActorCriticModel, images: torch.Tensor) -> tuple[Buffer, list[torch.Tensor]]:
    """A buffer holding the rollout of ``model`` on ``images`` (T, N, *obs_shape), step t seeing images[t], and the
    observations as ``model.prepare`` made them."""
    steps, workers = images.shape[:2]
    cpu = torch.device("cpu")
    buffer = Buffer(workers, steps, images.shape[2:], model.storage_dtype, 1, model.memory.trace(workers, steps, cpu), cpu)
    state, prepared = model.memory.start(workers, cpu), []
    with torch.no_grad():
        for t in range(steps):
            obs = model.prepare(images[t].numpy())
            _, out, _ = model.act(obs, state, lambda policy: policy.sample())
            buffer.record_step(t, obs, torch.zeros(workers, 1), torch.zeros(workers), torch.zeros(workers), out.record)
            prepared.append(obs)
    return buffer, prepared


def test_buffer_stores_images_as_uint8() -> None:
    model = ActorCriticModel(small_config(), (3, 36, 36), [1])
    assert model.storage_dtype == torch.uint8
    images = torch.rand(2, 3, 36, 36)
    buffer, _ = recorded_rollout(model, images.expand(4, -1, -1, -1, -1))
    assert buffer.obs.dtype == torch.uint8
    minibatch = next(buffer.minibatches(1, 4, torch.Generator().manual_seed(0)))
    assert minibatch.obs.dtype == torch.uint8
    assert torch.equal(minibatch.obs[0, 0], quantize_images(images[0])) or torch.equal(
        minibatch.obs[0, 0], quantize_images(images[1])
    )
    vector_model = ActorCriticModel(small_config(), (5,), [1])
    assert vector_model.storage_dtype == torch.float32
    assert vector_model.prepare(torch.rand(2, 5).numpy()).dtype == torch.float32


@pytest.mark.parametrize("sampling", ["chunks", "steps"])
def test_images_stay_channels_last_from_the_rollout_to_the_minibatch(sampling: str) -> None:
    """The convolutions take images channels-last: prepared images, the buffer and its minibatches keep that memory
    layout (so training reorders nothing) with the values and the logical (C, H, W) shape unchanged."""
    model = ActorCriticModel(small_config(), (3, 36, 36), [1])
    images = torch.rand(4, 2, 3, 36, 36)
    buffer, prepared = recorded_rollout(model, images)
    assert buffer.obs.shape == (2, 4, 3, 36, 36) and buffer.obs.stride()[2:] == (1, 36 * 3, 3)
    for t, obs in enumerate(prepared):
        assert obs.is_contiguous(memory_format=torch.channels_last) and not obs.is_contiguous()
        assert torch.equal(obs, quantize_images(images[t]))
    assert torch.equal(buffer.obs, quantize_images(images.transpose(0, 1)))
    minibatch = next(buffer.minibatches(1, 2, torch.Generator().manual_seed(0), sampling))
    flat = minibatch.obs.reshape(-1, 3, 36, 36)
    assert flat.is_contiguous(memory_format=torch.channels_last) and not flat.is_contiguous()


@pytest.mark.parametrize("bfloat16", [False, True])
def test_the_encoder_gives_the_same_bits_for_either_layout_of_the_levels(bfloat16: bool) -> None:
    """Storing images channels-last changes only their memory layout: outputs and gradients are bit for bit the same."""
    torch.manual_seed(0)
    encoder = ImageEncoder((3, 36, 36), 16)
    levels = torch.randint(0, 256, (2, 5, 3, 36, 36), dtype=torch.uint8)
    results = []
    for obs in (levels, channels_last_levels(levels)):
        encoder.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            out = encoder(obs)
        out.float().square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in encoder.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


@pytest.mark.parametrize("side", [84, 12])  # the reference's convolutions, and the padded ones of small images
def test_model_on_uint8_images_equals_float_images_with_gradients(side: int) -> None:
    torch.manual_seed(0)
    model = ActorCriticModel(small_config(), (3, side, side), [3])
    levels = torch.randint(0, 256, (2, 3, 3, side, side), dtype=torch.uint8)
    memory, steps = torch.randn(2, 6, 2, 16), torch.arange(6).expand(2, 6)  # S = C + L - 1 = 6 slots
    mask = torch.ones(2, 3, 6, dtype=torch.bool)
    # Query q of the chunk is the step of slot q + L - 1 (the recency bias needs the queries' steps).
    context = TrXLContext(memory, steps, mask, torch.ones(2, 3, 4, dtype=torch.bool), query_steps=steps[:, 3:])
    results = []
    for obs in (levels, dequantize_images(levels)):
        model.zero_grad()
        out = model(obs, context)
        out.value.sum().backward()
        results.append((out.value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (value_u8, grads_u8), (value_f, grads_f) = results
    torch.testing.assert_close(value_u8, value_f)  # the uint8 path folds 1/255 into the weights: rounding differs
    assert grads_u8.keys() == grads_f.keys() and "encoder.conv.0.weight" in grads_u8
    for name in grads_u8:
        scale = grads_f[name].abs().max().item()  # float32 rounding relative to the gradient's own size
        torch.testing.assert_close(grads_u8[name], grads_f[name], rtol=1e-5, atol=1e-5 * scale, msg=name)
