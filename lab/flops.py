"""The model's arithmetic per environment step, counted from the config (lab/benchmark.py's JSON).

Only the matrix products and convolutions are counted (2 FLOP per multiply-add); norms, activations, softmax and the
optimizer are left out, as torch's FlopCounterMode leaves them out. One environment step costs:

- rollout: one forward pass of the model for that step. With the TrXL memory as its fast path computes it: the
  step's query attends to ``memory_length`` L memory slots (scores and weighted sum, 4 L D), and the step's own memory
  token is projected to keys and values once (when the step is remembered), not again at every later step;
- training: ``epochs`` forward + backward passes, each taken as 3 forward passes (the backward computes the
  gradients of both the inputs and the weights of every product).

The count is the model's own arithmetic, not what one path's kernels do: training chunks project the L slots carried
in before each chunk again, and the banded attention computes masked scores too (FlopCounterMode, the benchmark's
``mflop_per_step``, counts those); the reconstruction decoder is not counted.
"""

from __future__ import annotations

import numpy as np

import observations
from config import Config
from encoders import conv_layers, observation_kind
from environments.action_spec import ActionSpec
from memories import memory_input_dim

BACKWARD_FACTOR = 3  # a forward + backward pass, in forward passes


def encoder_flops(observation_shape: observations.Shape, embed_dim: int | None) -> tuple[int, int]:
    """FLOPs of encoding one observation, and the width of the encoding (the raw features without ``embed_dim``)."""
    kind = observation_kind(observation_shape)
    if kind == "dict":
        parts = [encoder_flops(observation_shape[key], None) for key in sorted(observation_shape)]
        flops, features = sum(part[0] for part in parts), sum(part[1] for part in parts)
    elif kind == "image":
        channels, height, width = observation_shape
        flops = 0
        for out, kernel, stride, padding in conv_layers(height, width):
            height, width = ((side + 2 * padding - kernel) // stride + 1 for side in (height, width))
            flops += 2 * out * channels * kernel * kernel * height * width
            channels = out
        features = channels * height * width
    else:
        flops, features = 0, observation_shape[0]
    if embed_dim is None:
        return flops, features
    return flops + 2 * features * embed_dim, embed_dim


def memory_flops(config: Config, input_dim: int) -> tuple[int, int]:
    """FLOPs of one step of the memory (TrXL: as the fast path's rollout computes it), and the width it gives the
    heads."""
    if config.memory == "trxl":
        t = config.transformer
        d, length = t.embed_dim, t.memory_length
        per_block = 2 * d * d + 4 * d * d + 4 * length * d + 2 * d * d + 2 * d * d  # query, keys+values, attention, out, ff
        if t.gtrxl:
            per_block += 2 * (6 + 4 + 2) * d * d  # two GRU gates: W (D -> 3D), U_rz (D -> 2D), U_g (D -> D)
        return 2 * d * d + t.num_blocks * per_block, d  # the input embedding, then the blocks
    if config.memory == "none":
        return 0, input_dim
    size, gates = config.recurrence.hidden_state_size, 3 if config.memory == "gru" else 4
    flops, width = 0, input_dim
    for _ in range(config.recurrence.num_layers):
        flops += 2 * gates * size * (width + size)
        width = size
    return flops + 2 * size * config.hidden_layer_size, config.hidden_layer_size  # then Linear(H, F)


def head_flops(actions: ActionSpec, dim: int, hidden: int) -> int:
    """FLOPs of the policy and value heads on one step's features (D,)."""
    outputs = actions.width if actions.continuous else sum(actions.counts)
    policy = 2 * dim * hidden + 2 * hidden * outputs
    value = 2 * dim * hidden + 2 * hidden
    return policy + value


def model_flops(config: Config, observation_shape: observations.Shape, actions: ActionSpec | list[int]) -> dict[str, int]:
    """FLOPs per environment step: ``forward`` (one step's forward pass), ``rollout``, ``train`` and ``total``."""
    observation_shape = observations.normalize_shape(observation_shape)
    encoder, width = encoder_flops(observation_shape, memory_input_dim(config))
    memory, dim = memory_flops(config, width)
    forward = encoder + memory + head_flops(ActionSpec.coerce(actions), dim, config.hidden_layer_size)
    train = config.epochs * BACKWARD_FACTOR * forward
    return {"forward": forward, "rollout": forward, "train": train, "total": forward + train}


def share_of_rate(flops_per_step: float, steps_per_second: float, gflops: float | None) -> float | None:
    """The share of a matrix-product rate (GFLOP/s) that ``flops_per_step`` at ``steps_per_second`` reaches."""
    if not gflops:
        return None
    return float(np.float64(flops_per_step) * steps_per_second / (gflops * 1e9))
