"""What a run reports: TensorBoard summaries (x-axis: environment steps) and, with ``track``, the same to Weights &
Biases (``Tracker``), one console line per update, and the frames that show what the agent attends to (the evaluation
video, ``video_interval``, and ``enjoy.py --record ... --attention``): the environment's frame, then one labelled
strip per block and head.

Reading a strip: it has one cell per memory slot (``memory_length`` cells), the newest past step on the right. Cells of
steps the agent can see are coloured by the attention weight on an absolute scale (dark = 0, yellow = 1, the bar at
the bottom); cells it cannot see yet (the episode is younger than the memory) are grey hatching, so "no attention"
and "nothing there" look different. Each row's weights over the visible cells add up to 1 (none at the first step of
an episode, where nothing is visible).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
from types import ModuleType

import numpy as np
import yaml
from PIL import Image, ImageDraw, ImageFont
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from config import ConfigError, flatten

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
    "memory_learning_rate",  # the memory's own rate (memory_learning_rate_scale, transformer.max_learning_rate, ...)
    # the optimizer steps the update kept, whether target_kl ended it early, and whether kl_rollback undid a step
    "gradient_steps", "kl_stop", "kl_rollback",
)  # fmt: skip


VALUES = ("value_mean", "return_mean", "advantage_mean", "advantage_std")  # of the rollout, under values/


class Summaries:
    """TensorBoard summaries of one run in ``summary_dir`` and, where a ``tracker`` is given (``track``), the same
    scalars, config and videos in Weights & Biases."""

    def __init__(self, summary_dir: str, tracker: Tracker | None = None) -> None:
        self.summary_dir = summary_dir
        self.writer = SummaryWriter(summary_dir)
        self.tracker = tracker

    def write_config(self, config: dict, command: str, ran: dict[str, str] | None = None) -> None:
        """The config (as YAML), the command line and ``ran``, what ran where the machine changed the config's
        choice (e.g. ``compute_dtype``: float32 for bfloat16 on a CPU without bfloat16 units), under TensorBoard's
        Text tab, and as the tracked run's config."""
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: shown as code
        self.writer.add_text("command", f"    {command}", 0)
        if ran:
            self.writer.add_text("ran", "    " + yaml.safe_dump(ran, sort_keys=False).replace("\n", "\n    "), 0)
        if self.tracker is not None:
            self.tracker.config({**config, "command": command, "ran": ran or {}})

    def scalars(self, values: dict[str, float], env_steps: int) -> None:
        """Write ``values`` (tag -> value) at ``env_steps``: to TensorBoard and, when tracking, as one W&B row. Every
        scalar of the run passes here, so both get the same ones."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, env_steps)
        if self.tracker is not None:
            self.tracker.log(values, env_steps)

    def update(
        self, env_steps: int, episodes: dict[str, list[float]], stats: dict[str, float], sps: float, seconds: dict[str, float]
    ) -> None:
        """Summaries of one update: the episodes that ended (metric -> one value per episode: the mean of each, the
        spread of the reward and how many ended), losses, diagnostics, value statistics, and where the time went
        (``seconds``: phase -> seconds)."""
        values = {f"episode/{key}_mean": float(np.mean(episode)) for key, episode in episodes.items()}
        rewards = episodes.get("reward", [])
        values["episode/count"] = len(rewards)
        if rewards:
            for name, spread in (("min", np.min), ("max", np.max), ("std", np.std)):
                values[f"episode/reward_{name}"] = float(spread(rewards))
        values.update({f"values/{key}": stats[key] for key in VALUES})
        values.update({f"time/{phase}_seconds": value for phase, value in seconds.items()})
        values.update({tag: stats[key] for key, tag in LOSSES.items() if key in stats})
        values.update({f"training/{key}": stats[key] for key in TRAINING})
        values["training/sps"] = sps
        if "update_scale_min" in stats:  # adam_update_clipping: the update's smallest step scale (1: none clipped)
            values["training/update_scale_min"] = stats["update_scale_min"]
        values.update({key: value for key, value in stats.items() if key.startswith("grad_norm/")})
        self.scalars(values, env_steps)

    def hparams(self, config: dict, final: dict[str, float], env_steps: int, compute_dtype: str | None = None) -> None:
        """The config (with ``compute_dtype_ran``, the compute dtype that ran, where given) and the last update's
        episode means in TensorBoard's HParams tab, so that runs compare in one table (lists and other non-scalar
        values as text); the means go to the tracked run as well."""
        ran = {} if compute_dtype is None else {"compute_dtype_ran": compute_dtype}
        flat = {
            key: value if isinstance(value, int | float | str | bool) else str(value)
            for key, value in {**flatten(config), **ran}.items()
        }
        metrics = {f"final/{key}_mean": value for key, value in final.items()}
        self.writer.add_hparams(flat, metrics, run_name=".", global_step=env_steps)
        if self.tracker is not None:  # as TensorBoard's add_hparams, which writes them as scalars too
            self.tracker.log(metrics, env_steps)

    def evaluation(self, env_steps: int, means: dict[str, float]) -> None:
        """Means of an evaluation on unseen episodes, under ``evaluation/``."""
        self.scalars({f"evaluation/{key}_mean": value for key, value in means.items()}, env_steps)

    def video(self, tag: str, frames: list[np.ndarray], env_steps: int) -> None:
        """An animated GIF of frames (each (H, W, 3) uint8, same size), shown in TensorBoard's Images tab and, when
        tracking, as a W&B video.

        Written as the image summary that SummaryWriter.add_video makes, without add_video's moviepy dependency.
        """
        height, width = frames[0].shape[:2]
        gif = gif_bytes(frames)
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), env_steps)
        if self.tracker is not None:
            self.tracker.video(tag, gif, env_steps)

    def close(self) -> None:
        self.writer.close()
        if self.tracker is not None:
            self.tracker.finish()


# Weights & Biases (track: true): an optional dependency, imported only when a run asks for it.

STEP = "global_step"  # the x-axis of every W&B curve: environment steps, as TensorBoard's step
WANDB_ID_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")  # W&B refuses some characters in run ids; '/' of nested run ids


def import_wandb() -> ModuleType:
    """The wandb module; ConfigError naming the install command where it is missing."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "'track' is true (train.py --track): logging to Weights & Biases needs wandb, which is not installed: "
            "pip install wandb, or leave out --track (track: false)"
        ) from None
    return wandb


