"""The actor-critic: observation encoder -> episodic memory transformer -> policy and value heads.

Shapes (legend as in buffer.py): B batch rows, Q query steps per row, S memory slots per row,
K blocks, D embed dim, A action dimensions (1 for Discrete, len(nvec) for MultiDiscrete).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical
from torch.nn import functional as F

from config import Config
from transformer import Transformer


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


class ModelOutput(NamedTuple):
    """What one forward pass gives, for B rows of Q query steps."""

    logits: list[torch.Tensor]  # per action dimension, (B, Q, n_actions_a)
    value: torch.Tensor  # (B, Q)
    tokens: torch.Tensor  # (B, Q, K, D) new memory tokens (the block inputs) of these steps
    attention: list[torch.Tensor] | None  # per block (B, H, Q, S), only when asked for


def _orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ActorCriticModel(nn.Module):
    """Encoder, transformer memory and heads, faithful to the reference implementation."""

    def __init__(self, config: Config, observation_shape: tuple[int, ...], action_dims: list[int]) -> None:
        """Build the model.

        Args:
            config: the training config (uses ``transformer`` and ``hidden_layer_size``).
            observation_shape: (C, H, W) images with values in [0, 1], or (F,) vectors.
            action_dims: number of actions of each action dimension.
        """
        super().__init__()
        dim = config.transformer.embed_dim
        hidden = config.hidden_layer_size
        self.observation_shape = tuple(observation_shape)
        self.action_dims = list(action_dims)
        if len(observation_shape) == 3:
            # In-place ReLUs: a convolution's output is not needed for its backward, so the minibatch keeps one copy of
            # each activation instead of two.
            self.conv = nn.Sequential(
                _orthogonal(nn.Conv2d(observation_shape[0], 32, 8, stride=4), np.sqrt(2)),
                nn.ReLU(inplace=True),
                _orthogonal(nn.Conv2d(32, 64, 4, stride=2), np.sqrt(2)),
                nn.ReLU(inplace=True),
                _orthogonal(nn.Conv2d(64, 64, 3, stride=1), np.sqrt(2)),
                nn.ReLU(inplace=True),
                nn.Flatten(),
            )
            with torch.no_grad():
                features = self.conv(torch.zeros(1, *observation_shape)).shape[1]
        elif len(observation_shape) == 1:
            self.conv = None
            features = observation_shape[0]
        else:
            raise ValueError(f"observation shape {observation_shape} is neither an image (C, H, W) nor a vector (F,)")
        self.embedding = _orthogonal(nn.Linear(features, dim), np.sqrt(2))
        self.transformer = Transformer(config.transformer)
        self.policy_hidden = _orthogonal(nn.Linear(dim, hidden), np.sqrt(2))
        self.policy_branches = nn.ModuleList([_orthogonal(nn.Linear(hidden, n), 0.01) for n in action_dims])
        self.value_hidden = _orthogonal(nn.Linear(dim, hidden), np.sqrt(2))
        self.value_head = _orthogonal(nn.Linear(hidden, 1), 1.0)

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment observations (..., *obs_shape) as the model takes them, on its device: images as uint8 levels
        (also how the buffer stores them), vectors as float32."""
        tensor = torch.as_tensor(obs, dtype=torch.float32, device=self.embedding.weight.device)
        return quantize_images(tensor) if self.conv is not None else tensor

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Embed observations (B, Q, *obs_shape) into tokens (B, Q, D); images as uint8 levels or floats in [0, 1]."""
        b, q = obs.shape[:2]
        x = obs.reshape(b * q, *self.observation_shape)
        if self.conv is not None:
            first = self.conv[0]
            if x.dtype == torch.uint8:
                x = _ConvOnLevels.apply(x, first.weight, first.bias, first.stride[0])
            else:
                x = first(_channels_last_floats(x))
            x = self.conv[1:](x)  # channels-last activations from here on, flattened in (C, H, W) order
        return torch.relu(self.embedding(x)).view(b, q, -1)

    def forward(
        self,
        obs: torch.Tensor,
        keys_values: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        return_attention: bool = False,
    ) -> ModelOutput:
        """Policy logits, values and new memory tokens of B rows of Q steps.

        Args:
            obs: (B, Q, *obs_shape) observations.
            keys_values: per block (k, v), each (B, H, S, d), from ``project_memory`` or a rollout cache.
            mask: (B, Q, S) True where a query step may attend to a memory slot.
            return_attention: also return the attention weights.
        """
        h, tokens, attention = self.transformer(self.encode(obs), keys_values, mask, return_attention)
        return self._heads(h, tokens, attention)

    def forward_chunk(self, obs: torch.Tensor, memory: torch.Tensor, steps: torch.Tensor, mask: torch.Tensor) -> ModelOutput:
        """Training on chunks with gradients into the memory (``transformer.memory_gradients``).

        Args:
            obs: (B, C, *obs_shape) C consecutive steps per row.
            memory: (B, S, K, D) the chunk's trace slots, S = C + L - 1: the L tokens carried in from before the
                chunk, then the tokens of chunk steps 0 .. C - 2, which this pass replaces by its own block inputs.
            steps: (B, S) episode step of each slot.
            mask: (B, C, S) True where a step may attend to a slot (band_mask).
        """
        h, tokens = self.transformer.forward_chunk(self.encode(obs), memory, steps, mask)
        return self._heads(h, tokens, None)

    def _heads(self, h: torch.Tensor, tokens: torch.Tensor, attention: list[torch.Tensor] | None) -> ModelOutput:
        policy = torch.relu(self.policy_hidden(h))
        logits = [branch(policy) for branch in self.policy_branches]
        value = self.value_head(torch.relu(self.value_hidden(h))).squeeze(-1)
        return ModelOutput(logits, value, tokens, attention)

    def project_memory(self, memory: torch.Tensor, steps: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of memory tokens (B, S, K, D) at episode steps (B, S); see Transformer.project_memory."""
        return self.transformer.project_memory(memory, steps)

    def forward_windows(
        self,
        obs: torch.Tensor,
        memory: torch.Tensor,
        steps: torch.Tensor,
        visible: torch.Tensor,
        return_attention: bool = False,
    ) -> ModelOutput:
        """The plain path, the executable specification: each step projects its own memory window.

        Args:
            obs: (B, *obs_shape) one observation per row.
            memory: (B, L, K, D) the row's memory window.
            steps: (B, L) episode step of each window slot.
            visible: (B, L) True for the slots of the same episode before this step.
        """
        return self(obs.unsqueeze(1), self.project_memory(memory, steps), visible.unsqueeze(1), return_attention)


