"""What a run reports: TensorBoard summaries (x-axis: environment steps) and one console line per update."""

from __future__ import annotations

import numpy as np
import yaml
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from config import flatten
from figures import gif_bytes

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

    def write_config(self, config: dict, command: str) -> None:
        """The config (as YAML) and the command line, under TensorBoard's Text tab."""
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: shown as code
        self.writer.add_text("command", f"    {command}", 0)

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

    def hparams(self, config: dict, final: dict[str, float], env_steps: int) -> None:
        """The config and the last update's episode means in TensorBoard's HParams tab, so that runs compare in one
        table (lists and other non-scalar values as text)."""
        flat = {
            key: value if isinstance(value, int | float | str | bool) else str(value) for key, value in flatten(config).items()
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
