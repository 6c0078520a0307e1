"""The Transformer-XL network of the episodic memory (TrXL, optionally gated as GTrXL): blocks, attention, one block loop.

Shapes (legend as in buffer.py): B batch, Q queries per batch row, S memory slots per batch row,
K blocks, D embed dim, H heads, d = D / H head width.

The current step is one token per query. Block i attends from that token (the query) to block i's memory:
the inputs block i received at earlier steps of the same episode. Which slots hold which steps, and which of them a
query sees, is the memory layout's business (memories/trxl.py); here every path (rollout with a K/V cache, training on
sequence chunks, the plain per-window specification) goes through the same two calls per block:

    k, v = transformer.project_block(i, memory_i, positions)   # memory tokens -> keys/values, (B, H, S, d)
    h = block(h, k, v, attention)                              # (B, Q, D) queries attend to the slots mask allows

Where a step sits in its episode reaches attention in one of two ways (``positional_encoding``):
- added to the tokens: "relative" (a sinusoid of the episode step, the reference's) or "learned" (a table) is added to
  every memory token (and with ``query_position`` to the query), so attention sees *when in the episode* each step was;
- by distance only: "rotary" turns each head's query and key vectors by angles proportional to their episode steps
  (RoFormer), so that their dot product depends on the distance between the two steps alone; "alibi" adds
  -slope_h x distance to head h's attention scores (Press et al., 2022), a recency bias with one fixed slope per head.
  ``recency_bias`` adds that bias on top of "relative", "learned" or "rotary": when and how long ago, both.
  Either way attention sees *how long ago* a step was, and a step 400 of an episode looks like step 40 did.

A query with no visible memory slot (the first step of an episode) gets no attention contribution at all: the
attention output is exactly zero, whatever the padding holds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from config import TransformerConfig

LEARNED_POSITIONS = 2048  # rows of the learned positional table; later episode steps get the sinusoidal encoding

# Per block (k, v), each (B, H, S, d), or a function (block index, block input (B, Q, D)) -> (k, v).
KeyValueSource = list[tuple[torch.Tensor, torch.Tensor]] | Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def sinusoidal_encoding(steps: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal position encoding of integer episode steps.

    Args:
        steps: (...) integer episode steps.
        dim: encoding width D (even).

    Returns:
        (..., D) float32 encoding.
    """
    angles = step_angles(steps, dim)  # (..., D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def step_angles(steps: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., dim/2) float32 angles steps x 10000^(-2j/dim) of integer ``steps`` (...): the sinusoid's and rotary's."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, device=steps.device, dtype=torch.float32) * (-math.log(10000.0) / half))
    return steps.to(torch.float32).unsqueeze(-1) * frequencies


