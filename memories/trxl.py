"""The episodic TrXL/GTrXL memory: where its tokens live, which of them each step sees, and the three ways to run it.

Shapes (legend as in buffer.py): N workers, T rollout steps, L memory length, K blocks, D embed dim, H heads,
d head width, B chunks, C steps per chunk, S = C + L - 1 slots of a chunk; for minibatches of single steps B rows
(workers) of Q sampled steps each.

A memory token of a step is the K block inputs of that step, (K, D). At episode step t a step attends to the L most
recent tokens of its episode, steps [max(0, t - L), t). ``EpisodicLayout`` is the one place that knows where those
tokens live:

Rollouts and evaluation keep, per worker, a ring of the last L tokens: step s lives in ring slot s % L. At episode
step t the visible steps are the first t slots while t < L, and all L slots once t >= L, so the mask needs nothing
but t. Attention does not care about slot order: each token carries its position through the positional encoding
of its own episode step.

Training keeps, per worker, a trace: the L tokens carried in from before this rollout, then the T tokens written
during it, (N, L + T, K, D). Step t's own token sits in slot L + t, so the window of step t is the L slots just
before it, [t, t + L), and ``trace.unfold(1, L, 1)[:, t]`` is that window as a view. Slots of another episode (or the
initial padding, episode id -1) are masked. L = 4, an episode starting at slot 4, slots 0-3 holding the previous one:

    episode step t   window = trace slots   visible (same episode, before t)
    0                0 1 2 3                - - - -
    1                1 2 3 4                - - - x
    2                2 3 4 5                - - x x
    3                3 4 5 6                - x x x
    4                4 5 6 7                x x x x
    5                5 6 7 8                x x x x   (steps 1..4)

A chunk of C consecutive steps j C .. j C + C - 1 uses the S = C + L - 1 trace slots [j C, j C + S): L carried-in
slots, then the tokens of the chunk's steps 0 .. C - 2; query q's window is the band [q, q + L) (``band_mask``).

A minibatch of single steps sampled across the rollout (``minibatch_sampling: steps``) has one row per worker in it:
that worker's whole trace, L + T slots, and its Q sampled steps as queries; the query of rollout step t sees the
window [t, t + L) of the row's slots (``window_mask``), wherever in the rollout t lies.

Three paths, equal in their numbers (tests/test_equivalence.py, tests/test_step_minibatches.py):
- fast: rollouts cache every token's keys and values when it is written (a step costs O(D^2 + L D)); training
  projects each of a chunk's S slots once and lets the C queries attend to their bands in one call (single steps:
  each row's L + T slots once, its Q queries attend to their windows in one call);
- plain, the executable specification: every step projects its own window, O(L D^2);
- fast with ``memory_gradients``: training recomputes the slots of the chunk's own steps in the same pass, with
  gradient, as Transformer-XL trains on segments.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from config import TransformerConfig, check_memory_rules
from memories.base import Memory, MemoryOutput, MemoryState, MemoryTrace
from transformer import KeyValueSource, Transformer, attention_dtype


def window_mask(
    key_episodes: torch.Tensor, query_episodes: torch.Tensor, starts: torch.Tensor, memory_length: int
) -> torch.Tensor:
    """Which memory slots each query may attend to: the slots of its window [start, start + L) of its own episode.

    Args:
        key_episodes: (B, S) episode id of each memory slot (-1 for padding, which nothing sees).
        query_episodes: (B, Q) episode id of each query step.
        starts: (B, Q) or (1, Q) first slot of each query's window.
        memory_length: L.

    Returns:
        (B, Q, S) boolean mask.
    """
    slot = torch.arange(key_episodes.shape[1], device=key_episodes.device)  # (S,)
    first = starts.unsqueeze(2)  # (B, Q, 1)
    band = (slot >= first) & (slot < first + memory_length)  # (B, Q, S)
    return band & (key_episodes.unsqueeze(1) == query_episodes.unsqueeze(2))


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
    starts = torch.arange(query_episodes.shape[1], device=key_episodes.device).unsqueeze(0)  # (1, C): query q at slot q
    return window_mask(key_episodes, query_episodes, starts, memory_length)


def ring_mask(episode_steps: torch.Tensor, memory_length: int) -> torch.Tensor:
    """(N, L) visible ring slots of workers at episode steps ``episode_steps`` (N,); see the module docstring."""
    return torch.arange(memory_length, device=episode_steps.device) < episode_steps.clamp(max=memory_length).unsqueeze(1)


class EpisodicLayout:
    """The slot conventions of the ring (rollouts) and the trace (training), in one place; see the module docstring."""

    def __init__(self, memory_length: int) -> None:
        self.length = memory_length

    def ring_slot(self, episode_steps: torch.Tensor) -> torch.Tensor:
        """Ring slot (N,) of the token of episode step ``episode_steps`` (N,)."""
        return episode_steps % self.length

    def ring_mask(self, episode_steps: torch.Tensor) -> torch.Tensor:
        """(N, L) ring slots visible at episode steps (N,)."""
        return ring_mask(episode_steps, self.length)

    def ring_span(self, episode_steps: np.ndarray) -> int:
        """How many leading ring slots can be visible to any of the workers at episode steps (N,), as the host knows
        them (``TrXLState.host_steps``, so that no step waits for the device): slot j holds step j until the ring
        wraps."""
        return max(1, min(self.length, int(episode_steps.max())))

    def ring_order(self, episode_step: int) -> np.ndarray:
        """Ring slots of the visible steps of one worker at ``episode_step``, oldest first."""
        visible = min(episode_step, self.length)
        return np.arange(episode_step - visible, episode_step) % self.length

    def trace_slot(self, t: int | torch.Tensor) -> int | torch.Tensor:
        """Trace slot of rollout step t's own token (t an int or a tensor of steps): after the L carried-in slots."""
        return self.length + t

    def window_start(self, t: int | torch.Tensor) -> int | torch.Tensor:
        """First trace slot of rollout step t's window [t, t + L): the L slots just before its own token."""
        return t

    def windows(self, field: torch.Tensor) -> torch.Tensor:
        """Every step's window of a trace field (N, L + T, ...) as a view (N, T + 1, ..., L); index T is the window of
        the step after the rollout."""
        return field.unfold(1, self.length, 1)

    def chunk_span(self, chunk_length: int) -> int:
        """S = C + L - 1: the trace slots that the windows of C consecutive steps cover."""
        return chunk_length + self.length - 1

    def chunk_slots(self, field: torch.Tensor, chunk_length: int) -> torch.Tensor:
        """(N, T / C, ..., S) view of a trace field (N, L + T, ...): chunk j covers slots [j C, j C + S)."""
        return field.unfold(1, self.chunk_span(chunk_length), chunk_length)

    def band_mask(self, key_episodes: torch.Tensor, query_episodes: torch.Tensor) -> torch.Tensor:
        """(B, C, S) mask of a chunk's queries over its slots; see ``band_mask``."""
        return band_mask(key_episodes, query_episodes, self.length)

    def chunk_windows(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, C, ..., L) view of every query's window from a chunk's slots (B, S, ...)."""
        return slots.unfold(1, self.length, 1)

    def carried(self) -> int:
        """Leading slots of a chunk carried in from before it; the rest hold the chunk's own steps 0 .. C - 2."""
        return self.length

    def step_mask(self, key_episodes: torch.Tensor, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask of single steps over their worker's whole trace.

        Args:
            key_episodes: (B, L + T) episode id of each trace slot of the row's worker.
            times: (B, Q) rollout step of each query.

        Returns:
            (B, Q, L + T) mask: query (b, q) sees the slots of its window [t, t + L) of its own episode;
            (B, Q) episode id of each query (that of its own token's slot).
        """
        query_episodes = key_episodes.gather(1, self.trace_slot(times))
        return window_mask(key_episodes, query_episodes, self.window_start(times), self.length), query_episodes

    def step_windows(self, field: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """(B, Q, ..., L) windows of single steps at rollout steps ``times`` (B, Q), from trace rows (B, L + T, ...)."""
        rows = torch.arange(field.shape[0], device=field.device).unsqueeze(1)  # (B, 1)
        return self.windows(field)[rows, self.window_start(times)]


class TrXLRecord(NamedTuple):
    """What the trace keeps of n steps."""

    tokens: torch.Tensor  # (n, K, D) block inputs
    steps: torch.Tensor  # (n,) episode step
    episodes: torch.Tensor  # (n,) episode id (unique per worker)


class TrXLContext(NamedTuple):
    """The memory of B chunks of C steps: their S = C + L - 1 trace slots.

    For B rows of Q single steps (``TrXLTrace.single_steps``) the same fields hold each row's whole trace,
    S = L + T slots, with C read as Q, and ``starts`` says where each query's window begins.
    """

    memory: torch.Tensor  # (B, S, K, D) memory tokens, no gradient
    steps: torch.Tensor  # (B, S) episode step of each slot
    mask: torch.Tensor  # (B, C, S) which slots each step sees (band_mask, or window_mask for single steps)
    windows_visible: torch.Tensor  # (B, C, L) the same per step window (for the plain path)
    starts: torch.Tensor | None = None  # (B, Q) first slot of each single step's window; None for chunks (slot q)
    query_steps: torch.Tensor | None = None  # (B, C) episode step of each query (for ``query_position``)


class TrXLState(MemoryState):
    """Per-worker rings of the last L memory tokens, with the fast path's K/V cache.

    The episode steps are kept twice: on the device for the computations, and on the host, where the rollout knows
    which episodes ended (``end_episodes`` takes its host array), so that a step asks the device nothing: how many
    ring slots it reads (``EpisodicLayout.ring_span``) and whether a step lies beyond the learned positional table
    are host arithmetic.

    Attributes:
        tokens: (N, L, K, D) raw memory tokens in the memory dtype, ring slot = episode step % L.
        token_steps: (N, L) episode step of each ring slot.
        episode_steps: (N,) episode step of each worker's current step.
        host_steps: (N,) numpy int64, the same as ``episode_steps`` on the host.
        largest_step: the largest episode step any worker has reached (tokens and current steps are at most it).
        episode_ids: (N,) running episode counter of each worker (unique per worker).
        keys_values: per block (N, H, L, d) cached keys and values (fast path), None until computed.
    """

    def __init__(self, n_workers: int, config: TransformerConfig, dtype: torch.dtype, device: torch.device) -> None:
        length, k, d = config.memory_length, config.num_blocks, config.embed_dim
        self.tokens = torch.zeros(n_workers, length, k, d, dtype=dtype, device=device)
        self.token_steps = torch.zeros(n_workers, length, dtype=torch.long, device=device)
        self.episode_steps = torch.zeros(n_workers, dtype=torch.long, device=device)
        self.host_steps = np.zeros(n_workers, dtype=np.int64)
        self.largest_step = 0
        self.episode_ids = torch.zeros(n_workers, dtype=torch.long, device=device)
        self.keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def end_episodes(self, done: np.ndarray | torch.Tensor) -> None:
        # A device tensor costs one synchronisation for the host's copy of the steps; the rollout passes its host array.
        host_done = done if isinstance(done, np.ndarray) else done.cpu().numpy()
        self.host_steps[host_done] = 0
        done = torch.as_tensor(done, device=self.episode_steps.device)
        # Elementwise, not boolean-mask writes: no host synchronisation on a GPU.
        self.episode_steps.mul_(~done)
        self.episode_ids.add_(done)

    def advance(self) -> None:
        """Every worker's episode goes on to its next step (``TrXLMemory.commit``)."""
        self.episode_steps += 1
        self.host_steps += 1
        self.largest_step = max(self.largest_step, int(self.host_steps.max()))

    def state_dict(self) -> dict[str, torch.Tensor]:
        names = ("tokens", "token_steps", "episode_steps", "episode_ids")
        return {name: getattr(self, name).cpu().clone() for name in names}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, value in state.items():
            getattr(self, name).copy_(value)
        self.host_steps = state["episode_steps"].cpu().numpy().astype(np.int64)
        self.largest_step = int(max(state["episode_steps"].max(), state["token_steps"].max()))
        self.keys_values = None  # re-projected with the current weights on first use


class TrXLTrace(MemoryTrace):
    """Each worker's trace (module docstring): ``trace`` (N, L + T, K, D), ``steps`` and ``episodes`` (N, L + T)."""

    def __init__(
        self, layout: EpisodicLayout, n_workers: int, worker_steps: int, config: TransformerConfig, dtype: torch.dtype,
        device: torch.device,
    ) -> None:  # fmt: skip
        self.layout = layout
        slots = layout.length + worker_steps
        self.trace = torch.zeros(n_workers, slots, config.num_blocks, config.embed_dim, dtype=dtype, device=device)
        self.steps = torch.zeros(n_workers, slots, dtype=torch.long, device=device)
        self.episodes = torch.full((n_workers, slots), -1, dtype=torch.long, device=device)

    def _fields(self) -> dict[str, torch.Tensor]:
        return {"tokens": self.trace, "steps": self.steps, "episodes": self.episodes}

    def start_rollout(self) -> None:
        """Carry the last L slots of the previous rollout to the front."""
        length = self.layout.length
        for field in self._fields().values():
            field[:, :length] = field[:, -length:].clone()

    def record(self, t: int, record: TrXLRecord) -> None:
        slot = self.layout.trace_slot(t)
        self.trace[:, slot] = record.tokens.to(self.trace.dtype)
        self.steps[:, slot] = record.steps
        self.episodes[:, slot] = record.episodes

    def windows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of every step's window: memory (N, T + 1, K, D, L), steps and episodes (N, T + 1, L)."""
        return self.layout.windows(self.trace), self.layout.windows(self.steps), self.layout.windows(self.episodes)

    def chunks(self, workers: torch.Tensor, chunks: torch.Tensor, length: int) -> TrXLContext:
        layout = self.layout
        memory = layout.chunk_slots(self.trace, length)[workers, chunks]  # (B, K, D, S)
        keys = layout.chunk_slots(self.episodes, length)[workers, chunks]  # (B, S)
        n_chunks = (self.trace.shape[1] - layout.length) // length
        queries = self.episodes[:, layout.carried() :].reshape(len(self.episodes), n_chunks, length)[workers, chunks]
        return TrXLContext(
            memory=memory.permute(0, 3, 1, 2),  # (B, S, K, D)
            steps=layout.chunk_slots(self.steps, length)[workers, chunks],
            mask=layout.band_mask(keys, queries),
            windows_visible=layout.chunk_windows(keys) == queries.unsqueeze(2),  # (B, C, L)
            query_steps=self.steps[:, layout.carried() :].reshape(len(self.steps), n_chunks, length)[workers, chunks],
        )

    def single_steps(self, workers: torch.Tensor, times: torch.Tensor) -> TrXLContext:
        """The memory of B rows of Q single steps: row b holds worker ``workers[b]``'s whole trace (L + T slots,
        gathered once for all its queries), and query (b, q) is its rollout step ``times[b, q]``.

        Args:
            workers: (B,) the worker of each row.
            times: (B, Q) rollout step of each query (padding repeats one of the row's steps).
        """
        episodes = self.episodes[workers]  # (B, L + T)
        mask, query_episodes = self.layout.step_mask(episodes, times)
        return TrXLContext(
            memory=self.trace[workers],  # (B, L + T, K, D)
            steps=self.steps[workers],
            mask=mask,
            windows_visible=self.layout.step_windows(episodes, times) == query_episodes.unsqueeze(2),  # (B, Q, L)
            starts=self.layout.window_start(times),
            query_steps=self.steps[workers].gather(1, self.layout.trace_slot(times)),
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        length = self.layout.length
        return {name: field[:, -length:].cpu().clone() for name, field in self._fields().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        length = self.layout.length
        for name, field in self._fields().items():
            field[:, -length:] = state[name].to(field.device)


class TrXLMemory(Memory):
    """The episodic Transformer-XL memory (GTrXL with ``gtrxl``), on the fast or the plain path."""

    def __init__(self, config: TransformerConfig, memory_dtype: torch.dtype = torch.float32, path: str = "fast") -> None:
        super().__init__()
        check_memory_rules("trxl", config.memory_gradients, "chunks", path)
        self.config = config
        self.memory_dtype = memory_dtype
        self.path = path
        self.layout = EpisodicLayout(config.memory_length)
        self.transformer = Transformer(config)
        self.output_dim = config.embed_dim

    def start(self, n_workers: int, device: torch.device) -> TrXLState:
        return TrXLState(n_workers, self.config, self.memory_dtype, device)

    @torch.no_grad()
    def sync(self, state: TrXLState) -> None:
        """Re-project the cached keys and values with the current weights (fast path)."""
        if self.path == "fast":
            with self.autocast():
                keys_values = self.transformer.project_memory(state.tokens, state.token_steps, state.largest_step)
            # In the dtype attention computes in (float32 on the CPU also under bfloat16 autocast: the very values it
            # would convert them to), so that each step converts only its new keys and values, in commit, not the
            # whole cached window at every step.
            dtype = attention_dtype(state.tokens.device, keys_values[0][0].dtype)
            state.keys_values = [(k.to(dtype), v.to(dtype)) for k, v in keys_values]

    def step(
        self, h: torch.Tensor, state: TrXLState, index: torch.Tensor | None = None, return_attention: bool = False
    ) -> MemoryOutput:
        """Plain path: the whole window is projected, as the specification says. Fast path: only the first
        S = ``ring_span`` ring slots can be visible, so only their cached keys and values are passed on: attention
        reads as much memory as the episodes have, not L slots.

        Nothing here waits for the device: the span and the largest step come from the host's copy of the episode
        steps (tests/test_host_syncs.py). The span is that of all workers also for a few ``index`` rows (their own
        would need their steps on the host); the slots beyond a row's own span are masked.
        """
        rows = slice(None) if index is None else index
        steps = state.episode_steps[rows]
        mask = self.layout.ring_mask(steps).unsqueeze(1)  # (n, 1, L)
        key_steps = state.token_steps[rows]  # (n, L)
        if self.path == "plain":
            keys_values = self.transformer.project_memory(state.tokens[rows], key_steps, state.largest_step)
        else:
            if state.keys_values is None:
                self.sync(state)
            span = self.layout.ring_span(state.host_steps)
            keys_values = [(k[rows, :, :span], v[rows, :, :span]) for k, v in state.keys_values]
            mask, key_steps = mask[..., :span], key_steps[:, :span]
        out, tokens, weights = self.transformer(
            h.unsqueeze(1), keys_values, mask, return_attention, steps.unsqueeze(1), key_steps, state.largest_step
        )
        # Copies: commit and end_episodes change the state in place, the record keeps this step's.
        return MemoryOutput(out[:, 0], TrXLRecord(tokens[:, 0], steps.clone(), state.episode_ids[rows].clone()), weights)

    @torch.no_grad()
    def commit(self, state: TrXLState, record: TrXLRecord) -> None:
        """Write every worker's token into its ring slot (and its keys and values into the cache), advance the step."""
        rows = torch.arange(record.tokens.shape[0], device=record.tokens.device)
        slots = self.layout.ring_slot(state.episode_steps)
        stored = record.tokens.to(self.memory_dtype)
        state.tokens[rows, slots] = stored
        state.token_steps[rows, slots] = state.episode_steps
        if self.path == "fast":
            if state.keys_values is None:
                self.sync(state)
            with self.autocast():
                new = self.transformer.project_memory(
                    stored.unsqueeze(1), state.episode_steps.unsqueeze(1), state.largest_step
                )  # (N, H, 1, d)
            for (k, v), (new_k, new_v) in zip(state.keys_values, new, strict=True):
                k[rows, :, slots] = new_k[:, :, 0].to(k.dtype)
                v[rows, :, slots] = new_v[:, :, 0].to(v.dtype)
        state.advance()

    def trace(self, n_workers: int, worker_steps: int, device: torch.device) -> TrXLTrace:
        return TrXLTrace(self.layout, n_workers, worker_steps, self.config, self.memory_dtype, device)

    def compilable(self) -> list[nn.Module]:
        """The transformer blocks: the ring and window bookkeeping around them stays plain Python."""
        return list(self.transformer.blocks)

    def forward_chunks(self, h: torch.Tensor, context: TrXLContext) -> MemoryOutput:
        """Fast: each of a chunk's S slots is projected once and the C queries attend to their bands in one call.
        Plain: every step's window is cut out and projected on its own. With ``memory_gradients``: see
        ``_chunk_source``."""
        steps = {"query_steps": context.query_steps, "key_steps": context.steps}
        if self.config.memory_gradients:
            out, tokens, _ = self.transformer(h, self._chunk_source(context), context.mask, **steps)
        elif self.path == "fast":
            keys_values = self.transformer.project_memory(context.memory, context.steps)
            out, tokens, _ = self.transformer(h, keys_values, context.mask, **steps)
        else:
            b, c = h.shape[:2]
            length = self.layout.length
            windows = self.layout.chunk_windows(context.memory)  # (B, C, K, D, L)
            windows = windows.permute(0, 1, 4, 2, 3).reshape(b * c, length, *windows.shape[2:4])  # (B C, L, K, D)
            steps = self.layout.chunk_windows(context.steps).reshape(b * c, length)  # (B C, L)
            visible = context.windows_visible.reshape(b * c, length)  # (B C, L)
            query_steps = None if context.query_steps is None else context.query_steps.reshape(b * c)
            out = self.forward_windows(h.reshape(b * c, -1), windows, steps, visible, query_steps=query_steps)
            return MemoryOutput(out.features.view(b, c, -1), out.record.view(b, c, *out.record.shape[1:]), None)
        return MemoryOutput(out, tokens, None)

    def forward_steps(self, h: torch.Tensor, context: TrXLContext) -> MemoryOutput:
        """Features (B, Q, D) of B rows of Q single steps, h (B, Q, D), with the context ``trace.single_steps`` gave.

        Fast: each row's L + T trace slots are projected once and its Q queries attend to their windows in one call
        per block. Plain: every step's window is cut out of the trace and projected on its own.
        """
        check_memory_rules("trxl", self.config.memory_gradients, "steps", self.path)
        if self.path == "fast":
            keys_values = self.transformer.project_memory(context.memory, context.steps)
            out, tokens, _ = self.transformer(
                h, keys_values, context.mask, query_steps=context.query_steps, key_steps=context.steps
            )
            return MemoryOutput(out, tokens, None)
        b, q = h.shape[:2]
        length = self.layout.length
        windows = self.layout.step_windows(context.memory, context.starts)  # (B, Q, K, D, L)
        windows = windows.permute(0, 1, 4, 2, 3).reshape(b * q, length, *windows.shape[2:4])  # (B Q, L, K, D)
        steps = self.layout.step_windows(context.steps, context.starts).reshape(b * q, length)  # (B Q, L)
        visible = context.windows_visible.reshape(b * q, length)  # (B Q, L)
        query_steps = None if context.query_steps is None else context.query_steps.reshape(b * q)
        out = self.forward_windows(h.reshape(b * q, -1), windows, steps, visible, query_steps=query_steps)
        return MemoryOutput(out.features.view(b, q, -1), out.record.view(b, q, *out.record.shape[1:]), None)

    def _chunk_source(self, context: TrXLContext) -> KeyValueSource:
        """Keys and values with gradients into the memory of the chunk's own steps (``transformer.memory_gradients``).

        Attending to tokens made by the rollout, the observation encoder never learns from a step being useful
        *later*, only from its use at its own step. Here, as in Transformer-XL's training on segments, block i's slots
        of the chunk's own steps hold block i's inputs of this very pass, so the loss of a later step reaches the
        earlier steps' observations; the L slots carried in from before the chunk stay the rollout's. The recomputed
        tokens are rounded to the memory dtype as the rollout stored them, so with the rollout's parameters both give
        the same outputs; they differ once the parameters move.
        """
        carried = self.layout.carried()
        stale = context.memory[:, :carried].float()  # (B, L, K, D)
        positions = self.transformer.key_positions(context.steps)

        def source(i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            own = h[:, :-1]  # (B, C - 1, D) block i's inputs of the chunk's steps 0 .. C - 2
            if self.memory_dtype != torch.float32:
                own = own.to(self.memory_dtype).float()
            slots = torch.cat([stale[:, :, i], own], dim=1)  # (B, S, D)
            return self.transformer.project_block(i, slots, positions)

        return source

    def forward_windows(
        self,
        h: torch.Tensor,
        memory: torch.Tensor,
        steps: torch.Tensor,
        visible: torch.Tensor,
        return_attention: bool = False,
        query_steps: torch.Tensor | None = None,
    ) -> MemoryOutput:
        """The plain path, the executable specification: each step projects its own memory window.

        Args:
            h: (B, D) one embedded observation per row.
            memory: (B, L, K, D) the row's memory window.
            steps: (B, L) episode step of each window slot.
            visible: (B, L) True for the slots of the same episode before this step.
            query_steps: (B,) episode step of each row's own step (needed with ``query_position``).
        """
        keys_values = self.transformer.project_memory(memory, steps)
        query_steps = None if query_steps is None else query_steps.unsqueeze(1)
        out, tokens, weights = self.transformer(
            h.unsqueeze(1), keys_values, visible.unsqueeze(1), return_attention, query_steps, steps
        )
        return MemoryOutput(out[:, 0], tokens[:, 0], weights)

    def attention_over_steps(self, state: TrXLState, attention: list[torch.Tensor], row: int = 0) -> list[np.ndarray]:
        slots = self.layout.ring_order(int(state.host_steps[row]))
        return [w[row, :, 0, slots].float().cpu().numpy() for w in attention]  # numpy has no bfloat16
