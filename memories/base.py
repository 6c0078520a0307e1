"""The memory seam: everything the trainer, evaluation and enjoy.py know about an agent's memory (its interface; the
config chooses an implementation in ``memories/__init__.py``, ``make_memory``).

Shapes (legend as in buffer.py): N workers, T steps per rollout, B chunks, C steps per chunk, D embed dim; for
minibatches of single steps B rows (one per worker) of Q sampled steps.

A memory sits between the observation encoder and the heads. It is used in two ways, through one interface:

Step by step (rollouts, bootstrap values, evaluation), one stream per worker::

    state = memory.start(n_workers, device)    # every worker at the start of an episode
    memory.sync(state)                         # after the weights changed (each rollout starts with it)
    out = memory.step(h, state, index)         # h (n, D) -> MemoryOutput: features (n, D) for the heads, a record
    memory.commit(state, out.record)           # the step was taken: remember it and advance the episode step
    state.end_episodes(done)                   # (N,) workers whose episode ended start afresh (a host array)

(``ActorCriticModel.act`` is the one place the step, the choice of actions and the commit are written.)

Over minibatches of sequence chunks (training), from what the rollout recorded::

    trace = memory.trace(n_workers, worker_steps, device)   # per worker, carried from rollout to rollout
    trace.start_rollout(); trace.record(t, out.record)       # during the rollout, step t of every worker
    context = trace.chunks(workers, chunks, c)               # (B,) chunk j of worker w covers steps [j c, (j + 1) c)
    out = memory.forward_chunks(h, context)                  # h (B, C, D) -> MemoryOutput, features (B, C, D)

or over minibatches of single steps shuffled across the rollout (``minibatch_sampling: steps``)::

    context = trace.single_steps(workers, times)             # (B,) workers, (B, Q) rollout step of each query
    out = memory.forward_steps(h, context)                   # h (B, Q, D) -> MemoryOutput, features (B, Q, D)

At the rollout's weights ``forward_chunks`` and ``forward_steps`` reproduce what ``step`` gave
(tests/test_equivalence.py and tests/test_step_minibatches.py hold every memory to it), so PPO's ratios start at 1.
A checkpoint keeps ``state.state_dict()`` and ``trace.state_dict()``.

Implementations, chosen by the config's ``memory``: the episodic TrXL/GTrXL memory (memories/trxl.py); GRU and LSTM
(memories/recurrent.py), which keep their hidden state in the state, record the state before each step in their trace,
and take as context the hidden state at each chunk's start (truncated backpropagation through the chunk) or, for
single steps, the hidden state before each step (one recurrent step from it); and no memory (memories/recurrent.py),
which passes h on as it is. None of them touches the trainer, and this module imports none of them.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

import numpy as np
import torch
from torch import nn


class MemoryOutput(NamedTuple):
    """What a memory gives for some steps."""

    features: torch.Tensor  # (..., D) input of the heads
    record: object  # what the trace stores of these steps (the memory's own type)
    attention: list[torch.Tensor] | None  # per block attention weights where the memory has them and they were asked for


class MemoryState(ABC):
    """Per-worker memory for stepping through episodes."""

    @abstractmethod
    def end_episodes(self, done: np.ndarray | torch.Tensor) -> None:
        """Start a new episode for the workers where ``done`` (N,) is True: nothing of the old one stays visible.

        ``done`` is a host (numpy) array where the caller has one, as the rollout has the environments' answer: a
        state that keeps something on the host (TrXL: the episode steps) reads it there without waiting for the
        device; a tensor on the state's device works as well, at the cost of that wait.
        """

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies (on the CPU) of everything a resumed run needs."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take back what ``state_dict`` returned."""


class MemoryTrace(ABC):
    """Per-worker record of a rollout's steps, with what is carried in from before it, for training."""

    @abstractmethod
    def start_rollout(self) -> None:
        """Keep what the next rollout's first steps need of the previous rollout."""

    @abstractmethod
    def record(self, t: int, record: object) -> None:
        """Store the record of rollout step t of every worker (``MemoryOutput.record`` of ``Memory.step``)."""

    @abstractmethod
    def chunks(self, workers: torch.Tensor, chunks: torch.Tensor, length: int) -> object:
        """The memory context of B chunks: chunk ``chunks[b]`` (steps [j C, (j + 1) C)) of worker ``workers[b]``."""

    def single_steps(self, workers: torch.Tensor, times: torch.Tensor) -> object:
        """The memory context of B rows of Q single steps: query (b, q) is rollout step ``times[b, q]`` (B, Q) of
        worker ``workers[b]`` (B,). Rows may be padded by repeating one of the row's steps (``Minibatch.valid``
        marks the real ones); the outputs of padded queries must be finite, since they are computed and then ignored.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no minibatches of single steps yet: use minibatch_sampling chunks"
        )

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies (on the CPU) of what ``start_rollout`` carries into the next rollout."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take back what ``state_dict`` returned; the next ``start_rollout`` carries it on."""


class Memory(nn.Module, ABC):
    """A memory between encoder and heads; see the module docstring for how it is used.

    Attributes:
        autocast: Returns the context its computations run in (set by the model: bfloat16 matrix products with
            ``compute_dtype: bfloat16``); ``sync`` and ``commit``, which the rollout calls outside the model, enter it
            themselves where they compute.
    """

    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext

    @abstractmethod
    def start(self, n_workers: int, device: torch.device) -> MemoryState:
        """Memory for ``n_workers`` streams, each at the start of an episode."""

    def sync(self, state: MemoryState) -> None:
        """Bring what ``state`` caches of the weights up to date (called after every update); nothing by default."""

    @abstractmethod
    def step(
        self, h: torch.Tensor, state: MemoryState, index: torch.Tensor | None = None, return_attention: bool = False
    ) -> MemoryOutput:
        """Features (n, D) of the current step of workers ``index`` (all), whose embedded observations are h (n, D).

        Changes nothing in ``state``: ``commit`` does, once the step is taken (bootstrap values only look). The
        record holds no view of ``state``: ``commit`` and ``end_episodes`` may change the state before the rollout
        stores the record.
        """

    @abstractmethod
    def commit(self, state: MemoryState, record: object) -> None:
        """Remember the step of every worker that ``step`` (with ``index`` None) returned ``record`` for."""

    @abstractmethod
    def trace(self, n_workers: int, worker_steps: int, device: torch.device) -> MemoryTrace:
        """An empty trace for rollouts of ``n_workers`` x ``worker_steps``."""

    def compilable(self) -> list[nn.Module]:
        """Its modules worth compiling with torch.compile (``compile: true``); none by default."""
        return []

    @abstractmethod
    def forward_chunks(self, h: torch.Tensor, context: object) -> MemoryOutput:
        """Features (B, C, D) of B chunks of C consecutive steps, h (B, C, D), with the context ``trace.chunks`` gave."""

    def forward_steps(self, h: torch.Tensor, context: object) -> MemoryOutput:
        """Features (B, Q, D) of B rows of Q single steps, h (B, Q, D), with the context ``trace.single_steps`` gave."""
        raise NotImplementedError(
            f"{type(self).__name__} has no minibatches of single steps yet: use minibatch_sampling chunks"
        )

    def attention_over_steps(self, state: MemoryState, attention: list[torch.Tensor], row: int = 0) -> list[np.ndarray]:
        """Per block (H, V) attention of worker ``row``'s step over its V visible past steps, oldest first."""
        raise NotImplementedError(f"{type(self).__name__} has no attention to show")
