"""Profile one rollout and one update's epochs of the Mortar Mayhem Grid config at 8 workers x 128 steps with
torch.profiler, after a warm-up update, and print each phase's wall time, its self CPU time in torch's operators and
the largest operators (docs/performance.md, "Where the time goes").

Run from the repository root: python results/benchmarks/profile/profile_update.py float32 (or bfloat16).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from config import load_config, parse_overrides  # noqa: E402
from trainer import PPOTrainer  # noqa: E402

CONFIG = "configs/mortar_mayhem_grid.yaml"


def warmed_trainer(dtype: str, name: str) -> tuple[object, PPOTrainer]:
    """The config (Mortar Mayhem Grid, 8 workers x 128 steps, ``compute_dtype`` ``dtype``) and its trainer after one
    rollout and one update: the first update allocates and picks kernels. Also count_casts.py's."""
    sets = [f"compute_dtype={dtype}", "n_workers=8", "worker_steps=128", "eval_interval=0"]
    config = load_config(CONFIG, parse_overrides(sets))
    torch.set_num_threads(2)
    folder = tempfile.mkdtemp()
    trainer = PPOTrainer(config, f"{name}-{dtype}", torch.device("cpu"), models_dir=folder, summaries_dir=folder)
    trainer.collector.collect()
    trainer.learner.optimize(trainer.buffer, 0)
    return config, trainer


def main(dtype: str) -> None:
    """Print the profile of one rollout and one update with ``compute_dtype`` ``dtype``."""
    _, trainer = warmed_trainer(dtype, "profile")
    phases = {"rollout": trainer.collector.collect, "train": lambda: trainer.learner.optimize(trainer.buffer, 1)}
    for phase, run in phases.items():
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            start = time.time()
            run()
            wall = time.time() - start
        events = profiler.key_averages()
        total = sum(event.self_cpu_time_total for event in events) / 1e6
        print(f"== {dtype} {phase}: wall {wall:.2f}s, profiled self CPU {total:.2f}s")
        for event in sorted(events, key=lambda event: -event.self_cpu_time_total)[:12]:
            seconds = event.self_cpu_time_total / 1e6
            print(f"  {event.key[:42]:42s} {seconds:7.3f}s {100 * seconds / total:5.1f}%  calls {event.count}")
    trainer.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "float32")
