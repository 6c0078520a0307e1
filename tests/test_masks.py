"""The memory windows and masks, pinned against hand-written tables."""

from __future__ import annotations

import torch
from conftest import small_config

from memories.trxl import EpisodicLayout, TrXLTrace, band_mask, ring_mask


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
