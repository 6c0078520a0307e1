"""The attention figure: absolute colour scale, padding told apart from visible steps, labels and scaling."""

from __future__ import annotations

import glob

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from conftest import small_config
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from summaries import LABEL_WIDTH, MIN_WIDTH, PADDING_CELL, ROW_HEIGHT, attention_frame, colour
from trainer import PPOTrainer


def strip_cells(image: np.ndarray, frame_height: int, row: int, slots: int) -> np.ndarray:
    """(slots, 3) colour at the middle of each cell of strip ``row`` (counting blocks and heads together)."""
    y = 22 + frame_height + 4 + row * ROW_HEIGHT + ROW_HEIGHT // 2
    width = image.shape[1] - LABEL_WIDTH - 4
    edges = np.linspace(0, width, slots + 1)
    return np.stack([image[y, LABEL_WIDTH + int((edges[j] + edges[j + 1]) / 2) - 1] for j in range(slots)])


def test_cells_use_an_absolute_scale_and_padding_is_hatched() -> None:
    frame = np.full((20, 40, 3), 200, dtype=np.uint8)
    attention = [np.array([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]]), np.array([[1 / 3, 1 / 3, 1 / 3], [0.0, 0.5, 0.5]])]
    image = attention_frame(frame, attention, memory_length=8, episode=2, step=4)
    scale = -(-MIN_WIDTH // 40)
    assert image.shape[1] == 40 * scale >= MIN_WIDTH  # small frames are scaled up by a whole factor
    for row, weights in enumerate([attention[0][0], attention[0][1], attention[1][0], attention[1][1]]):
        cells = strip_cells(image, 20 * scale, row, 8)
        for cell in cells[:5]:  # no step of this episode there yet
            assert tuple(cell) in PADDING_CELL
        assert np.array_equal(cells[5:], colour(weights))  # the same weight gives the same colour in every row
    assert not np.array_equal(colour(np.array(1.0)), colour(np.array(1 / 3)))  # no per-row rescaling to the maximum


def test_episode_start_has_no_visible_cells() -> None:
    frame = np.zeros((84, 84, 3), dtype=np.uint8)
    image = attention_frame(frame, [np.zeros((1, 0))], memory_length=4, episode=1, step=1)
    cells = strip_cells(image, 84 * -(-MIN_WIDTH // 84), 0, 4)
    assert all(tuple(cell) in PADDING_CELL for cell in cells)


@pytest.mark.slow
def test_eval_video_reaches_tensorboard(tmp_path: str) -> None:
    config = small_config(updates=1, eval_interval=1, eval_episodes=1, video_interval=1)
    PPOTrainer(config, "video", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path)).run()
    files = glob.glob(f"{tmp_path}/video/*/events.out.tfevents.*")  # the run's and, at its end, the HParams'
    videos = [
        value
        for events in files
        for event in EventFileLoader(events).Load()
        for value in event.summary.value
        if value.tag == "evaluation/episode"
    ]
    assert len(videos) == 1
    width, height, gif = videos[0].tensor.string_val
    frames = imageio.mimread(gif)
    assert len(frames) >= 2 and frames[0].shape[:2] == (int(height), int(width))
