"""The actor-critic: observation encoder -> memory -> policy and value heads, each a seam of its own.

Shapes (legend as in buffer.py): N workers, B chunks, C steps per chunk, A action dimensions; B rows of Q single
steps for minibatches of single steps.

- encoders.py: one observation becomes one token (images: the reference's CNN; vectors: a linear layer);
- memories/: the memory interface (memories/base.py); memories/trxl.py the episodic TrXL/GTrXL memory,
  memories/recurrent.py GRU, LSTM and no memory, chosen by the config's ``memory`` (memories/__init__.py);
- heads.py: the action distribution chosen from the action space, and the value head.

The model has the entry points the memory has: ``step`` for one step per worker (rollouts, evaluation), ``forward``
for minibatches of sequence chunks and ``forward_steps`` for minibatches of single steps (training).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

import observations
from config import Config
from encoders import make_decoder, make_encoder
from environments.action_spec import ActionSpec
from heads import DiagonalGaussian, MultiCategorical, ValueHead, make_policy_head
from memories import make_memory, memory_input_dim
from memories.base import MemoryOutput, MemoryState
from normalization import VectorNormalizers

# Which compute dtype runs where: ``compute_dtype: bfloat16`` pays only on hardware with bfloat16 matrix units. A GPU
# runs bfloat16 as asked. A CPU computes bfloat16 matrix products fast only with AMX (``amx_bf16``) or AVX-512 BF16
# (``avx512_bf16``) on x86, or the BF16 extension (``bf16``) on Arm; without them oneDNN emulates bfloat16 with float32
# instructions and conversions, slower than float32 itself. There the run computes in float32 instead and says so
# once. ``compute_dtype_for`` decides from the detection result (``cpu_bfloat16_units``), so both branches are
# testable on any machine.

BFLOAT16_UNITS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512 BF16, Arm BF16 (/proc/cpuinfo's names)


def cpu_bfloat16_units() -> list[str]:
    """This CPU's bfloat16 matrix units, by their /proc/cpuinfo flag names (empty: none). Without /proc/cpuinfo (not
    Linux), torch's own cpuinfo checks for AMX tiles and AVX-512 BF16."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith(("flags", "Features"))), [])
        return [unit for unit in BFLOAT16_UNITS if unit in flags]
    except OSError:
        found = {"amx_bf16": torch.cpu._is_amx_tile_supported(), "avx512_bf16": torch.cpu._is_avx512_bf16_supported()}
        return [unit for unit, present in found.items() if present]


def compute_dtype_for(requested: str, device_type: str, cpu_units: list[str]) -> tuple[str, str | None]:
    """The compute dtype that runs on ``device_type`` for the config's ``compute_dtype``, and a message when it is not
    the requested one: bfloat16 on a CPU without bfloat16 matrix units (``cpu_units`` empty) runs as float32."""
    if requested != "bfloat16" or device_type != "cpu" or cpu_units:
        return requested, None
    return "float32", (
        "compute_dtype: bfloat16 asked for, but this CPU has no bfloat16 matrix unit (no amx_bf16 (AMX) nor "
        "avx512_bf16 (AVX-512 BF16) among its flags, nor Arm's bf16): bfloat16 would be emulated, slower than "
        "float32, so the model computes in float32"
    )


def runnable_compute_dtype(requested: str, device: torch.device, say: bool = True) -> str:
    """The compute dtype a model on ``device`` runs with (``compute_dtype_for`` on this machine); with ``say`` prints
    the message when it differs from ``requested``."""
    dtype, message = compute_dtype_for(requested, device.type, cpu_bfloat16_units() if device.type == "cpu" else [])
    if message and say:
        print(message, flush=True)
    return dtype