def distributions(logits: list[torch.Tensor]) -> list[Categorical]:
    """One Categorical per action dimension."""
    # No argument validation: it checks every logit for NaN on each call, a cost on the rollout's hot path, and
    # non-finite values are caught where they start (NonFiniteError on the loss and the gradients).
    return [Categorical(logits=branch, validate_args=False) for branch in logits]


def sample_actions(
    logits: list[torch.Tensor], deterministic: bool = False, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample actions (..., A) and their joint log-probability (...) from per-dimension logits (..., n_a)."""
    if deterministic:
        actions = [branch.argmax(dim=-1) for branch in logits]
    else:
        actions = [
            torch.multinomial(branch.softmax(dim=-1).reshape(-1, branch.shape[-1]), 1, generator=generator).view(
                branch.shape[:-1]
            )
            for branch in logits
        ]
    actions = torch.stack(actions, dim=-1)
    return actions, log_prob(distributions(logits), actions)


def log_prob(dists: list[Categorical], actions: torch.Tensor) -> torch.Tensor:
    """Joint log-probability (...) of actions (..., A) under independent per-dimension distributions."""
    return sum(dist.log_prob(actions[..., a]) for a, dist in enumerate(dists))


def entropy(dists: list[Categorical]) -> torch.Tensor:
    """Summed entropy (...) of the per-dimension distributions."""
    return sum(dist.entropy() for dist in dists)
