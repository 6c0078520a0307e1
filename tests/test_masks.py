"""The memory windows and masks, pinned against hand-written tables."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import small_config

from memories.trxl import EpisodicLayout, TrXLTrace, band_mask, ring_mask
from transformer import AttentionMask, MultiHeadAttention


def table(rows: list[str]) -> torch.Tensor:
    """'x' = visible, anything else = masked."""
    return torch.tensor([[char == "x" for char in row.replace(" ", "")] for row in rows])


def make_trace(n: int, t: int, length: int) -> TrXLTrace:
    config = small_config({"num_blocks": 1, "embed_dim": 2, "num_heads": 1, "memory_length": length}).transformer
    return TrXLTrace(EpisodicLayout(length), n, t, config, torch.float32, torch.device("cpu"))


def window_visibility(trace: TrXLTrace, query_episodes: torch.Tensor) -> torch.Tensor:
    """(N, T, L) visibility of every rollout step's window, read off the unfold view."""
    _, _, episodes = trace.windows()  # (N, T + 1, L)
    return episodes[:, : query_episodes.shape[1]] == query_episodes.unsqueeze(2)


def test_design_table_episode_starting_inside_the_trace() -> None:
    # MEMORY-DESIGN.md: L = 4, the episode starts at trace slot 4, slots 0-3 hold the previous episode.
    trace = make_trace(1, 6, 4)
    trace.episodes[0] = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    visible = window_visibility(trace, trace.episodes[:, 4:])
    expected = table(["- - - -", "- - - x", "- - x x", "- x x x", "x x x x", "x x x x"])
    assert torch.equal(visible[0], expected)


def test_windows_are_views_of_the_trace() -> None:
    trace = make_trace(2, 5, 3)
    trace.trace.copy_(torch.arange(trace.trace.numel(), dtype=torch.float32).view_as(trace.trace))
    memory, _, _ = trace.windows()
    assert memory.data_ptr() == trace.trace.data_ptr()  # no copy
    for t in range(6):
        # window t = trace slots [t, t + L), i.e. the L slots before step t's own slot L + t
        assert torch.equal(memory[1, t].permute(2, 0, 1), trace.trace[1, t : t + 3])


def test_episode_end_inside_rollout_and_padding() -> None:
    # L = 3, T = 5; first rollout: slots 0-2 are padding (-1), episode 0 runs steps 0-1, episode 1 starts at step 2.
    trace = make_trace(1, 5, 3)
    episodes = torch.tensor([0, 0, 1, 1, 1])
    trace.episodes[0, 3:] = episodes
    visible = window_visibility(trace, episodes.unsqueeze(0))
    expected = table(["- - -", "- - x", "- - -", "- - x", "- x x"])
    assert torch.equal(visible[0], expected)


