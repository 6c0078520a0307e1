"""Observation encoders: one observation (*obs_shape) becomes one token (D,) for the memory.

Shapes (legend as in buffer.py): B batch rows, Q steps per row, D embed dim.

``make_encoder`` picks the encoder from the observation shape. Every encoder has the same small interface:
``prepare`` turns environment observations into the tensors the model and the buffer keep (``storage_dtype``), and
``forward`` embeds (B, Q, *obs_shape) into (B, Q, D). A Dict observation encoder is one more class of that shape.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from heads import orthogonal


def quantize_images(obs: torch.Tensor) -> torch.Tensor:
    """Images with values in [0, 1] as uint8 levels: how rollouts pass them to the model and the buffer stores them.

    Lossless for the shipped tasks, whose images are exact multiples of 1/255 (``dequantize_images`` gives back the
    very same floats), and rollouts and training see the same pixels whatever an environment returns.
    """
    return (obs * 255).round_().clamp_(0, 255).to(torch.uint8)


def dequantize_images(obs: torch.Tensor) -> torch.Tensor:
    """uint8 levels back to float32 in [0, 1]; float input is returned as it is."""
    return obs.float() / 255 if obs.dtype == torch.uint8 else obs


class _ConvOnLevels(torch.autograd.Function):
    """``conv2d(levels / 255, weight, bias)`` for uint8 image levels, keeping only the uint8 levels for backward.

    Same result as converting the images to floats first, but cheaper: the 1/255 is folded into the (small) weight
    instead of dividing every pixel; the float copy is made in channels-last order, which the CPU's convolution
    kernels prefer (with the next point, the encoder's forward + backward took 16% less time on the development CPU);
    and backward keeps only the uint8 levels, a quarter of the float copy's memory, and rebuilds the floats from them
    instead of recomputing the whole convolution. The input needs no gradient: backward computes only the weight and
    bias gradients.
    """

    @staticmethod
    def forward(ctx, levels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
        ctx.save_for_backward(levels, weight)
        ctx.stride = stride
        return F.conv2d(_channels_last_floats(levels), weight / 255, bias, stride)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor | None, torch.Tensor | None, None]:
        levels, weight = ctx.saved_tensors
        stride = ctx.stride
        _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad, _channels_last_floats(levels), weight / 255, [weight.shape[0]], [stride, stride], [0, 0], [1, 1],
            False, [0, 0], 1, [False, ctx.needs_input_grad[1], ctx.needs_input_grad[2]],
        )  # fmt: skip
        return None, None if grad_weight is None else grad_weight / 255, grad_bias, None


def _channels_last_floats(images: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) images as float32 in channels-last memory order (one copy at most)."""
    return images.to(dtype=torch.float32, memory_format=torch.channels_last)


class ImageEncoder(nn.Module):
    """The reference's convolutions (32x8/4, 64x4/2, 64x3/1, ReLU after each), then Linear + ReLU to D.

    Images arrive as uint8 levels (``prepare``), a quarter of float32's memory in the buffer; float images in [0, 1]
    are accepted too.
    """

    storage_dtype = torch.uint8

    def __init__(self, observation_shape: tuple[int, int, int], embed_dim: int) -> None:
        super().__init__()
        self.observation_shape = tuple(observation_shape)
        # In-place ReLUs: a convolution's output is not needed for its backward, so the minibatch keeps one copy of
        # each activation instead of two.
        self.conv = nn.Sequential(
            orthogonal(nn.Conv2d(observation_shape[0], 32, 8, stride=4), np.sqrt(2)),
            nn.ReLU(inplace=True),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2), np.sqrt(2)),
            nn.ReLU(inplace=True),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1), np.sqrt(2)),
            nn.ReLU(inplace=True),
            nn.Flatten(),
        )
        with torch.no_grad():
            features = self.conv(torch.zeros(1, *observation_shape)).shape[1]
        self.embedding = orthogonal(nn.Linear(features, embed_dim), np.sqrt(2))

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment images (..., C, H, W) in [0, 1] as uint8 levels on the model's device."""
        return quantize_images(torch.as_tensor(obs, dtype=torch.float32, device=self.embedding.weight.device))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, Q, C, H, W) uint8 levels or floats in [0, 1] -> (B, Q, D)."""
        b, q = obs.shape[:2]
        x = obs.reshape(b * q, *self.observation_shape)
        first = self.conv[0]
        if x.dtype == torch.uint8:
            x = _ConvOnLevels.apply(x, first.weight, first.bias, first.stride[0])
        else:
            x = first(_channels_last_floats(x))
        x = self.conv[1:](x)  # channels-last activations from here on, flattened in (C, H, W) order
        return torch.relu(self.embedding(x)).view(b, q, -1)


class VectorEncoder(nn.Module):
    """Linear + ReLU from the observation vector (F,) to D."""

    storage_dtype = torch.float32

    def __init__(self, observation_shape: tuple[int], embed_dim: int) -> None:
        super().__init__()
        self.observation_shape = tuple(observation_shape)
        self.embedding = orthogonal(nn.Linear(observation_shape[0], embed_dim), np.sqrt(2))

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment vectors (..., F) as float32 on the model's device."""
        return torch.as_tensor(obs, dtype=torch.float32, device=self.embedding.weight.device)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, Q, F) -> (B, Q, D)."""
        return torch.relu(self.embedding(obs))


def make_encoder(observation_shape: tuple[int, ...], embed_dim: int) -> nn.Module:
    """The encoder for an observation shape: (C, H, W) images or (F,) vectors."""
    if len(observation_shape) == 3:
        return ImageEncoder(observation_shape, embed_dim)
    if len(observation_shape) == 1:
        return VectorEncoder(observation_shape, embed_dim)
    raise ValueError(f"observation shape {tuple(observation_shape)} is neither an image (C, H, W) nor a vector (F,)")
