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


def channels_last_levels(levels: torch.Tensor) -> torch.Tensor:
    """Images (..., C, H, W) with the same shape and values, laid out in memory as (..., H, W, C): channels last.

    The CPU's convolution kernels take images channels-last, so every convolution of channels-first images reorders
    them first. For uint8 images of 3 channels that reorder is a slow copy (about 1.2 GB/s on the development CPU: a
    32 x 512 minibatch of 2048 84x84 images took 35-50 ms, made in forward and again in backward). Images are laid
    out this way once, when a rollout step prepares them; the buffer keeps the layout (``Buffer``), and picking a
    minibatch's steps by their leading indices keeps it too, so the convolutions reorder nothing in training
    (docs/performance.md, "Images stored channels-last").
    """
    return levels.movedim(-3, -1).contiguous().movedim(-1, -3)


def check_batch_shape(obs: np.ndarray | torch.Tensor, observation_shape: tuple[int, ...]) -> None:
    """Raises ValueError unless observations (..., *observation_shape) end in the shape the encoder was built for: a
    batch of another width would otherwise pass ``prepare`` and fail later as a bare shape error inside the model, or
    not at all where a reshape happens to fit."""
    shape = tuple(obs.shape)
    if len(shape) < len(observation_shape) or shape[len(shape) - len(observation_shape) :] != observation_shape:
        raise ValueError(
            f"observations of shape {shape} do not fit the model, which was built for observations of shape "
            f"{observation_shape} (batches (..., {', '.join(map(str, observation_shape))})); use the environment and "
            "config the model was trained with"
        )


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
    def forward(
        ctx, levels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int = 0
    ) -> torch.Tensor:
        ctx.save_for_backward(levels, weight)
        ctx.stride, ctx.padding = stride, padding
        ctx.dtype = _autocast_dtype(levels.device.type)
        return F.conv2d(_channels_last_floats(levels, ctx.dtype), weight / 255, bias, stride, padding)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor | None, torch.Tensor | None, None, None]:
        levels, weight = ctx.saved_tensors
        stride, padding = ctx.stride, ctx.padding
        # In the forward's dtype, as autocast runs every other convolution's backward (bfloat16 with compute_dtype
        # bfloat16); the gradients are returned in the parameters' float32.
        _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad.to(ctx.dtype), _channels_last_floats(levels, ctx.dtype), (weight / 255).to(ctx.dtype),
            [weight.shape[0]], [stride, stride], [padding, padding], [1, 1], False, [0, 0], 1,
            [False, ctx.needs_input_grad[1], ctx.needs_input_grad[2]],
        )  # fmt: skip
        grad_weight = None if grad_weight is None else grad_weight.float() / 255
        return None, grad_weight, None if grad_bias is None else grad_bias.float(), None, None


