"""Watch or evaluate a trained agent on unseen seeds.

Usage:
  enjoy.py [options]
  enjoy.py (-h | --help)

Options:
  --model=<path>      Model file written by train.py [default: models/run.nn].
  --episodes=<n>      Number of episodes [default: 1].
  --seed=<n>          Evaluation seed (a stream disjoint from training seeds) [default: 0].
  --no-render         Do not open a window.
  --deterministic     Take the most likely action instead of sampling.
  --record=<file>     Write the frames to a GIF (or .mp4 if imageio can) without a display.
  --attention         Draw each block's attention over the memory window next to the frames (with --record).
  --json              Print the summary as one JSON object on the last line.
  --cpu               Use the CPU even where CUDA is available.
  -h --help           Show this help.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from docopt import docopt

from checkpoint import load_model
from evaluation import evaluate, format_summary, summarize


def heat_row(weights: np.ndarray, width: int, slots: int, height: int) -> np.ndarray:
    """Draw attention weights (V,) over ``slots`` window positions as an RGB strip (height, width, 3), newest right."""
    cells = np.zeros(slots)
    if len(weights):
        cells[slots - len(weights) :] = weights / max(weights.max(), 1e-8)
    columns = np.minimum((np.arange(width) * slots) // width, slots - 1)
    values = cells[columns]
    colour = np.stack([values, values**0.5 * 0.85, 0.3 * (1 - values)], axis=-1)  # dark blue -> yellow
    return np.repeat((colour * 255).astype(np.uint8)[None], height, axis=0)


def attention_panel(frame: np.ndarray, attention: list[np.ndarray], memory_length: int) -> np.ndarray:
    """Stack one strip per block and head under the frame."""
    width = frame.shape[1]
    strips = [frame]
    for block in attention:
        for head in block:
            strips.append(heat_row(head, width, memory_length, 6))
        strips.append(np.full((2, width, 3), 255, dtype=np.uint8))
    return np.concatenate(strips, axis=0)


def write_video(frames: list[np.ndarray], path: str, fps: int = 8) -> None:
    """Write frames (each (H, W, 3) uint8, same size) to a GIF or video file."""
    import imageio.v2 as imageio

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if path.lower().endswith(".gif"):
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
        return
    try:
        imageio.mimsave(path, frames, fps=fps)
    except (ImportError, ValueError, RuntimeError) as error:
        raise ValueError(f"cannot write '{path}' ({error}): use a .gif file, or pip install imageio-ffmpeg for .mp4") from None


def main() -> int:
    args = docopt(__doc__)
    try:
        episodes, seed = int(args["--episodes"]), int(args["--seed"])
    except ValueError:
        print("error: --episodes and --seed must be integers", file=sys.stderr)
        return 2
    if episodes < 1:
        print(f"error: --episodes must be at least 1, got {episodes}", file=sys.stderr)
        return 2
    if args["--attention"] and not args["--record"]:
        print("error: --attention draws into recorded frames: add --record=out.gif", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    try:
        model, config = load_model(args["--model"], device)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    record = args["--record"]
    render_mode = "rgb_array" if record else (None if args["--no-render"] else "human")
    frames: list[np.ndarray] = []

    def on_step(env: object, step: int, attention: list[np.ndarray] | None) -> None:
        if record:
            frame = env.render()
            if attention is not None:
                frame = attention_panel(frame, attention, config.transformer.memory_length)
            frames.append(frame)

    try:
        results = evaluate(
            model, config, device, episodes, seed, args["--deterministic"], render_mode, on_step, bool(args["--attention"])
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for index, result in enumerate(results):
        details = "  ".join(f"{key} {value:g}" for key, value in result.items())
        print(f"episode {index + 1}: {details}")
    summary = summarize(results, seed=seed)
    print(format_summary(summary))
    if record:
        try:
            write_video(frames, record)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"wrote {len(frames)} frames to {record}")
    if args["--json"]:
        print(json.dumps({"model": args["--model"], "episodes": episodes, "seed": seed, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
