"""The memories and the one place that chooses one from the config's ``memory``, as environments/__init__.py chooses
an environment.

- memories/base.py: the interface every memory implements (``Memory``, ``MemoryState``, ``MemoryTrace``,
  ``MemoryOutput``) and how the trainer, evaluation and enjoy.py use it; it imports no implementation.
- memories/trxl.py: the episodic TrXL/GTrXL memory (its blocks are transformer.py's).
- memories/recurrent.py: GRU and LSTM, and no memory.

Adding a memory is one module implementing memories/base.py's interface, its name in ``config.MEMORY_TYPES`` and a
branch in ``make_memory``.
"""

from __future__ import annotations

import torch

from config import check_memory_path
from memories.base import Memory
from memories.recurrent import NoMemory, RecurrentMemory
from memories.trxl import TrXLMemory

MEMORY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def memory_input_dim(config: object) -> int | None:
    """The width the observation encoder embeds to for the configured memory; None: its raw features (the
    recurrent memories take the flattened convolution output or the observation vector, as the reference's recurrent
    sister repository does)."""
    if config.memory == "trxl":
        return config.transformer.embed_dim
    if config.memory == "none":
        return config.hidden_layer_size
    return None


def make_memory(config: object, input_dim: int, memory_path: str = "fast") -> Memory:
    """The memory a training config asks for (``config.memory``).

    Args:
        config: a validated ``config.Config``.
        input_dim: width of the encoder's output (``memory_input_dim`` where that is not None).
        memory_path: TrXL only: "fast" (K/V cache, banded chunk attention) or "plain" (the per-window specification).

    Every memory has ``output_dim``, the width of the features it gives the heads.
    """
    check_memory_path(memory_path, config)
    dtype = MEMORY_DTYPES[config.memory_dtype]
    if config.memory == "trxl":
        return TrXLMemory(config.transformer, dtype, memory_path)
    if config.memory == "none":
        return NoMemory(input_dim)
    return RecurrentMemory(config.memory, input_dim, config.recurrence, config.hidden_layer_size, dtype)
