"""Rollout storage: per-step data, GAE, and minibatches of sequence chunks or single steps; the memory's trace rides along.

Shape legend (used across the repo):
    N  workers (n_workers)            T  steps per worker and rollout (worker_steps)
    L  memory length (memory_length)  K  transformer blocks (num_blocks)
    D  embed dim (embed_dim)          A  action dimensions
    C  steps per minibatch chunk (sequence_length)     S = C + L - 1 memory slots of a chunk
    B  chunks in a minibatch (single steps: rows, one per worker in the minibatch)
    M = N * T / n_mini_batch steps in a minibatch of single steps     Q  queries per row (the most steps of one worker)

What the memory keeps of each step (for the TrXL memory: its tokens, in a per-worker trace whose windows are
``torch.unfold`` views, see memories/trxl.py) is the memory's own ``MemoryTrace``; the buffer stores it in
``record_step`` and asks it for each minibatch's memory context. Everything here is the same for every memory.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple

import torch

import observations
from distributed import Rows
from memories.base import MemoryTrace


def _pick(index: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
    """``x[index]``: the entries of a minibatch from one per-step tensor."""
    return x[index]


def _observation_storage(n: int, t: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros (N, T, *shape) for one kind of observation. Images, stored as uint8 levels (encoders.quantize_images: a
    quarter of float32's memory), are laid out channels-last, as the encoder prepares them
    (encoders.channels_last_levels): a minibatch picked from them by worker and step keeps that layout, which the
    convolutions take without reordering."""
    if dtype == torch.uint8 and len(shape) == 3:
        c, h, w = shape
        return torch.zeros(n, t, h, w, c, dtype=dtype, device=device).movedim(-1, 2)
    return torch.zeros(n, t, *shape, dtype=dtype, device=device)


class Minibatch(NamedTuple):
    """B chunks of C consecutive steps, with the memory context of each chunk.

    Or, for single steps, B rows of Q steps: row b holds the sampled steps of one worker, padded to Q by repeating
    the row's first step; ``valid`` marks the real ones.
    """

    obs: torch.Tensor | dict[str, torch.Tensor]  # (B, C, *obs_shape), images as uint8 levels; per key for dicts
    actions: torch.Tensor  # (B, C, A)
    log_probs: torch.Tensor  # (B, C)
    values: torch.Tensor  # (B, C)
    advantages: torch.Tensor  # (B, C)
    returns: torch.Tensor  # (B, C)
    memory: object  # what MemoryTrace.chunks (or .single_steps) gives for them (trxl_memory.TrXLContext for TrXL)
    valid: torch.Tensor | None = None  # (B, Q) False for padding, single steps only; None for chunks (all real)
    share: float = 1.0  # the part of the minibatch's steps this process holds (several processes, distributed.py)

    @property
    def single_steps(self) -> bool:
        """Whether the minibatch holds rows of single steps (``MemoryTrace.single_steps``) rather than chunks."""
        return self.valid is not None