def _channels_last_floats(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, C, H, W) images as ``dtype`` in channels-last memory order.

    uint8 levels are reordered first, a quarter of the bytes, and converted after, a plain elementwise copy; levels
    the encoder prepared are channels-last already (``channels_last_levels``), so they are only converted. The levels
    0-255 are exact in bfloat16 and float16 too, so under autocast they go straight to its dtype and the convolution's
    input is not cast a second time (docs/performance.md).
    """
    if images.dtype == torch.uint8:
        return images.contiguous(memory_format=torch.channels_last).to(dtype)
    return images.to(dtype=dtype, memory_format=torch.channels_last)


def _autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast computes convolutions in on ``device_type`` (float32 where it is off)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32


# (out channels, kernel, stride, padding) of the image encoder's convolutions: the reference's (the Nature DQN's) for
# images of at least 36 pixels a side, and 3x3 convolutions with padding for smaller ones, which the 8x8/4 kernels
# would shrink to nothing (any size from 1 pixel; a 12x12 image ends as 64 x 6 x 6 features).
NATURE_LAYERS = ((32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0))
SMALL_LAYERS = ((32, 3, 1, 1), (64, 3, 2, 1), (64, 3, 1, 1))
SMALL_IMAGE = 36  # sides below this get SMALL_LAYERS
# Images the convolutions take at a time: a minibatch of 2048 84x84 RGB images (32 x 512 Mortar Mayhem Grid) would
# otherwise need its float copy (170 MB, made in forward and again in backward) whole at once; a chunk's is a quarter.
IMAGE_CHUNK = 512


def conv_layers(height: int, width: int) -> tuple[tuple[int, int, int, int], ...]:
    """The convolutions for images of this size (``NATURE_LAYERS`` or ``SMALL_LAYERS``)."""
    return NATURE_LAYERS if min(height, width) >= SMALL_IMAGE else SMALL_LAYERS


class ImageEncoder(nn.Module):
    """The reference's convolutions (32x8/4, 64x4/2, 64x3/1, ReLU after each; 3x3 ones for images smaller than 36
    pixels, see ``conv_layers``), then Linear + ReLU to D (none without ``embed_dim``: D is then the flattened
    convolution output).

    Images arrive as uint8 levels (``prepare``), a quarter of float32's memory in the buffer; float images in [0, 1]
    are accepted too.
    """

    storage_dtype = torch.uint8

    def __init__(self, observation_shape: tuple[int, int, int], embed_dim: int | None) -> None:
        super().__init__()
        self.observation_shape = tuple(observation_shape)
        # In-place ReLUs: a convolution's output is not needed for its backward, so the minibatch keeps one copy of
        # each activation instead of two.
        layers, channels = [], observation_shape[0]
        for out, kernel, stride, padding in conv_layers(*observation_shape[1:]):
            layers += [orthogonal(nn.Conv2d(channels, out, kernel, stride, padding), np.sqrt(2)), nn.ReLU(inplace=True)]
            channels = out
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            features = self.conv(torch.zeros(1, *observation_shape)).shape[1]
        self.embedding = None if embed_dim is None else orthogonal(nn.Linear(features, embed_dim), np.sqrt(2))
        self.output_dim = features if embed_dim is None else embed_dim

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment images (..., C, H, W) in [0, 1] as uint8 levels on the model's device, laid out channels-last
        (``channels_last_levels``): quantised on the host, so that a GPU receives a quarter of the bytes float32 would
        take."""
        check_batch_shape(obs, self.observation_shape)
        levels = channels_last_levels(quantize_images(torch.as_tensor(obs, dtype=torch.float32)))
        return levels.to(self.conv[0].weight.device, non_blocking=True)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, Q, C, H, W) uint8 levels or floats in [0, 1] -> (B, Q, D)."""
        b, q = obs.shape[:2]
        x = obs.reshape(b * q, *self.observation_shape)
        if len(x) > IMAGE_CHUNK:  # the convolutions of a large minibatch, a chunk of images at a time
            x = torch.cat([self.features(chunk) for chunk in x.split(IMAGE_CHUNK)])
        else:
            x = self.features(x)
        if self.embedding is not None:
            x = torch.relu(self.embedding(x))
        return x.view(b, q, -1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images -> (N, F) flattened convolution features."""
        first = self.conv[0]
        if x.dtype == torch.uint8:
            x = _ConvOnLevels.apply(x, first.weight, first.bias, first.stride[0], first.padding[0])
        else:
            x = first(_channels_last_floats(x))
        return self.conv[1:](x)  # channels-last activations from here on, flattened in (C, H, W) order


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
        check_batch_shape(obs, self.observation_shape)
        return torch.as_tensor(obs, dtype=torch.float32, device=self._device.device)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, Q, F) -> (B, Q, D)."""
        return obs if self.embedding is None else torch.relu(self.embedding(obs))


class DictEncoder(nn.Module):
    """Dict observations: each key's own encoder (images: the convolutions, then their own Linear + ReLU to D; vectors:
    as they are), the features concatenated in key order, then Linear + ReLU to D. Without ``embed_dim`` (the
    recurrent memories) images keep their raw convolution features and the concatenation is the output.

    Images are embedded before they meet the vectors because their raw features outnumber a vector's hundreds of times
    (64 x 4 x 4 = 1024 for an 8x8 image beside a 3-vector): concatenated raw, flipping a cue in the vector moved the
    token by 0.32-0.66 of its norm (1.07-1.26 embedded first), and the Dict cue task of tests/cue_task.py failed on 3 of
    6 seeds with configs/poc_memory_env.yaml's settings; embedded first, it solved all 6
    (results/ablations/dict-cue/README.md).
    """

    def __init__(self, observation_shape: dict[str, tuple[int, ...]], embed_dim: int | None) -> None:
        super().__init__()
        self.keys = sorted(observation_shape)
        embed = {key: embed_dim if len(observation_shape[key]) == 3 else None for key in self.keys}  # images only
        self.parts = nn.ModuleDict({key: make_encoder(observation_shape[key], embed[key]) for key in self.keys})
        features = sum(part.output_dim for part in self.parts.values())
        self.embedding = None if embed_dim is None else orthogonal(nn.Linear(features, embed_dim), np.sqrt(2))
        self.output_dim = features if embed_dim is None else embed_dim

    @property
    def storage_dtype(self) -> dict[str, torch.dtype]:
        return {key: self.parts[key].storage_dtype for key in self.keys}

    def prepare(self, obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Each key's observations as its encoder keeps them (uint8 levels for images)."""
        missing = [key for key in self.keys if key not in obs]
        if missing:
            raise ValueError(f"the observation lacks the key(s) {missing}; the model was built for {self.keys}")
        extra = sorted(set(obs) - set(self.keys))
        if extra:  # refused rather than dropped: a part of the observation the model would never see
            raise ValueError(f"the observation has the key(s) {extra}, which the model was not built for ({self.keys})")
        prepared = {}
        for key in self.keys:
            try:
                prepared[key] = self.parts[key].prepare(obs[key])
            except ValueError as error:
                raise ValueError(f"key {key!r}: {error}") from None
        return prepared

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """{key: (B, Q, *shape)} -> (B, Q, D)."""
        x = torch.cat([self.parts[key](obs[key]) for key in self.keys], dim=-1)
        return x if self.embedding is None else torch.relu(self.embedding(x))


