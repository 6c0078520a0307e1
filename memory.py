"""The episodic memory seen step by step (rollouts, evaluation) and the window masks shared with training.

Shapes (legend as in buffer.py): N workers, L memory length, K blocks, D embed dim, H heads, d head width.

Step by step, each worker keeps a ring of its last L memory tokens: the token of episode step s lives in ring
slot s % L. At episode step t the visible steps are [max(0, t - L), t), which in the ring are

    slots j < t        while t < L   (the first t slots, filled in order)
    all L slots        once t >= L   (the ring holds exactly the last L steps)

so the mask needs nothing but t. Attention does not care about slot order: each token carries its position
through the positional encoding of its own episode step.

``RolloutMemory(cache_kv=True)`` is the fast path: every token's keys and values are projected once, when the
token is written, so a step costs O(D^2 + L D) whatever L is. ``cache_kv=False`` is the plain path, the
executable specification: it re-projects the whole window at every step, O(L D^2).
"""

from __future__ import annotations

import torch

from model import ActorCriticModel

MEMORY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def band_mask(key_episodes: torch.Tensor, query_episodes: torch.Tensor, memory_length: int) -> torch.Tensor:
    """Which memory slots each query of a sequence chunk may attend to.

    A chunk of C consecutive steps of one worker uses the S = C + L - 1 trace slots that start L slots before its
    first step; query q (the chunk's q-th step) owns the window of slots [q, q + L) and sees the slots of that
    window that belong to its own episode (query q's own token is slot L + q, the window is the L slots before it).
    Example, L = 3, C = 4, an episode (id 7) starting at the chunk's step 1:

        slot        0  1  2  3  4  5         key episodes   6  6  6  6  7  7
        query 0     x  x  x  .  .  .         (episode 6: its 3 previous steps)
        query 1     .  -  -  -  .  .         (episode 7, step 0: nothing)
        query 2     .  .  -  -  x  .         (step 1)
        query 3     .  .  .  -  x  x         (step 2)

    Args:
        key_episodes: (B, S) episode id of each memory slot (-1 for padding, which nothing sees).
        query_episodes: (B, C) episode id of each query step.
        memory_length: L.

    Returns:
        (B, C, S) boolean mask.
    """
    c, s = query_episodes.shape[1], key_episodes.shape[1]
    query = torch.arange(c, device=key_episodes.device).unsqueeze(1)
    slot = torch.arange(s, device=key_episodes.device).unsqueeze(0)
    band = (slot >= query) & (slot < query + memory_length)  # (C, S)
    return band & (key_episodes.unsqueeze(1) == query_episodes.unsqueeze(2))


def ring_mask(episode_steps: torch.Tensor, memory_length: int) -> torch.Tensor:
    """(N, L) visible ring slots of workers at episode steps ``episode_steps`` (N,); see the module docstring."""
    return torch.arange(memory_length, device=episode_steps.device) < episode_steps.clamp(max=memory_length).unsqueeze(1)


class RolloutMemory:
    """Per-worker rings of the last L memory tokens, with optional K/V cache.

    Attributes:
        tokens: (N, L, K, D) raw memory tokens in the memory dtype, ring slot = episode step % L.
        token_steps: (N, L) episode step of each ring slot.
        episode_steps: (N,) episode step of each worker's current step.
        episode_ids: (N,) running episode counter of each worker (unique per worker).
    """

    def __init__(
        self,
        n_workers: int,
        memory_length: int,
        num_blocks: int,
        embed_dim: int,
        memory_dtype: torch.dtype,
        device: torch.device,
        cache_kv: bool = True,
    ) -> None:
        self.memory_length = memory_length
        self.memory_dtype = memory_dtype
        self.cache_kv = cache_kv
        self.tokens = torch.zeros(n_workers, memory_length, num_blocks, embed_dim, dtype=memory_dtype, device=device)
        self.token_steps = torch.zeros(n_workers, memory_length, dtype=torch.long, device=device)
        self.episode_steps = torch.zeros(n_workers, dtype=torch.long, device=device)
        self.episode_ids = torch.zeros(n_workers, dtype=torch.long, device=device)
        self.keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per block (N, H, L, d)

    @torch.no_grad()
    def refresh(self, model: ActorCriticModel) -> None:
        """Re-project the cached keys and values with the model's current weights (after each update)."""
        if self.cache_kv:
            self.keys_values = model.project_memory(self.tokens, self.token_steps)

    def inputs(
        self, model: ActorCriticModel, index: torch.Tensor | None = None
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Keys/values (per block, (n, H, S, d)) and mask (n, 1, S) for the current step of workers ``index`` (all).

        Plain path: S = L, the whole window is projected, as the specification says. Fast path: only the first
        S = min(L, largest episode step) ring slots can be visible (slot j holds step j until the ring wraps), so only
        their cached keys and values are passed on: attention reads as much memory as the episodes have, not L slots.
        """
        rows = slice(None) if index is None else index
        steps = self.episode_steps[rows]
        mask = ring_mask(steps, self.memory_length).unsqueeze(1)
        if not self.cache_kv:
            return model.project_memory(self.tokens[rows], self.token_steps[rows]), mask
        if self.keys_values is None:
            self.refresh(model)
        span = max(1, min(self.memory_length, int(steps.max())))
        return [(k[rows, :, :span], v[rows, :, :span]) for k, v in self.keys_values], mask[..., :span]

    @torch.no_grad()
    def append(self, model: ActorCriticModel, tokens: torch.Tensor) -> None:
        """Store the memory tokens (N, K, D) of every worker's current step and advance its episode step."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        slots = self.episode_steps % self.memory_length
        stored = tokens.to(self.memory_dtype)
        self.tokens[rows, slots] = stored
        self.token_steps[rows, slots] = self.episode_steps
        if self.cache_kv:
            if self.keys_values is None:
                self.refresh(model)
            new = model.project_memory(stored.unsqueeze(1), self.episode_steps.unsqueeze(1))  # per block (N, H, 1, d)
            for (k, v), (new_k, new_v) in zip(self.keys_values, new, strict=True):
                k[rows, :, slots] = new_k[:, :, 0]
                v[rows, :, slots] = new_v[:, :, 0]
        self.episode_steps += 1

    def end_episodes(self, done: torch.Tensor) -> None:
        """Start a new episode for the workers where ``done`` (N,) is True: nothing of the old one stays visible."""
        self.episode_steps[done] = 0
        self.episode_ids[done] += 1