class Buffer:
    """Everything one rollout of N workers x T steps produces, plus the memory trace."""

    def __init__(
        self,
        n_workers: int,
        worker_steps: int,
        observation_shape: observations.Shape,
        observation_dtype: torch.dtype | dict[str, torch.dtype],
        n_action_dims: int,
        trace: MemoryTrace,
        device: torch.device,
        action_dtype: torch.dtype = torch.long,
    ) -> None:
        """Storage for rollouts of ``n_workers`` x ``worker_steps``; ``trace`` is the memory's (``Memory.trace``);
        actions are stored as ``action_dtype`` (float32 for continuous actions)."""
        n, t = n_workers, worker_steps
        self.n_workers, self.worker_steps = n, t
        self.device = device
        self.trace = trace
        if isinstance(observation_shape, dict):  # one tensor per key of a dict observation
            self.obs = {
                key: _observation_storage(n, t, shape, observation_dtype[key], device)
                for key, shape in observation_shape.items()
            }
        else:
            self.obs = _observation_storage(n, t, observation_shape, observation_dtype, device)
        self.actions = torch.zeros(n, t, n_action_dims, dtype=action_dtype, device=device)
        self.log_probs = torch.zeros(n, t, device=device)
        self.values = torch.zeros(n, t, device=device)
        self.rewards = torch.zeros(n, t, device=device)
        self.terminated = torch.zeros(n, t, dtype=torch.bool, device=device)
        self.truncated = torch.zeros(n, t, dtype=torch.bool, device=device)
        self.final_values = torch.zeros(n, t, device=device)  # value of the final observation where truncated
        self.advantages = torch.zeros(n, t, device=device)
        self.returns = torch.zeros(n, t, device=device)

    def start_rollout(self) -> None:
        """Let the memory's trace carry what the new rollout needs of the previous one."""
        self.trace.start_rollout()

    def record_step(
        self,
        t: int,
        obs: torch.Tensor,
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
        memory_record: object,
    ) -> None:
        """Store step t of every worker: obs (N, *obs_shape) (uint8 levels for images), actions (N, A),
        log_probs/values (N,), and the memory's record of the step (``MemoryOutput.record``)."""
        if isinstance(obs, dict):
            for key, value in obs.items():
                self.obs[key][:, t] = value
        else:
            self.obs[:, t] = obs
        self.actions[:, t] = actions
        self.log_probs[:, t] = log_probs
        self.values[:, t] = values
        self.trace.record(t, memory_record)

    def record_outcome(
        self, t: int, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor
    ) -> None:
        """Store what the environments answered at step t (each (N,)); final_values only matter where truncated."""
        self.rewards[:, t] = rewards
        self.terminated[:, t] = terminated
        self.truncated[:, t] = truncated
        self.final_values[:, t] = final_values

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

    def minibatches(
        self,
        n_mini_batch: int,
        sequence_length: int,
        generator: torch.Generator,
        sampling: str = "chunks",
        lanes: Rows | None = None,
    ) -> Iterator[Minibatch | None]:
        """Shuffle the rollout and yield it as n_mini_batch minibatches: of chunks, or with ``sampling`` "steps" of
        single steps (``sequence_length`` is then unused).

        Chunks: the rollout's N * T / C chunks of C consecutive steps are shuffled. Chunks keep the memory cheap (the
        TrXL memory projects each trace slot once per chunk, not once per window; a recurrent memory starts each chunk
        from its stored state) while the minibatches still mix steps from many workers and times.

        Steps: all N * T steps are shuffled and cut into minibatches of M = N * T / n_mini_batch, as the reference
        does. Each minibatch is arranged by worker (``_arrange_steps``), so the memory can serve all of a worker's
        sampled steps from one pass over its trace.

        With ``lanes`` this buffer holds workers first .. first + N - 1 of lanes.total (one process of several,
        distributed.py): the permutation is drawn over all lanes.total workers, as one process holding them all draws
        it, and each minibatch keeps the part this buffer holds, with its ``share`` of the minibatch's steps; None where
        it holds none of them.
        """
        first, total = (0, self.n_workers) if lanes is None else lanes
        if sampling == "steps":
            t = self.worker_steps
            order = torch.randperm(total * t, generator=generator).to(self.device)
            for index in order.chunk(n_mini_batch):
                mine = index[(index >= first * t) & (index < (first + self.n_workers) * t)] - first * t
                yield self._arrange_steps(mine)._replace(share=len(mine) / len(index)) if len(mine) else None
            return
        c = sequence_length
        n_chunks = self.worker_steps // c
        order = torch.randperm(total * n_chunks, generator=generator).to(self.device)

        def chunks(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(self.n_workers, n_chunks, c, *x.shape[2:])  # (N, T / C, C, ...)

        per_step = [
            observations.apply(chunks, x)
            for x in (self.obs, self.actions, self.log_probs, self.values, self.advantages, self.returns)
        ]
        for index in order.chunk(n_mini_batch):
            worker, chunk = index // n_chunks - first, index % n_chunks
            mine = (worker >= 0) & (worker < self.n_workers)
            if not mine.any():
                yield None
                continue
            worker, chunk = worker[mine], chunk[mine]
            pick = functools.partial(_pick, (worker, chunk))
            yield Minibatch(
                *(observations.apply(pick, x) for x in per_step),
                memory=self.trace.chunks(worker, chunk, c),
                share=len(worker) / len(index),
            )

    def _arrange_steps(self, index: torch.Tensor) -> Minibatch:
        """The minibatch of the M steps ``index`` (M,) (flat step numbers worker * T + t), in B rows of Q.

        Row b holds the sampled steps of the b-th worker present, in rollout order, padded to Q (the most steps any
        worker has here) by repeating the row's first step, so that padded queries compute finite numbers;
        ``valid`` (B, Q) marks the real ones.
        """
        index = index.sort().values  # by worker, then by rollout step
        worker, time = index // self.worker_steps, index % self.worker_steps  # (M,)
        workers, counts = torch.unique_consecutive(worker, return_counts=True)  # (B,), (B,)
        b, q = len(workers), int(counts.max())
        row = torch.repeat_interleave(torch.arange(b, device=self.device), counts)  # (M,) row of each step
        first = torch.cumsum(counts, 0) - counts  # (B,) position in index of each row's first step
        column = torch.arange(len(index), device=self.device) - first[row]  # (M,) place of each step in its row
        times = time[first].unsqueeze(1).repeat(1, q)  # (B, Q) every place starts as the row's first step
        times[row, column] = time
        valid = torch.zeros(b, q, dtype=torch.bool, device=self.device)
        valid[row, column] = True
        rows = workers.unsqueeze(1)  # (B, 1)
        per_step = (self.obs, self.actions, self.log_probs, self.values, self.advantages, self.returns)
        return Minibatch(
            *(observations.apply(functools.partial(_pick, (rows, times)), x) for x in per_step),
            memory=self.trace.single_steps(workers, times),
            valid=valid,
        )