def test_rollout_boundary_carries_the_last_l_tokens() -> None:
    trace = make_trace(1, 4, 3)
    trace.episodes[0, 3:] = torch.tensor([5, 5, 5, 6])
    trace.steps[0, 3:] = torch.tensor([7, 8, 9, 0])
    trace.trace[0, 3:, 0, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    trace.start_rollout()
    assert trace.episodes[0, :3].tolist() == [5, 5, 6]
    assert trace.steps[0, :3].tolist() == [8, 9, 0]
    assert trace.trace[0, :3, 0, 0].tolist() == [2.0, 3.0, 4.0]
    # next rollout: episode 6 continues for 2 steps, then episode 7 starts
    episodes = torch.tensor([6, 6, 7, 7])
    trace.episodes[0, 3:] = episodes
    visible = window_visibility(trace, episodes.unsqueeze(0))
    expected = table(["- - x", "- x x", "- - -", "- - x"])
    assert torch.equal(visible[0], expected)


def test_band_mask_docstring_table() -> None:
    keys = torch.tensor([[6, 6, 6, 6, 7, 7]])
    queries = torch.tensor([[6, 7, 7, 7]])
    expected = table(["x x x - - -", "- - - - - -", "- - - - x -", "- - - - x x"])
    assert torch.equal(band_mask(keys, queries, 3)[0], expected)


def test_band_mask_rows_equal_the_windows() -> None:
    generator = torch.Generator().manual_seed(0)
    length, c = 5, 7
    keys = torch.cumsum(torch.rand(3, c + length - 1, generator=generator) < 0.2, dim=1)  # episode ids, non-decreasing
    queries = keys[:, length - 1 :]
    mask = band_mask(keys, queries, length)
    for q in range(c):
        assert not mask[:, q, :q].any() and not mask[:, q, q + length :].any()
        assert torch.equal(mask[:, q, q : q + length], keys[:, q : q + length] == queries[:, q : q + 1])


def test_ring_mask_table() -> None:
    steps = torch.tensor([0, 1, 2, 3, 4, 9])
    expected = table(["- - - -", "x - - -", "x x - -", "x x x -", "x x x x", "x x x x"])
    assert torch.equal(ring_mask(steps, 4), expected)


# Attention's own mask (transformer.py): 2 rows x 3 queries over 5 slots; query 1 of row 0 sees nothing (an episode's
# first step), and the slots it does not see hold whatever the memory's padding holds.
ATTENTION_MASK = torch.stack([table(["x x - - -", "- - - - -", "- x x x -"]), table(["x x x x x", "- - - - x", "x - x - x"])])
HEADS, WIDTH = 2, 12  # head width 6: heads, queries, slots and head width all differ, so a swapped axis shows


def test_attention_mask_opens_slot_0_for_a_query_with_nothing_to_see_and_only_for_it() -> None:
    built = AttentionMask.build(ATTENTION_MASK)
    assert built.has_memory.squeeze(-1).tolist() == [[True, False, True], [True, True, True]]
    expected = ATTENTION_MASK.clone()
    expected[0, 1] = table(["x - - - -"])  # opened for the softmax; the output of that query is zeroed afterwards
    assert torch.equal(built.safe_mask, expected.unsqueeze(1))  # (B, 1, Q, S)
    # A bias (B, H, Q, S) is kept where a slot is visible (or opened) and -inf elsewhere.
    bias = -torch.arange(1.0, 1 + 2 * HEADS * 3 * 5).view(2, HEADS, 3, 5)
    with_bias = AttentionMask.build(ATTENTION_MASK, bias=bias)
    torch.testing.assert_close(with_bias.safe_mask, bias.masked_fill(~expected.unsqueeze(1), float("-inf")))


def attention_by_hand(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention of projected queries q (B, Q, D) over slots k, v (B, H, S, d) where ``ATTENTION_MASK``
    allows, written out head by head and query by query: the heads' outputs side by side (B, Q, D), before the output
    projection, and the weights (B, H, Q, S), 0 for a query that sees nothing."""
    d = WIDTH // HEADS
    weights = torch.zeros(2, HEADS, 3, 5)
    for h in range(HEADS):
        scores = q[..., h * d : (h + 1) * d] @ k[:, h].transpose(1, 2) / math.sqrt(d)  # (B, Q, S), head h's columns
        if bias is not None:
            scores = scores + bias[:, h]
        for b in range(2):
            for i in range(3):
                visible = ATTENTION_MASK[b, i]
                if visible.any():
                    weights[b, h, i, visible] = scores[b, i, visible].softmax(-1)
    return torch.cat([weights[:, h] @ v[:, h] for h in range(HEADS)], dim=-1), weights


def random_attention_inputs() -> tuple[MultiHeadAttention, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention layer, queries (B, Q, D), keys and values (B, H, S, d) with loud padding, and a bias (B, H, Q, S)."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(WIDTH, HEADS)
    query, k, v = torch.randn(2, 3, WIDTH), torch.randn(2, HEADS, 5, WIDTH // HEADS), torch.randn(2, HEADS, 5, WIDTH // HEADS)
    unseen = ~ATTENTION_MASK.any(1)  # (B, S) slots no query sees
    k.transpose(1, 2)[unseen], v.transpose(1, 2)[unseen] = 1e3, -1e3
    return attention, query, k, v, -torch.rand(2, HEADS, 3, 5) * 3


@pytest.mark.parametrize("with_bias", [False, True])
def test_masked_attention_equals_attention_written_out_by_hand(with_bias: bool) -> None:
    attention, query, k, v, bias = random_attention_inputs()
    bias = bias if with_bias else None
    mask = AttentionMask.build(ATTENTION_MASK, bias=bias)
    with torch.no_grad():
        attended, expected_weights = attention_by_hand(attention.query(query), k, v, bias)
        expected = torch.where(ATTENTION_MASK.any(-1, keepdim=True), attention.out(attended), 0.0)
        fast, no_weights = attention(query, k, v, mask)  # scaled_dot_product_attention
        out, weights = attention(query, k, v, mask, return_weights=True)  # the scores written out, for the figures
    assert no_weights is None
    for result in (fast, out):
        torch.testing.assert_close(result, expected)
        assert torch.equal(result[0, 1], torch.zeros(WIDTH))  # exactly 0 for the query that sees nothing
    torch.testing.assert_close(weights, expected_weights)
    assert torch.equal(weights[0, :, 1], torch.zeros(HEADS, 5))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("return_weights", [False, True])
def test_attention_runs_in_float32_under_bfloat16_autocast_on_the_cpu(with_bias: bool, return_weights: bool) -> None:
    # The projections run in bfloat16 under autocast; the scores, the softmax and the weighted sum must not (see
    # MultiHeadAttention.forward). Without the output projection, what comes back is the float32 attention of the
    # bfloat16 queries, keys and values; in bfloat16 it would be off by about 1e-2.
    attention, query, k, v, bias = random_attention_inputs()
    attention.out = torch.nn.Identity()
    bias = bias if with_bias else None
    k, v = k.bfloat16(), v.bfloat16()  # as the key/value projection gives them under autocast
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        q = attention.query(query)
        out, weights = attention(query, k, v, AttentionMask.build(ATTENTION_MASK, bias=bias), return_weights)
    assert q.dtype == torch.bfloat16
    attended, expected_weights = attention_by_hand(q.float(), k.float(), v.float(), bias)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.where(ATTENTION_MASK.any(-1, keepdim=True), attended, 0.0), rtol=1e-5, atol=1e-5)
    if return_weights:
        assert weights.dtype == torch.float32
        torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)
