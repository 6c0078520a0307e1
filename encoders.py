"""Observation encoders: one observation (*obs_shape) becomes one token (D,) for the memory.

Shapes (legend as in buffer.py): B batch rows, Q steps per row, D embed dim.

``make_encoder`` picks the encoder from the observation shape. Every encoder has the same small interface:
``prepare`` turns environment observations into the tensors the model and the buffer keep (``storage_dtype``), and
``forward`` embeds (B, Q, *obs_shape) into (B, Q, D), D = ``output_dim``. Without an embedding width (the recurrent
memories, as in the reference's recurrent sister repository) the encoder gives its raw features: the flattened
convolution output of an image, or the vector as it is. A Dict observation encoder is one more class of that shape.
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
    """The reference's convolutions (32x8/4, 64x4/2, 64x3/1, ReLU after each), then Linear + ReLU to D (none without
    ``embed_dim``: D is then the flattened convolution output).

    Images arrive as uint8 levels (``prepare``), a quarter of float32's memory in the buffer; float images in [0, 1]
    are accepted too.
    """

    storage_dtype = torch.uint8

    def __init__(self, observation_shape: tuple[int, int, int], embed_dim: int | None) -> None:
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
        self.embedding = None if embed_dim is None else orthogonal(nn.Linear(features, embed_dim), np.sqrt(2))
        self.output_dim = features if embed_dim is None else embed_dim

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment images (..., C, H, W) in [0, 1] as uint8 levels on the model's device."""
        return quantize_images(torch.as_tensor(obs, dtype=torch.float32, device=self.conv[0].weight.device))

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
        if self.embedding is not None:
            x = torch.relu(self.embedding(x))
        return x.view(b, q, -1)


class VectorEncoder(nn.Module):
    """Linear + ReLU from the observation vector (F,) to D (the vector as it is without ``embed_dim``: D = F)."""

    storage_dtype = torch.float32

    def __init__(self, observation_shape: tuple[int], embed_dim: int | None) -> None:
        super().__init__()
        self.observation_shape = tuple(observation_shape)
        self.embedding = None if embed_dim is None else orthogonal(nn.Linear(observation_shape[0], embed_dim), np.sqrt(2))
        self.output_dim = observation_shape[0] if embed_dim is None else embed_dim
        self.register_buffer("_device", torch.zeros(0), persistent=False)  # where prepare puts observations

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment vectors (..., F) as float32 on the model's device."""
        return torch.as_tensor(obs, dtype=torch.float32, device=self._device.device)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, Q, F) -> (B, Q, D)."""
        return obs if self.embedding is None else torch.relu(self.embedding(obs))


def make_encoder(observation_shape: tuple[int, ...], embed_dim: int | None) -> nn.Module:
    """The encoder for an observation shape: (C, H, W) images or (F,) vectors; ``embed_dim`` None: raw features."""
    if len(observation_shape) == 3:
        return ImageEncoder(observation_shape, embed_dim)
    if len(observation_shape) == 1:
        return VectorEncoder(observation_shape, embed_dim)
    raise ValueError(f"observation shape {tuple(observation_shape)} is neither an image (C, H, W) nor a vector (F,)")


class ImageDecoder(nn.Module):
    """Features (..., D) -> logits of an image (..., C, H, W): the encoder's convolutions mirrored (observation
    reconstruction, as CleanRL's ppo_trxl: Linear + ReLU to the last convolution's map, then transposed convolutions
    64x3/1, 32x4/2 and Cx8/4 with ReLU between them; a sigmoid of the logits is the reconstructed image)."""

    def __init__(self, observation_shape: tuple[int, int, int], in_dim: int) -> None:
        super().__init__()
        channels, height, width = observation_shape
        sizes = [(height, width)]  # the spatial size before each encoder convolution, and after the last
        for kernel, stride in ((8, 4), (4, 2), (3, 1)):
            h, w = sizes[-1]
            sizes.append(((h - kernel) // stride + 1, (w - kernel) // stride + 1))
        self.map_shape = (64, *sizes[-1])

        def up(c_in: int, c_out: int, kernel: int, stride: int, target: tuple[int, int]) -> nn.Module:
            # output_padding restores the rows and columns that the encoder's stride dropped
            padding = tuple((size - kernel) % stride for size in target)
            return orthogonal(nn.ConvTranspose2d(c_in, c_out, kernel, stride, output_padding=padding), np.sqrt(2))

        self.linear = orthogonal(nn.Linear(in_dim, int(np.prod(self.map_shape))), np.sqrt(2))
        self.deconv = nn.Sequential(
            up(64, 64, 3, 1, sizes[2]),
            nn.ReLU(inplace=True),
            up(64, 32, 4, 2, sizes[1]),
            nn.ReLU(inplace=True),
            up(32, channels, 8, 4, sizes[0]),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lead = features.shape[:-1]
        x = torch.relu(self.linear(features.reshape(-1, features.shape[-1]))).view(-1, *self.map_shape)
        x = self.deconv(x)
        return x.view(*lead, *x.shape[1:])

    @staticmethod
    def loss(logits: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy of the reconstruction against the images (..., C, H, W) in [0, 1] (or uint8 levels),
        averaged over the pixels (CleanRL's BCELoss on sigmoid outputs, computed from the logits for stability)."""
        return F.binary_cross_entropy_with_logits(logits, dequantize_images(obs))


class VectorDecoder(nn.Module):
    """Features (..., D) -> the observation vector (..., F), one linear layer; mean squared error as its loss."""

    def __init__(self, observation_shape: tuple[int], in_dim: int) -> None:
        super().__init__()
        self.linear = orthogonal(nn.Linear(in_dim, observation_shape[0]), 1.0)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)

    @staticmethod
    def loss(prediction: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(prediction, obs)


def make_decoder(observation_shape: tuple[int, ...], in_dim: int) -> nn.Module:
    """The observation decoder for an observation shape (``reconstruction_coefficient`` > 0)."""
    if len(observation_shape) == 3:
        return ImageDecoder(observation_shape, in_dim)
    if len(observation_shape) == 1:
        return VectorDecoder(observation_shape, in_dim)
    raise ValueError(f"observation shape {tuple(observation_shape)} is neither an image (C, H, W) nor a vector (F,)")