def bfloat16_is_fast(device: torch.device) -> bool:
    """Whether ``device`` has bfloat16 matrix units (a CPU: ``cpu_bfloat16_units``; CUDA: torch's check)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(cpu_bfloat16_units())


class PolicyOutput(NamedTuple):
    """What the model gives for some steps."""

    policy: MultiCategorical | DiagonalGaussian  # action distribution over (..., A) actions
    value: torch.Tensor  # (...)
    record: object  # the memory's record of these steps (for the trace)
    attention: list[torch.Tensor] | None  # the memory's attention weights, when asked for
    features: torch.Tensor | None = None  # (..., D) the memory's output, the heads' input (training only)


class ActorCriticModel(nn.Module):
    """Encoder, memory and heads, faithful to the reference implementation."""

    def __init__(
        self,
        config: Config,
        observation_shape: observations.Shape,
        actions: ActionSpec | list[int],
        memory_path: str = "fast",
        compute_dtype: str | None = None,
    ) -> None:
        """Build the model.

        Args:
            config: the training config (uses ``memory`` and its section, ``memory_dtype`` and ``hidden_layer_size``).
            observation_shape: (C, H, W) images with values in [0, 1], (F,) vectors, or a dict of them by key.
            actions: the action space (``heads.ActionSpec``), or the number of actions of each action dimension.
            memory_path: "fast" or "plain" (see memories/trxl.py); the weights are the same either way.
            compute_dtype: the dtype the encoder and the memory compute in, "float32" or "bfloat16"; None: the
                config's. ``runnable_compute_dtype`` says which of them runs on a device.
        """
        super().__init__()
        self.observation_shape = observations.normalize_shape(observation_shape)
        self.actions = ActionSpec.coerce(actions)
        self.action_dims = list(self.actions.counts)  # Discrete / MultiDiscrete; empty for continuous actions
        # Running statistics of vector observations (normalization.py), applied before the encoder; None when off.
        self.normalizer = (
            VectorNormalizers(self.observation_shape, config.normalize_clip, config.normalize_skip_keys)
            if config.normalize_observations
            else None
        )
        self.encoder = make_encoder(self.observation_shape, memory_input_dim(config))
        self.memory = make_memory(config, self.encoder.output_dim, memory_path)
        dim = self.memory.output_dim
        self.policy = make_policy_head(self.actions, dim, config.hidden_layer_size, config.clipped_log_prob)
        self.value = ValueHead(dim, config.hidden_layer_size)
        self.value_trains_memory = config.value_trains_memory
        # Observation reconstruction (Memory Gym paper; CleanRL's reconstruction_coef): only built when it is trained.
        self.decoder = make_decoder(self.observation_shape, dim) if config.reconstruction_coefficient > 0 else None
        self.compute_dtype = compute_dtype or config.compute_dtype
        self.bfloat16 = self.compute_dtype == "bfloat16"
        self.memory.autocast = self.autocast

    def compile_modules(self) -> None:
        """Compiles the encoder, the memory's compilable modules (TrXL: the blocks) and the heads in place with
        torch.compile, for any batch size (``dynamic=True``); weights and state_dict keys stay as they are. Each
        module compiles on its first call with a new kind of input, so the first update takes longer."""
        for module in (self.encoder, *self.memory.compilable(), self.policy, self.value):
            module.compile(dynamic=True)

    def autocast(self) -> torch.autocast:
        """The context the encoder and the memory run in: bfloat16 matrix products with ``compute_dtype: bfloat16``
        (torch.autocast on the parameters' device), else a context that changes nothing. The heads and the decoder
        run outside it, in float32, on the memory's output cast back to float32."""
        device_type = next(self.parameters()).device.type
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.bfloat16)

    @contextlib.contextmanager
    def fixed_weights(self) -> Iterator[None]:
        """The context of a run of steps at weights that do not change inside it (a rollout, an evaluation).

        With ``compute_dtype: bfloat16`` the weights and biases of the encoder's and the memory's linear and
        convolution layers are bfloat16 copies inside it, made once on entry from the float32 weights (which the
        optimizer keeps and which are back on exit): autocast would cast every one of them again at every step, since
        its cache lives only as long as one ``autocast()`` region. The products are the ones autocast computes, with
        the same bfloat16 weights; the layer norms, the gates' biases, the positional table, the recurrent layers
        and the heads keep their float32 weights, as under autocast. Nothing changes with float32 compute.
        """
        if not self.bfloat16:
            yield
            return
        kept = [
            (module, name, getattr(module, name))
            for part in (self.encoder, self.memory)
            for module in part.modules()
            if isinstance(module, nn.Linear | nn.Conv2d)
            for name in ("weight", "bias")
            if getattr(module, name) is not None
        ]
        try:
            for module, name, weight in kept:
                setattr(module, name, nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False))
            yield
        finally:
            for module, name, weight in kept:
                setattr(module, name, weight)

    @property
    def storage_dtype(self) -> torch.dtype | dict[str, torch.dtype]:
        """The dtype of observations as ``prepare`` makes them (uint8 levels for images; per key for dicts)."""
        return self.encoder.storage_dtype

    def prepare(self, obs: np.ndarray) -> torch.Tensor:
        """Environment observations (..., *obs_shape) as the model takes them, on its device (also how the buffer
        stores them)."""
        return self.encoder.prepare(obs)

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations (..., *obs_shape) as the encoder sees them: with ``normalize_observations`` their vectors
        normalised by the running statistics (normalization.py), else as they are. Also the target of the
        reconstruction loss (ppo.py)."""
        return obs if self.normalizer is None else self.normalizer(obs)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations (B, Q, *obs_shape) (``normalized`` first) -> tokens (B, Q, D)."""
        return self.encoder(self.normalized(obs))

    def step(
        self, obs: torch.Tensor, state: MemoryState, index: torch.Tensor | None = None, return_attention: bool = False
    ) -> PolicyOutput:
        """Policy and value (n,) of the current step of workers ``index`` (all), observations (n, *obs_shape).

        Leaves ``state`` as it is (bootstrap values only look); ``act`` is the step that is taken and remembered.
        """
        with self.autocast():
            h = self.encode(observations.apply(lambda x: x.unsqueeze(1), obs))[:, 0]  # (n, D)
            out = self.memory.step(h, state, index, return_attention)
        return self.heads(out, keep_features=False)

    def act(
        self,
        obs: torch.Tensor,
        state: MemoryState,
        choose: Callable[[MultiCategorical | DiagonalGaussian], torch.Tensor],
        attention: bool = False,
    ) -> tuple[torch.Tensor, PolicyOutput, list[np.ndarray] | None]:
        """One step of every worker by the memory's per-step protocol, written here only (rollouts, evaluation,
        lab/benchmark.py and the tests call it): the policy and value of the current step, observations (N, *obs_shape),
        with each worker's memory; the actions (N, A) ``choose(policy)`` takes; then the step remembered
        (``memory.commit``). What follows the environments' answer, ``state.end_episodes(done)``, is the caller's.

        Returns the actions, the step's output and, with ``attention``, worker 0's attention per block over its
        visible past steps, oldest first (``Memory.attention_over_steps``; read before the commit moves the ring).
        """
        out = self.step(obs, state, return_attention=attention)
        actions = choose(out.policy)
        weights = self.memory.attention_over_steps(state, out.attention) if attention else None
        self.memory.commit(state, out.record)
        return actions, out, weights

    def forward(self, obs: torch.Tensor, context: object) -> PolicyOutput:
        """Policy and values (B, C) of B chunks of C consecutive steps, observations (B, C, *obs_shape), with the
        memory context the trace gave for them."""
        with self.autocast():
            out = self.memory.forward_chunks(self.encode(obs), context)
        return self.heads(out)

    def forward_steps(self, obs: torch.Tensor, context: object, valid: torch.Tensor | None = None) -> PolicyOutput:
        """Policy and values (B, Q) of B rows of Q single steps, observations (B, Q, *obs_shape), with the memory
        context ``trace.single_steps`` gave for them.

        With ``valid`` (B, Q) only the real steps' observations are encoded; the padding's queries get a zero
        embedding, so their outputs are finite, and meaningless.
        """
        with self.autocast():
            if valid is None:
                h = self.encode(obs)
            else:
                # Rows are padded to the longest (a quarter to a third of a minibatch in the shipped configs), and the
                # encoder is the costliest per-step part: it sees the M real observations only.
                encoded = self.encode(observations.apply(lambda x: x[valid].unsqueeze(1), obs))[:, 0]  # (M, D)
                h = encoded.new_zeros(*valid.shape, encoded.shape[-1]).masked_scatter(valid.unsqueeze(-1), encoded)
            out = self.memory.forward_steps(h, context)
        return self.heads(out)

    def heads(self, out: MemoryOutput, keep_features: bool = True) -> PolicyOutput:
        """Policy and value from the memory's output, in float32 (outside ``autocast``); with ``keep_features`` the
        features stay in the output, for the reconstruction loss in training."""
        features = out.features.float()
        value = self.value(features if self.value_trains_memory else features.detach())
        return PolicyOutput(self.policy(features), value, out.record, out.attention, features if keep_features else None)