def code_version() -> dict[str, object]:
    """The repository's git commit and whether tracked files differ from it ({} where this is no git checkout)."""
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit.stdout.strip(), "dirty": bool(changed.stdout.strip())}


def wandb_id(run_id: str, summary_dir: str) -> str:
    """The W&B id of a run: its run id and the start time that names its summary folder ("poc-20240101-120000"), so
    that a resumed run (which keeps its summary folder) continues the same W&B run, while a run started over with
    --overwrite gets a new one instead of appending to the old run's curves."""
    return WANDB_ID_CHARACTERS.sub("-", f"{run_id}-{os.path.basename(os.path.normpath(summary_dir))}")


class Tracker:
    """The W&B run of a training run: its name is the run id, its id ``wandb_id``, and ``resume="allow"`` continues
    it where it exists. Its files go to W&B's folder beside the run's summaries (``summaries/<run-id>/wandb/``) unless
    WANDB_DIR says where; WANDB_MODE=offline keeps everything on the machine (``wandb sync`` uploads it later)."""

    def __init__(self, project: str, entity: str, run_id: str, seed: int, summary_dir: str) -> None:
        wandb = import_wandb()
        self.wandb = wandb
        folder = os.environ.get("WANDB_DIR") or os.path.dirname(os.path.normpath(summary_dir))
        os.makedirs(folder, exist_ok=True)
        try:
            self.run = wandb.init(
                project=project, entity=entity or None, id=wandb_id(run_id, summary_dir), name=run_id, resume="allow",
                dir=folder,
            )  # fmt: skip
        except Exception as error:  # wandb's own errors (not logged in, no network, ...) have no common base class
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                f"'track' is true, and Weights & Biases did not start ({first}): log in with `wandb login`, "
                "keep the run on this machine with WANDB_MODE=offline, or leave out --track (track: false)"
            ) from None
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        self.config({"run_id": run_id, "seed": seed, "git": code_version()})

    def config(self, values: dict) -> None:
        """Add ``values`` to the run's config; a resumed run's changes (``--set updates=...``) replace the old values."""
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, object], env_steps: int) -> None:
        """One row of the run's history at ``env_steps``."""
        self.run.log({**values, STEP: env_steps})

    def video(self, tag: str, gif: bytes, env_steps: int) -> None:
        """An animated GIF as a W&B video at ``env_steps``."""
        self.log({tag: self.wandb.Video(io.BytesIO(gif), format="gif")}, env_steps)

    def finish(self) -> None:
        self.run.finish()


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


def evaluation_line(means: dict[str, float]) -> str:
    """The end of the console's evaluation line: the mean reward and success, and the share of the episodes cut at
    ``max_steps`` where any was (a task whose every episode was cut shows no success: nothing reported one)."""
    shown = {key: means[key] for key in ("reward", "success") if key in means}
    if means.get("evaluation_cut"):
        shown["cut"] = means["evaluation_cut"]
    return "  ".join(f"{key} {value:.3f}" for key, value in shown.items())


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
