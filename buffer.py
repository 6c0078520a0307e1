"""Rollout storage: per-step data, each worker's memory trace, GAE, and minibatches of sequence chunks.

Shape legend (used across the repo):
    N  workers (n_workers)            T  steps per worker and rollout (worker_steps)
    L  memory length (memory_length)  K  transformer blocks (num_blocks)
    D  embed dim (embed_dim)          A  action dimensions
    C  steps per minibatch chunk (sequence_length)     S = C + L - 1 memory slots of a chunk
    B  chunks in a minibatch

The trace. Per worker we keep the L memory tokens carried in from before this rollout, then the T tokens
written during it: ``trace`` (N, L + T, K, D). Step t's own token sits in slot L + t, so the window of step t
is the L slots just before it, [t, t + L), and ``trace.unfold(1, L, 1)[:, t]`` is that window as a view.
Slots of another episode (or the initial padding, episode id -1) are masked. L = 4, an episode starting at
slot 4, slots 0-3 holding the previous episode:

    episode step t   window = trace slots   visible (same episode, before t)
    0                0 1 2 3                - - - -
    1                1 2 3 4                - - - x
    2                2 3 4 5                - - x x
    3                3 4 5 6                - x x x
    4                4 5 6 7                x x x x
    5                5 6 7 8                x x x x   (steps 1..4)

No copy per window and no padding to a maximum episode length: a step costs the same in an endless episode.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from memory import band_mask


class Minibatch(NamedTuple):
    """B chunks of C consecutive steps, each with the S = C + L - 1 trace slots its windows cover."""

    obs: torch.Tensor  # (B, C, *obs_shape), images as uint8 levels
    actions: torch.Tensor  # (B, C, A)
    log_probs: torch.Tensor  # (B, C)
    values: torch.Tensor  # (B, C)
    advantages: torch.Tensor  # (B, C)
    returns: torch.Tensor  # (B, C)
    memory: torch.Tensor  # (B, S, K, D) memory tokens, no gradient
    memory_steps: torch.Tensor  # (B, S) episode step of each slot
    mask: torch.Tensor  # (B, C, S) which slots each step sees (band_mask)
    windows_visible: torch.Tensor  # (B, C, L) the same, per step window (for the plain path)


class Buffer:
    """Everything one rollout of N workers x T steps produces, plus the memory trace."""

    def __init__(
        self,
        n_workers: int,
        worker_steps: int,
        memory_length: int,
        num_blocks: int,
        embed_dim: int,
        observation_shape: tuple[int, ...],
        n_action_dims: int,
        memory_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        n, t, length = n_workers, worker_steps, memory_length
        self.n_workers, self.worker_steps, self.memory_length = n, t, length
        self.device = device
        # Images are stored as uint8 levels (see model.quantize_images): a quarter of float32's memory.
        self.images = len(observation_shape) == 3
        self.obs = torch.zeros(n, t, *observation_shape, dtype=torch.uint8 if self.images else torch.float32, device=device)
        self.actions = torch.zeros(n, t, n_action_dims, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(n, t, device=device)
        self.values = torch.zeros(n, t, device=device)
        self.rewards = torch.zeros(n, t, device=device)
        self.terminated = torch.zeros(n, t, dtype=torch.bool, device=device)
        self.truncated = torch.zeros(n, t, dtype=torch.bool, device=device)
        self.final_values = torch.zeros(n, t, device=device)  # value of the final observation where truncated
        self.advantages = torch.zeros(n, t, device=device)
        self.returns = torch.zeros(n, t, device=device)
        self.trace = torch.zeros(n, length + t, num_blocks, embed_dim, dtype=memory_dtype, device=device)
        self.trace_steps = torch.zeros(n, length + t, dtype=torch.long, device=device)
        self.trace_episodes = torch.full((n, length + t), -1, dtype=torch.long, device=device)

    def start_rollout(self) -> None:
        """Carry the last L trace slots of the previous rollout to the front of the trace."""
        length = self.memory_length
        for field in (self.trace, self.trace_steps, self.trace_episodes):
            field[:, :length] = field[:, -length:].clone()

    def record_step(
        self,
        t: int,
        obs: torch.Tensor,
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
        tokens: torch.Tensor,
        episode_steps: torch.Tensor,
        episode_ids: torch.Tensor,
    ) -> None:
        """Store step t of every worker: obs (N, *obs_shape) (uint8 levels for images), actions (N, A),
        log_probs/values (N,), tokens (N, K, D)."""
        self.obs[:, t] = obs
        self.actions[:, t] = actions
        self.log_probs[:, t] = log_probs
        self.values[:, t] = values
        slot = self.memory_length + t
        self.trace[:, slot] = tokens.to(self.trace.dtype)
        self.trace_steps[:, slot] = episode_steps
        self.trace_episodes[:, slot] = episode_ids

    def record_outcome(
        self, t: int, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor
    ) -> None:
        """Store what the environments answered at step t (each (N,)); final_values only matter where truncated."""
        self.rewards[:, t] = rewards
        self.terminated[:, t] = terminated
        self.truncated[:, t] = truncated
        self.final_values[:, t] = final_values

    def windows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of every step's window: memory (N, T + 1, K, D, L), steps and episodes (N, T + 1, L).

        Index t (0..T) is the window of rollout step t; index T is the window of the step after the rollout.
        """
        length = self.memory_length
        return (
            self.trace.unfold(1, length, 1),
            self.trace_steps.unfold(1, length, 1),
            self.trace_episodes.unfold(1, length, 1),
        )

    def compute_advantages(self, last_values: torch.Tensor, gamma: float, lamda: float) -> None:
        """Generalised advantage estimation.

        A termination has no future value. A truncation (time limit) is not a terminal state: its next value is the
        value of the final observation (``final_values``). Either way the recursion stops at the episode end,
        because with same-step autoreset the next stored step belongs to the next episode.

        Args:
            last_values: (N,) value of the observation after the rollout's last step.
        """
        next_values = torch.cat([self.values[:, 1:], last_values.unsqueeze(1)], dim=1)  # (N, T)
        next_values = torch.where(self.truncated, self.final_values, next_values)
        deltas = self.rewards + gamma * next_values * (~self.terminated) - self.values
        continues = ~(self.terminated | self.truncated)
        advantage = torch.zeros_like(last_values)
        for t in reversed(range(self.worker_steps)):
            advantage = deltas[:, t] + gamma * lamda * continues[:, t] * advantage
            self.advantages[:, t] = advantage
        self.returns = self.advantages + self.values

    def minibatches(self, n_mini_batch: int, sequence_length: int, generator: torch.Generator) -> Iterator[Minibatch]:
        """Shuffle the rollout's N * T / C chunks of C consecutive steps and yield them as n_mini_batch minibatches.

        Chunks keep the projection of memory tokens cheap (each trace slot is projected once per chunk, not once per
        window) while the minibatches still mix steps from many workers and times.
        """
        c, length = sequence_length, self.memory_length
        n_chunks = self.worker_steps // c
        order = torch.randperm(self.n_workers * n_chunks, generator=generator).to(self.device)
        span = c + length - 1
        # Chunk j of a worker covers steps [j C, (j + 1) C) and trace slots [j C, j C + S).
        memory = self.trace.unfold(1, span, c)  # (N, T / C, K, D, S)
        memory_steps = self.trace_steps.unfold(1, span, c)  # (N, T / C, S)
        memory_episodes = self.trace_episodes.unfold(1, span, c)  # (N, T / C, S)
        query_episodes = self.trace_episodes[:, length:].reshape(self.n_workers, n_chunks, c)  # (N, T / C, C)

        def chunks(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(self.n_workers, n_chunks, c, *x.shape[2:])  # (N, T / C, C, ...)

        per_step = [chunks(x) for x in (self.obs, self.actions, self.log_probs, self.values, self.advantages, self.returns)]
        for index in order.chunk(n_mini_batch):
            worker, chunk = index // n_chunks, index % n_chunks
            keys = memory_episodes[worker, chunk]  # (B, S)
            queries = query_episodes[worker, chunk]  # (B, C)
            mask = band_mask(keys, queries, length)  # (B, C, S)
            visible = keys.unfold(1, length, 1) == queries.unsqueeze(2)  # (B, C, L)
            yield Minibatch(
                *(x[worker, chunk] for x in per_step),
                memory=memory[worker, chunk].permute(0, 3, 1, 2),  # (B, S, K, D)
                memory_steps=memory_steps[worker, chunk],
                mask=mask,
                windows_visible=visible,
            )
