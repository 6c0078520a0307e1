"""Recurrent memories (GRU, LSTM) and no memory, behind the same interface as the TrXL memory (memories/base.py).

Shapes (legend as in buffer.py): N workers, T rollout steps, B chunks, C steps per chunk, E encoder features,
Y layers (``recurrence.num_layers``), H hidden state size, W = H for a GRU and 2 H for an LSTM (its hidden and cell
state side by side), F features for the heads (``hidden_layer_size``).

As in the reference's recurrent sister repository (MarcoMeter/recurrent-ppo-truncated-bptt): the encoder's raw
features go into a GRU or LSTM (orthogonal weights with gain sqrt(2), zero biases), whose output passes one
Linear + ReLU layer (H -> F) on its way to the heads; the state starts at zero with each episode.

Rollouts keep each worker's state (N, Y, W). A step records the state before it and whether it is its episode's
first step; the trace keeps both for every rollout step. Training:

- chunks: each chunk starts from the state recorded before its first step (no gradient into earlier steps:
  truncated backpropagation through the chunk) and runs the chunk's steps one recurrent pass per run of steps without
  an episode start; where an episode starts inside the chunk the state is zeroed, as the rollout zeroed it;
- single steps: each step runs one recurrent step from the state recorded before it.

At the rollout's weights both reproduce the rollout's outputs (tests/test_recurrent_memory.py). With
``memory_dtype: bfloat16`` the state is stored rounded to bfloat16 after every step, in rollouts and in training
alike (the rounding passes gradients through unchanged).

No memory passes the encoder's features (F) straight to the heads; it keeps nothing and its trace is empty.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from config import RecurrenceConfig
from heads import orthogonal
from memories.base import Memory, MemoryOutput, MemoryState, MemoryTrace


class RecurrentRecord(NamedTuple):
    """What one step of n workers gives."""

    before: torch.Tensor  # (n, Y, W) state before the step, in the memory dtype
    after: torch.Tensor  # (n, Y, W) state after the step, in the memory dtype
    starts: torch.Tensor  # (n,) whether the step is the first of its episode


class RecurrentContext(NamedTuple):
    """The memory of B chunks of C steps, or of B rows of Q single steps."""

    states: torch.Tensor  # chunks: (B, Y, W) state before each chunk's first step; single steps: (B, Q, Y, W)
    starts: torch.Tensor | None  # chunks: (B, C) episode starts inside the chunks; None for single steps


class RecurrentState(MemoryState):
    """Each worker's recurrent state ``hidden`` (N, Y, W) and whether its next step starts an episode ``fresh`` (N,)."""

    def __init__(self, n_workers: int, layers: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self.hidden = torch.zeros(n_workers, layers, width, dtype=dtype, device=device)
        self.fresh = torch.ones(n_workers, dtype=torch.bool, device=device)

    def end_episodes(self, done: np.ndarray | torch.Tensor) -> None:
        done = torch.as_tensor(done, device=self.hidden.device)
        # Elementwise, not a boolean-mask write: no host synchronisation on a GPU.
        self.hidden.mul_((~done).view(-1, 1, 1).to(self.hidden.dtype))
        self.fresh |= done

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"hidden": self.hidden.cpu().clone(), "fresh": self.fresh.cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.hidden.copy_(state["hidden"])
        self.fresh.copy_(state["fresh"])


class RecurrentTrace(MemoryTrace):
    """The state before every rollout step, ``states`` (N, T, Y, W), and the episode starts ``starts`` (N, T).

    Chunks never reach back into the previous rollout (each starts from its own recorded state), so nothing is
    carried from rollout to rollout and a checkpoint keeps nothing of the trace.
    """

    def __init__(self, n_workers: int, worker_steps: int, layers: int, width: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        self.states = torch.zeros(n_workers, worker_steps, layers, width, dtype=dtype, device=device)
        self.starts = torch.zeros(n_workers, worker_steps, dtype=torch.bool, device=device)

    def start_rollout(self) -> None:
        pass

    def record(self, t: int, record: RecurrentRecord) -> None:
        self.states[:, t] = record.before
        self.starts[:, t] = record.starts

    def chunks(self, workers: torch.Tensor, chunks: torch.Tensor, length: int) -> RecurrentContext:
        n, t = self.starts.shape
        starts = self.starts.view(n, t // length, length)[workers, chunks]  # (B, C)
        return RecurrentContext(self.states[workers, chunks * length], starts)

    def single_steps(self, workers: torch.Tensor, times: torch.Tensor) -> RecurrentContext:
        return RecurrentContext(self.states[workers.unsqueeze(1), times], None)  # (B, Q, Y, W)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass


class RecurrentMemory(Memory):
    """A GRU or LSTM memory with truncated backpropagation through each training chunk (see the module docstring)."""

    def __init__(
        self, kind: str, input_dim: int, config: RecurrenceConfig, output_dim: int, memory_dtype: torch.dtype = torch.float32
    ) -> None:
        """Build the memory.

        Args:
            kind: "gru" or "lstm".
            input_dim: E, width of the encoder's features.
            config: hidden state size and layer count.
            output_dim: F, width of the features for the heads (the config's hidden_layer_size).
            memory_dtype: dtype the state is stored in.
        """
        super().__init__()
        if kind not in ("gru", "lstm"):
            raise ValueError(f"recurrent memory '{kind}' is unknown: use gru or lstm")
        self.kind = kind
        self.layers, self.size = config.num_layers, config.hidden_state_size
        self.width = self.size * (2 if kind == "lstm" else 1)
        self.memory_dtype = memory_dtype
        self.output_dim = output_dim
        module = nn.GRU if kind == "gru" else nn.LSTM
        self.recurrent = module(input_dim, self.size, num_layers=self.layers, batch_first=True)
        for name, parameter in self.recurrent.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(parameter, np.sqrt(2))
            else:
                nn.init.zeros_(parameter)
        self.hidden = orthogonal(nn.Linear(self.size, output_dim), np.sqrt(2))

    def start(self, n_workers: int, device: torch.device) -> RecurrentState:
        return RecurrentState(n_workers, self.layers, self.width, self.memory_dtype, device)

    def _store(self, state: torch.Tensor) -> torch.Tensor:
        """A state as rollouts store it: rounded to the memory dtype (gradients pass through), as float32."""
        return state if self.memory_dtype == torch.float32 else state.to(self.memory_dtype).float()

    def _run(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the recurrent layers over x (B, R, E) from ``state`` (B, Y, W): outputs (B, R, H), final state (B, Y, W)."""
        packed = state.transpose(0, 1).contiguous()  # (Y, B, W), as torch's recurrent layers take it
        # In float32 whatever compute_dtype says: autocast runs cuDNN's recurrent layers in float16 (not the bfloat16
        # it was asked for, and without a gradient scaler) and oneDNN's LSTM in bfloat16, whose rounding compounds
        # over every step of a sequence.
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()
            if self.kind == "gru":
                out, final = self.recurrent(x, packed)
            else:
                out, (h, c) = self.recurrent(x, (packed[..., : self.size].contiguous(), packed[..., self.size :].contiguous()))
                final = torch.cat([h, c], dim=-1)
        return out, final.transpose(0, 1)

    def _features(self, out: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(out))

    def step(
        self, h: torch.Tensor, state: RecurrentState, index: torch.Tensor | None = None, return_attention: bool = False
    ) -> MemoryOutput:
        rows = slice(None) if index is None else index
        before = state.hidden[rows].clone()  # a copy: commit overwrites the state, the record keeps this step's start
        out, after = self._run(h.unsqueeze(1), before.float())
        record = RecurrentRecord(before, after.to(self.memory_dtype), state.fresh[rows].clone())
        return MemoryOutput(self._features(out[:, 0]), record, None)

    @torch.no_grad()
    def commit(self, state: RecurrentState, record: RecurrentRecord) -> None:
        state.hidden.copy_(record.after)
        state.fresh.zero_()

    def trace(self, n_workers: int, worker_steps: int, device: torch.device) -> RecurrentTrace:
        return RecurrentTrace(n_workers, worker_steps, self.layers, self.width, self.memory_dtype, device)

    def forward_chunks(self, h: torch.Tensor, context: RecurrentContext) -> MemoryOutput:
        """Features (B, C, F) of B chunks, h (B, C, E): one recurrent pass per run of steps that no episode start in
        any chunk interrupts (one run per step with a bfloat16 state, which is rounded after every step)."""
        b, c = h.shape[:2]
        state = context.states.float()
        if self.memory_dtype == torch.float32:
            cuts = [0, *(context.starts[:, 1:].any(dim=0).nonzero().squeeze(1) + 1).tolist(), c]
        else:
            cuts = list(range(c + 1))
        outs = []
        for first, stop in zip(cuts[:-1], cuts[1:], strict=True):
            if first > 0:
                state = state * (~context.starts[:, first]).view(b, 1, 1)  # an episode starts here: from zero
            out, state = self._run(h[:, first:stop], state)
            state = self._store(state)
            outs.append(out)
        out = torch.cat(outs, dim=1)  # (B, C, H)
        return MemoryOutput(self._features(out), None, None)

    def forward_steps(self, h: torch.Tensor, context: RecurrentContext) -> MemoryOutput:
        """Features (B, Q, F) of B rows of Q single steps, h (B, Q, E): one recurrent step from each step's state."""
        b, q = h.shape[:2]
        out, _ = self._run(h.reshape(b * q, 1, -1), context.states.reshape(b * q, self.layers, self.width).float())
        return MemoryOutput(self._features(out.view(b, q, -1)), None, None)


class NoState(MemoryState):
    """Nothing to remember."""

    def end_episodes(self, done: np.ndarray | torch.Tensor) -> None:
        pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass


class NoTrace(MemoryTrace):
    """Nothing to record: every step's features depend on its own observation only."""

    def start_rollout(self) -> None:
        pass

    def record(self, t: int, record: object) -> None:
        pass

    def chunks(self, workers: torch.Tensor, chunks: torch.Tensor, length: int) -> None:
        return None

    def single_steps(self, workers: torch.Tensor, times: torch.Tensor) -> None:
        return None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass


class NoMemory(Memory):
    """No memory: the encoder's features (F) go to the heads as they are (the memory-less baseline)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.output_dim = dim

    def start(self, n_workers: int, device: torch.device) -> NoState:
        return NoState()

    def step(
        self, h: torch.Tensor, state: NoState, index: torch.Tensor | None = None, return_attention: bool = False
    ) -> MemoryOutput:
        return MemoryOutput(h, None, None)

    def commit(self, state: NoState, record: object) -> None:
        pass

    def trace(self, n_workers: int, worker_steps: int, device: torch.device) -> NoTrace:
        return NoTrace()

    def forward_chunks(self, h: torch.Tensor, context: object) -> MemoryOutput:
        return MemoryOutput(h, None, None)

    def forward_steps(self, h: torch.Tensor, context: object) -> MemoryOutput:
        return MemoryOutput(h, None, None)