def observation_kind(observation_shape: tuple[int, ...] | dict) -> str:
    """ "dict", "image" (C, H, W) or "vector" (F,): which encoder and decoder an observation shape gets."""
    if isinstance(observation_shape, dict):
        return "dict"
    if len(observation_shape) == 3:
        return "image"
    if len(observation_shape) == 1:
        return "vector"
    raise ValueError(f"observation shape {tuple(observation_shape)} is neither an image (C, H, W) nor a vector (F,)")


def make_encoder(observation_shape: tuple[int, ...] | dict, embed_dim: int | None) -> nn.Module:
    """The encoder for an observation shape: (C, H, W) images, (F,) vectors or a dict of them; ``embed_dim`` None: raw
    features."""
    kinds = {"dict": DictEncoder, "image": ImageEncoder, "vector": VectorEncoder}
    return kinds[observation_kind(observation_shape)](observation_shape, embed_dim)


class ImageDecoder(nn.Module):
    """Features (..., D) -> logits of an image (..., C, H, W): the encoder's convolutions mirrored (observation
    reconstruction, as CleanRL's ppo_trxl: Linear + ReLU to the last convolution's map, then transposed convolutions
    64x3/1, 32x4/2 and Cx8/4 with ReLU between them, or the mirror of the small-image convolutions; a sigmoid of the
    logits is the reconstructed image)."""

    def __init__(self, observation_shape: tuple[int, int, int], in_dim: int) -> None:
        super().__init__()
        channels, height, width = observation_shape
        layers = conv_layers(height, width)
        sizes = [(height, width)]  # the spatial size before each encoder convolution, and after the last
        for _, kernel, stride, padding in layers:
            sizes.append(tuple((side + 2 * padding - kernel) // stride + 1 for side in sizes[-1]))
        self.map_shape = (layers[-1][0], *sizes[-1])
        deconv = []
        for i in reversed(range(len(layers))):  # each encoder convolution mirrored, the last one first
            _, kernel, stride, padding = layers[i]
            c_in, c_out = layers[i][0], layers[i - 1][0] if i > 0 else channels
            # output_padding restores the rows and columns that the encoder's stride dropped
            made = tuple((side - 1) * stride - 2 * padding + kernel for side in sizes[i + 1])
            extra = tuple(target - side for target, side in zip(sizes[i], made, strict=True))
            deconv.append(orthogonal(nn.ConvTranspose2d(c_in, c_out, kernel, stride, padding, extra), np.sqrt(2)))
            if i > 0:
                deconv.append(nn.ReLU(inplace=True))
        self.linear = orthogonal(nn.Linear(in_dim, int(np.prod(self.map_shape))), np.sqrt(2))
        self.deconv = nn.Sequential(*deconv)

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


class DictDecoder(nn.Module):
    """Dict observations: each key reconstructed by its own decoder from the same features; the loss is the sum of the
    keys' losses."""

    def __init__(self, observation_shape: dict[str, tuple[int, ...]], in_dim: int) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({key: make_decoder(observation_shape[key], in_dim) for key in sorted(observation_shape)})

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: part(features) for key, part in self.parts.items()}

    def loss(self, prediction: dict[str, torch.Tensor], obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(part.loss(prediction[key], obs[key]) for key, part in self.parts.items())


def make_decoder(observation_shape: tuple[int, ...] | dict, in_dim: int) -> nn.Module:
    """The observation decoder for an observation shape (``reconstruction_coefficient`` > 0)."""
    kinds = {"dict": DictDecoder, "image": ImageDecoder, "vector": VectorDecoder}
    return kinds[observation_kind(observation_shape)](observation_shape, in_dim)
