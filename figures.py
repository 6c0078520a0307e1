"""Frames that show what the agent attends to: the environment's frame, then one labelled strip per block and head.

Used by ``enjoy.py --record ... --attention`` and by the evaluation video in TensorBoard (``eval_video``).

Reading a strip: it has one cell per memory slot (``memory_length`` cells), the newest past step on the right. Cells of
steps the agent can see are coloured by the attention weight on an absolute scale (dark = 0, yellow = 1, the bar at
the bottom); cells it cannot see yet (the episode is younger than the memory) are grey hatching, so "no attention"
and "nothing there" look different. Each row's weights over the visible cells add up to 1 (none at the first step of
an episode, where nothing is visible).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

MIN_WIDTH = 480  # frames are scaled up by a whole factor to at least this width
LABEL_WIDTH = 104  # pixels left of each strip for its "block k head h" label
ROW_HEIGHT = 16
BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)
PADDING_CELL = ((70, 70, 70), (110, 110, 110))  # hatching of slots that hold no step of this episode
NEW_EPISODE = (220, 60, 60)


def colour(weights: np.ndarray) -> np.ndarray:
    """RGB uint8 (..., 3) of weights in [0, 1]: dark blue at 0 through teal and green to yellow at 1."""
    w = np.clip(weights, 0.0, 1.0)[..., None]
    stops = np.array([[30, 20, 80], [30, 110, 140], [60, 180, 100], [250, 230, 40]], dtype=np.float64)
    position = w * (len(stops) - 1)
    low = np.minimum(position.astype(int), len(stops) - 2)
    fraction = position - low
    rgb = stops[low[..., 0]] * (1 - fraction) + stops[low[..., 0] + 1] * fraction
    return rgb.round().astype(np.uint8)


def _scaled(frame: np.ndarray) -> np.ndarray:
    """The frame (H, W, 3) scaled up by the smallest whole factor that makes it at least MIN_WIDTH wide."""
    factor = max(1, -(-MIN_WIDTH // frame.shape[1]))
    return frame.repeat(factor, axis=0).repeat(factor, axis=1)


def _strip(weights: np.ndarray, slots: int, width: int) -> np.ndarray:
    """(ROW_HEIGHT - 4, width, 3) cells of one head: visible steps (V,) right-aligned, padding hatched on the left."""
    cell_edges = np.linspace(0, width, slots + 1).round().astype(int)
    strip = np.zeros((ROW_HEIGHT - 4, width, 3), dtype=np.uint8)
    visible = len(weights)
    cells = colour(np.concatenate([np.zeros(slots - visible), weights]))
    for j in range(slots):
        left, right = cell_edges[j], cell_edges[j + 1]
        if j < slots - visible:
            hatch = ((np.arange(right - left)[None] + np.arange(strip.shape[0])[:, None]) // 2) % 2  # diagonal stripes
            strip[:, left:right] = np.array(PADDING_CELL, dtype=np.uint8)[hatch]
        else:
            strip[:, left:right] = cells[j]
        if right - left >= 4:
            strip[:, right - 1] = BACKGROUND  # a thin gap between cells where they are wide enough to show it
    return strip


def attention_frame(frame: np.ndarray, attention: list[np.ndarray], memory_length: int, episode: int, step: int) -> np.ndarray:
    """One frame of the figure.

    Args:
        frame: (H, W, 3) uint8 environment frame after the step.
        attention: per block (H_heads, V) weights of the step over its V visible past steps, oldest first.
        memory_length: L, the number of cells per strip.
        episode: 1-based episode number, for the header.
        step: 1-based step of the episode that the attention belongs to.

    Returns:
        (height, width, 3) uint8 image.
    """
    picture = _scaled(frame)
    width = picture.shape[1]
    rows = sum(len(block) for block in attention)
    header, footer = 22, 30
    canvas = Image.new("RGB", (width, header + picture.shape[0] + rows * ROW_HEIGHT + footer + 8), BACKGROUND)
    canvas.paste(Image.fromarray(picture), (0, header))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    visible = len(attention[0][0]) if attention else 0
    draw.text((4, 4), f"episode {episode}  step {step}  sees {visible} of {memory_length} past steps", fill=TEXT, font=font)
    if step == 1:  # the memory was just emptied: an episode boundary
        draw.rectangle([0, header, width - 1, header + picture.shape[0] - 1], outline=NEW_EPISODE, width=3)
        draw.text((width - 96, 4), "new episode", fill=NEW_EPISODE, font=font)
    y = header + picture.shape[0] + 4
    strip_width = width - LABEL_WIDTH - 4
    for b, block in enumerate(attention):
        for h, head in enumerate(block):
            draw.text((4, y + 1), f"block {b + 1} head {h + 1}", fill=TEXT, font=font)
            canvas.paste(Image.fromarray(_strip(np.asarray(head, dtype=np.float64), memory_length, strip_width)),
                         (LABEL_WIDTH, y + 2))  # fmt: skip
            y += ROW_HEIGHT
    draw.text((LABEL_WIDTH, y + 1), "oldest", fill=TEXT, font=font)
    draw.text((width - 44, y + 1), "newest", fill=TEXT, font=font)
    bar = colour(np.linspace(0, 1, 100))[None].repeat(8, axis=0)
    canvas.paste(Image.fromarray(bar), (LABEL_WIDTH + 70, y + 16))
    draw.text((LABEL_WIDTH + 56, y + 13), "0", fill=TEXT, font=font)
    draw.text((LABEL_WIDTH + 174, y + 13), "1  attention weight", fill=TEXT, font=font)
    return np.asarray(canvas)


def gif_bytes(frames: list[np.ndarray], fps: int = 8) -> bytes:
    """Frames (each (H, W, 3) uint8, same size) as an animated GIF in memory."""
    import imageio.v2 as imageio

    buffer = io.BytesIO()
    imageio.mimsave(buffer, frames, format="GIF", duration=1000 / fps, loop=0)
    return buffer.getvalue()