class GRUGate(nn.Module):
    """GTrXL gating layer: a GRU-style gate that replaces the residual connection ``x + y``.

    As the reference: six D x D weight matrices, each Xavier-uniform initialised (stored fused, three for the sub-layer
    output y and three for the stream x, so that each side is one matrix product), and a learned gate bias per unit,
    initialised to ``bias``; larger values start the gate closer to the identity (the stream passes through).
    """

    def __init__(self, dim: int, bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(dim, 3 * dim, bias=False)  # W_r, W_z, W_g from the sub-layer output y
        self.u_rz = nn.Linear(dim, 2 * dim, bias=False)  # U_r, U_z from the stream x
        self.u_g = nn.Linear(dim, dim, bias=False)
        self.bias = nn.Parameter(torch.full((dim,), float(bias)))
        with torch.no_grad():
            for weight in (self.w.weight, self.u_rz.weight, self.u_g.weight):
                for block in weight.split(dim):  # each D x D matrix with its own fan-in and fan-out
                    nn.init.xavier_uniform_(block)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gate the stream ``x`` (B, Q, D) with the sub-layer output ``y`` (B, Q, D)."""
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u_rz(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h


def rotary_angles(steps: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines (B, 1, S, d/2) of the rotary angles of integer episode ``steps`` (B, S) for heads of width d.

    Pair j of a head's vector turns by steps x 10000^(-2j/d), as RoFormer's; see ``rotate``.
    """
    angles = step_angles(steps, head_dim).unsqueeze(1)  # (B, 1, S, d/2)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Turn each pair (x_j, x_{j + d/2}) of heads ``x`` (B, H, S, d) by the angles of ``rotary_angles`` (B, 1, S, d/2).

    A query turned by its step m and a key turned by its step n have the dot product of the unturned pair turned by
    m - n: it depends on the distance only.
    """
    cos, sin = rotation
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's fixed slope per head, (H,), as Press et al. (2022) define them.

    For H a power of two, the geometric sequence 2^(-8 / H), 2^(-16 / H), ..., 2^(-8). For other H, not the geometric
    sequence of H: the P slopes of the largest power of two P < H, followed by the first H - P of every other slope
    of 2 P (its 1st, 3rd, ...: those that fall between the P slopes), as the paper's code does; e.g. H = 6:
    2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3.
    """

    def geometric(n: int) -> torch.Tensor:
        return torch.pow(2.0, -8.0 * torch.arange(1, n + 1, dtype=torch.float32) / n)

    lower = 2 ** int(math.log2(num_heads))
    if lower == num_heads:
        return geometric(num_heads)
    return torch.cat([geometric(lower), geometric(2 * lower)[0::2][: num_heads - lower]])


class KeyPositions(NamedTuple):
    """How the episode steps of memory tokens enter their keys and values (``Transformer.key_positions``)."""

    additive: torch.Tensor | None  # (B, S, K, D) encoding added to the tokens ("relative", "learned"), or None
    rotation: tuple[torch.Tensor, torch.Tensor] | None  # rotary cosines and sines (B, 1, S, d/2) of the keys, or None


class AttentionMask(NamedTuple):
    """What every block's attention needs besides its keys and values, built once per forward pass for all blocks."""

    has_memory: torch.Tensor  # (B, Q, 1) True for rows with at least one visible slot
    safe_mask: torch.Tensor  # (B, 1, Q, S) boolean: the mask with slot 0 opened for empty rows (their output is zeroed);
    # or (B, H, Q, S) float: 0 or ALiBi's bias where visible, -inf elsewhere
    query_rotation: tuple[torch.Tensor, torch.Tensor] | None = None  # rotary (cos, sin) (B, 1, Q, d/2) of the queries

    @classmethod
    def build(
        cls,
        mask: torch.Tensor,
        bias: torch.Tensor | None = None,
        query_rotation: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> AttentionMask:
        """From a (B, Q, S) boolean mask, True where a query may attend to a memory slot, an optional score bias
        (B, H, Q, S) and the queries' rotary angles."""
        has_memory = mask.any(dim=-1, keepdim=True)
        # A fully masked row is undefined in softmax (NaN on some kernels): open slot 0 for it, then zero its output.
        first_slot = torch.zeros_like(mask)
        first_slot[..., 0] = True
        safe_mask = (mask | (first_slot & ~has_memory)).unsqueeze(1)  # (B, 1, Q, S)
        if bias is not None:
            safe_mask = bias.masked_fill(~safe_mask, float("-inf"))  # (B, H, Q, S)
        return cls(has_memory, safe_mask, query_rotation)


def attention_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype attention computes in for keys and queries of ``dtype`` on ``device``: float32 on the CPU (also under
    bfloat16 autocast, see MultiHeadAttention.forward), ``dtype`` elsewhere. The rollout's key/value cache is kept in
    it, so that a step converts no cached keys and values."""
    return torch.float32 if device.type == "cpu" else dtype


class MultiHeadAttention(nn.Module):
    """Multi-head cross-attention from query tokens to projected memory slots (full D x D projections)."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Linear(embed_dim, embed_dim, bias=False)
        self.key_value = nn.Linear(embed_dim, 2 * embed_dim, bias=False)
        self.out = nn.Linear(embed_dim, embed_dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (B, H, S, d)."""
        b, s, d = x.shape
        return x.view(b, s, self.num_heads, d // self.num_heads).transpose(1, 2)

    def project_memory(self, memory: torch.Tensor, values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of memory tokens (B, S, D), each (B, H, S, d); with ``values`` (B, S, D) the values are
        projected from those instead (the same tokens without their positions)."""
        if values is None:
            k, v = self.key_value(memory).chunk(2, dim=-1)
        else:
            weight_k, weight_v = self.key_value.weight.chunk(2, dim=0)
            k, v = F.linear(memory, weight_k), F.linear(values, weight_v)
        return self.split_heads(k), self.split_heads(v)

    def forward(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` (B, Q, D) to ``k``/``v`` (B, H, S, d) where ``mask`` allows.

        Returns the output (B, Q, D), zero for rows without any visible slot, and, if asked, the attention
        weights (B, H, Q, S) (zero rows where nothing is visible).
        """
        has_memory, safe_mask, query_rotation = mask
        q = self.split_heads(self.query(query))  # (B, H, Q, d)
        if query_rotation is not None:
            q = rotate(q, query_rotation)
        # On the CPU the attention itself runs in float32 also under bfloat16 autocast, so that the scores and the
        # recency bias keep float32's precision: masked CartPole learnt worse with it in bfloat16, and the steps/s
        # are the same either way (results/ablations/bfloat16/README.md).
        in_float32 = attention_dtype(q.device, q.dtype) != q.dtype
        if in_float32:
            q, k, v = q.float(), k.float(), v.float()
        if safe_mask.is_floating_point():
            safe_mask = safe_mask.to(q.dtype)  # SDPA wants a float mask in the query's dtype (bfloat16 under autocast)
        weights = None
        with torch.autocast("cpu", enabled=False) if in_float32 else contextlib.nullcontext():
            if return_weights:
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Q, S)
                if safe_mask.is_floating_point():
                    scores = scores + safe_mask
                else:
                    scores = scores.masked_fill(~safe_mask, float("-inf"))
                weights = scores.softmax(dim=-1) * has_memory.unsqueeze(1)
                attended = weights @ v
            else:
                attended = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask)  # (B, H, Q, d)
        b, h, n, d = attended.shape
        attended = attended.transpose(1, 2).reshape(b, n, h * d)  # (B, Q, D)
        return torch.where(has_memory, self.out(attended), 0.0), weights


class TransformerBlock(nn.Module):
    """Attention to the block's memory, then a position-wise Linear + ReLU; residual or GRU gate around each."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.layer_norm = config.layer_norm
        self.attention = MultiHeadAttention(dim, config.num_heads)
        self.feed_forward = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        if config.layer_norm:
            self.norm_attention = nn.LayerNorm(dim)
            self.norm_feed_forward = nn.LayerNorm(dim)
        if config.layer_norm == "pre":
            self.norm_memory = nn.LayerNorm(dim)
        self.gates = nn.ModuleList([GRUGate(dim, config.gtrxl_bias) for _ in range(2)]) if config.gtrxl else None

    def project_memory(self, memory: torch.Tensor, values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, S, d) of memory tokens (B, S, D) that already carry their position encoding; with
        ``values`` (B, S, D), the tokens without it, the values come from those."""
        if self.layer_norm == "pre":
            memory = self.norm_memory(memory)
            values = None if values is None else self.norm_memory(values)
        return self.attention.project_memory(memory, values)

    def _join(self, index: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.gates[index](x, y) if self.gates is not None else x + y

    def forward(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: AttentionMask,
        return_weights: bool = False,
        query_position: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One block on the query tokens ``x`` (B, Q, D); returns (B, Q, D) and optional weights (B, H, Q, S).

        ``query_position`` (B, Q, D), the encoding of the query's own episode step, is added to the attention query as
        memory tokens get theirs, not to the residual stream.
        """
        query = x if query_position is None else x + query_position
        query = self.norm_attention(query) if self.layer_norm == "pre" else query
        attended, weights = self.attention(query, k, v, mask, return_weights)
        h = self._join(0, x, attended)
        if self.layer_norm == "post":
            h = self.norm_attention(h)
        forward = self.feed_forward(self.norm_feed_forward(h) if self.layer_norm == "pre" else h)
        out = self._join(1, h, forward)
        if self.layer_norm == "post":
            out = self.norm_feed_forward(out)
        return out, weights


class Transformer(nn.Module):
    """An input embedding, then K blocks over one query token per step, each attending to its own episodic memory."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        # The reference's input embedding (Linear + ReLU on the encoder's output), before the first block.
        self.embedding = nn.Linear(config.embed_dim, config.embed_dim)
        nn.init.orthogonal_(self.embedding.weight, math.sqrt(2))
        if config.positional_encoding == "learned":
            # One table for all blocks, initialised as the reference does.
            self.learned_positions = nn.Parameter(torch.randn(LEARNED_POSITIONS, config.embed_dim))
        self.blocks = nn.ModuleList([TransformerBlock(config) for _ in range(config.num_blocks)])
        self.output_norm = nn.LayerNorm(config.embed_dim) if config.output_norm else None
        self.recency_bias = config.has_recency_bias
        if self.recency_bias:
            slopes = alibi_slopes(config.num_heads).view(1, -1, 1, 1)
            if config.learned_slopes:  # a parameter of the memory, trained at the memory's rate
                self.alibi_slopes = nn.Parameter(slopes)
            else:
                self.register_buffer("alibi_slopes", slopes, persistent=False)

    def position_encoding(self, steps: torch.Tensor, max_step: int | None = None) -> torch.Tensor | None:
        """Per-block encoding (B, S, K, D) added to memory tokens at episode ``steps`` (B, S), or None where the
        encoding adds nothing to the tokens (none, "rotary", "alibi").

        ``max_step``: an upper bound of ``steps`` that the host knows (the rollout's, ``TrXLState.largest_step``), so
        that "learned" need not ask the device whether a step lies beyond its table (a synchronisation on a GPU);
        None: it asks.
        """
        kind = self.config.positional_encoding
        if kind == "relative":
            encoding = sinusoidal_encoding(steps, self.config.embed_dim).unsqueeze(2)  # (B, S, 1, D)
            return encoding.expand(-1, -1, self.config.num_blocks, -1)  # the same for every block, as a view
        if kind == "learned":
            encoding = self.learned_positions[steps.clamp(0, LEARNED_POSITIONS - 1)]  # (B, S, D)
            beyond = steps >= LEARNED_POSITIONS  # (B, S) steps the table has no row for (Endless tasks)
            any_beyond = max_step >= LEARNED_POSITIONS if max_step is not None else bool(beyond.any())
            if any_beyond:
                # Sharing the last row would make all later steps look alike; the sinusoid keeps them apart.
                encoding = torch.where(beyond.unsqueeze(-1), sinusoidal_encoding(steps, self.config.embed_dim), encoding)
            return encoding.unsqueeze(2).expand(-1, -1, self.config.num_blocks, -1)  # the same for every block
        return None

    def key_positions(self, steps: torch.Tensor, max_step: int | None = None) -> KeyPositions:
        """How memory tokens at episode ``steps`` (B, S) carry their position into every block's keys and values
        (``max_step``: see ``position_encoding``)."""
        rotation = None
        if self.config.positional_encoding == "rotary":
            rotation = rotary_angles(steps, self.config.embed_dim // self.config.num_heads)
        return KeyPositions(self.position_encoding(steps, max_step), rotation)

    def project_memory(
        self, memory: torch.Tensor, steps: torch.Tensor, max_step: int | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of every block's memory.

        Args:
            memory: (B, S, K, D) memory tokens (any float dtype; computed in float32).
            steps: (B, S) episode step of each token.
            max_step: an upper bound of ``steps`` known on the host, or None (see ``position_encoding``).

        Returns:
            K pairs (k, v), each (B, H, S, d).
        """
        memory = memory.float()
        positions = self.key_positions(steps, max_step)
        return [self.project_block(i, memory[:, :, i], positions) for i in range(len(self.blocks))]

    def project_block(self, i: int, memory: torch.Tensor, positions: KeyPositions) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, S, d) of block i's memory tokens (B, S, D) at the positions ``key_positions`` gave."""
        if positions.additive is None:
            k, v = self.blocks[i].project_memory(memory)
        else:
            # Positions select (keys); with positional_values false they do not drown what is read (values).
            encoded = memory + positions.additive[:, :, i]
            k, v = self.blocks[i].project_memory(encoded, None if self.config.positional_values else memory)
        if positions.rotation is not None:
            k = rotate(k, positions.rotation)
        return k, v

    def forward(
        self,
        h: torch.Tensor,
        keys_values: KeyValueSource,
        mask: torch.Tensor,
        return_weights: bool = False,
        query_steps: torch.Tensor | None = None,
        key_steps: torch.Tensor | None = None,
        max_step: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """Run the blocks: the one block loop of every path (rollout, training chunks, plain windows).

        Args:
            h: (B, Q, D) encoded observations, one per query step (the input embedding comes first).
            keys_values: per block (k, v), each (B, H, S, d); or a function (i, block i's input (B, Q, D)) -> (k, v),
                for memories whose slots hold this very pass's block inputs (see TrXLMemory's memory_gradients).
            mask: (B, Q, S) True where a query may attend to a memory slot.
            return_weights: also return each block's attention weights.
            query_steps: (B, Q) episode step of each query; needed with ``query_position``, "rotary" and "alibi".
            key_steps: (B, S) episode step of each memory slot; needed with "alibi" (its bias is by distance).
            max_step: an upper bound of ``query_steps`` known on the host, or None (see ``position_encoding``).

        Returns:
            out (B, Q, D); tokens (B, Q, K, D), the block inputs, i.e. the new memory tokens of these steps;
            per-block weights (B, H, Q, S) or None.
        """
        source = keys_values if callable(keys_values) else (lambda i, _: keys_values[i])
        h = torch.relu(self.embedding(h))
        tokens = []
        weights = [] if return_weights else None
        attention_mask = self.attention_mask(mask, query_steps, key_steps)
        query = self.config.query_position and self.config.positional_encoding in ("relative", "learned")
        if query and query_steps is None:
            raise ValueError("transformer.query_position needs the episode step of each query: pass query_steps")
        query_positions = self.position_encoding(query_steps, max_step) if query else None  # (B, Q, K, D)
        for i, block in enumerate(self.blocks):
            tokens.append(h)
            k, v = source(i, h)
            query_position = None if query_positions is None else query_positions[:, :, i]
            h, w = block(h, k, v, attention_mask, return_weights, query_position)
            if return_weights:
                weights.append(w)
        if self.output_norm is not None:
            h = self.output_norm(h)
        return h, torch.stack(tokens, dim=2), weights

    def attention_mask(
        self, mask: torch.Tensor, query_steps: torch.Tensor | None, key_steps: torch.Tensor | None
    ) -> AttentionMask:
        """The mask (B, Q, S) with what the encoding adds to attention: rotary angles of the queries and ALiBi's bias
        (``positional_encoding`` "alibi", or ``recency_bias`` with another encoding)."""
        rotary = self.config.positional_encoding == "rotary"
        if not (rotary or self.recency_bias):
            return AttentionMask.build(mask)
        if query_steps is None or (self.recency_bias and key_steps is None):
            raise ValueError(
                f"positional_encoding '{self.config.positional_encoding}' with recency_bias {self.recency_bias} needs "
                "the episode steps of the queries and memory slots: pass query_steps and key_steps"
            )
        rotation = rotary_angles(query_steps, self.config.embed_dim // self.config.num_heads) if rotary else None
        bias = None
        if self.recency_bias:
            distance = (query_steps.unsqueeze(2) - key_steps.unsqueeze(1)).unsqueeze(1).float()  # (B, 1, Q, S)
            bias = -self.alibi_slopes * distance  # (B, H, Q, S)
        return AttentionMask.build(mask, bias=bias, query_rotation=rotation)
