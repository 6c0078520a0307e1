"""What a run reports: TensorBoard summaries (x-axis: environment steps), one console line per update, and the frames
that show what the agent attends to (the evaluation video in TensorBoard, ``eval_video``, and ``enjoy.py --record ...
--attention``): the environment's frame, then one labelled strip per block and head.

Reading a strip: it has one cell per memory slot (``memory_length`` cells), the newest past step on the right. Cells of
steps the agent can see are coloured by the attention weight on an absolute scale (dark = 0, yellow = 1, the bar at
the bottom); cells it cannot see yet (the episode is younger than the memory) are grey hatching, so "no attention"
and "nothing there" look different. Each row's weights over the visible cells add up to 1 (none at the first step of
an episode, where nothing is visible).
"""

from __future__ import annotations

import io

import numpy as np
import yaml
from PIL import Image, ImageDraw, ImageFont
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from config import flatten

# stats key -> TensorBoard tag
LOSSES = {
    "policy_loss": "losses/policy",
    "value_loss": "losses/value",
    "entropy": "losses/entropy",
    "total_loss": "losses/total",
    "reconstruction_loss": "losses/reconstruction",  # with reconstruction_coefficient > 0
}
TRAINING = (
    "approx_kl", "approx_kl_max", "clip_fraction", "explained_variance", "learning_rate", "entropy_coefficient", "clip_range",
    "adam_epsilon",
    # the optimizer steps the update kept, whether target_kl ended it early, and whether kl_rollback undid a step
    "gradient_steps", "kl_stop", "kl_rollback",
)  # fmt: skip


VALUES = ("value_mean", "return_mean", "advantage_mean", "advantage_std")  # of the rollout, under values/


class Summaries:
    """TensorBoard summaries of one run in ``summary_dir``."""

    def __init__(self, summary_dir: str) -> None:
        self.summary_dir = summary_dir
        self.writer = SummaryWriter(summary_dir)

    def write_config(self, config: dict, command: str, ran: dict[str, str] | None = None) -> None:
        """The config (as YAML), the command line and ``ran``, what ran where the machine changed the config's
        choice (e.g. ``compute_dtype``: float32 for bfloat16 on a CPU without bfloat16 units), under TensorBoard's
        Text tab."""
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: shown as code
        self.writer.add_text("command", f"    {command}", 0)
        if ran:
            self.writer.add_text("ran", "    " + yaml.safe_dump(ran, sort_keys=False).replace("\n", "\n    "), 0)

    def update(
        self, env_steps: int, episodes: dict[str, list[float]], stats: dict[str, float], sps: float, seconds: dict[str, float]
    ) -> None:
        """Summaries of one update: the episodes that ended (metric -> one value per episode: the mean of each, the
        spread of the reward and how many ended), losses, diagnostics, value statistics, and where the time went
        (``seconds``: phase -> seconds)."""
        for key, values in episodes.items():
            self.writer.add_scalar(f"episode/{key}_mean", float(np.mean(values)), env_steps)
        rewards = episodes.get("reward", [])
        self.writer.add_scalar("episode/count", len(rewards), env_steps)
        if rewards:
            for name, spread in (("min", np.min), ("max", np.max), ("std", np.std)):
                self.writer.add_scalar(f"episode/reward_{name}", float(spread(rewards)), env_steps)
        for key in VALUES:
            self.writer.add_scalar(f"values/{key}", stats[key], env_steps)
        for phase, value in seconds.items():
            self.writer.add_scalar(f"time/{phase}_seconds", value, env_steps)
        for key, tag in LOSSES.items():
            if key in stats:
                self.writer.add_scalar(tag, stats[key], env_steps)
        for key in TRAINING:
            self.writer.add_scalar(f"training/{key}", stats[key], env_steps)
        self.writer.add_scalar("training/sps", sps, env_steps)
        if "update_scale_min" in stats:  # adam_update_clipping: the update's smallest step scale (1: none clipped)
            self.writer.add_scalar("training/update_scale_min", stats["update_scale_min"], env_steps)
        for key, value in stats.items():
            if key.startswith("grad_norm/"):
                self.writer.add_scalar(key, value, env_steps)

    def hparams(self, config: dict, final: dict[str, float], env_steps: int, compute_dtype: str | None = None) -> None:
        """The config (with ``compute_dtype_ran``, the compute dtype that ran, where given) and the last update's
        episode means in TensorBoard's HParams tab, so that runs compare in one table (lists and other non-scalar
        values as text)."""
        ran = {} if compute_dtype is None else {"compute_dtype_ran": compute_dtype}
        flat = {
            key: value if isinstance(value, int | float | str | bool) else str(value)
            for key, value in {**flatten(config), **ran}.items()
        }
        self.writer.add_hparams(
            flat, {f"final/{key}_mean": value for key, value in final.items()}, run_name=".", global_step=env_steps
        )

    def evaluation(self, env_steps: int, means: dict[str, float]) -> None:
        """Means of an evaluation on unseen episodes, under ``evaluation/``."""
        for key, value in means.items():
            self.writer.add_scalar(f"evaluation/{key}_mean", value, env_steps)

    def video(self, tag: str, frames: list[np.ndarray], env_steps: int) -> None:
        """An animated GIF of frames (each (H, W, 3) uint8, same size), shown in TensorBoard's Images tab.

        Written as the image summary that SummaryWriter.add_video makes, without add_video's moviepy dependency.
        """
        height, width = frames[0].shape[:2]
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif_bytes(frames))
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), env_steps)

    def close(self) -> None:
        self.writer.close()


def console_line(
    update: int, updates: int, env_steps: int, sps: float, episode_means: dict[str, float], stats: dict[str, float]
) -> str:
    """The console line of update ``update`` (1-based) of ``updates``."""
    line = f"update {update:4d}/{updates}  steps {env_steps:9d}  sps {sps:6.0f}"
    if episode_means:
        line += f"  reward {episode_means['reward']:7.3f}  length {episode_means['length']:6.1f}"
        if "success" in episode_means:
            line += f"  success {episode_means['success']:.2f}"
    else:
        line += "  (no episode ended)"
    line += (
        f"  pi {stats['policy_loss']:7.4f}  v {stats['value_loss']:7.4f}  entropy {stats['entropy']:.3f}"
        f"  kl {stats['approx_kl']:.4f}"
    )
    if stats["kl_stop"]:
        if stats.get("kl_rollback"):  # gradient_steps counts the steps kept
            line += f"  (target_kl: stopped after {stats['gradient_steps'] + 1:.0f} steps, the last one undone)"
        else:
            line += f"  (target_kl: stopped after {stats['gradient_steps']:.0f} steps)"
    return line


# The attention figure (see the module docstring for how to read its strips).

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
