"""Profile one rollout and one update's epochs of the Mortar Mayhem Grid config at 8 workers x 128 steps with
torch.profiler, after a warm-up update, and print each phase's wall time, its self CPU time in torch's operators and
the largest operators (docs/performance.md, "Where the time goes").

Run from the repository root: python results/benchmarks/profile/profile_update.py float32 (or bfloat16); a second and
third argument set the workers and steps (default 8 128; the config's own size is 32 512).
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


def warmed_trainer(dtype: str, name: str, workers: int = 8, steps: int = 128) -> tuple[object, PPOTrainer]:
    """The config (Mortar Mayhem Grid, ``workers`` x ``steps``, ``compute_dtype`` ``dtype``) and its trainer after one
    rollout and one update: the first update allocates and picks kernels. Also count_casts.py's."""
    sets = [f"compute_dtype={dtype}", f"n_workers={workers}", f"worker_steps={steps}", "eval_interval=0"]
    config = load_config(CONFIG, parse_overrides(sets))
    torch.set_num_threads(2)
    folder = tempfile.mkdtemp()
    trainer = PPOTrainer(config, f"{name}-{dtype}", torch.device("cpu"), models_dir=folder, summaries_dir=folder)
    trainer.collector.collect()
    trainer.learner.optimize(trainer.buffer, 0)
    return config, trainer


def size_arguments(argv: list[str]) -> tuple[str, int, int]:
    """The compute dtype, workers and steps from the command line (``argv`` without the script's name), defaulting to
    float32, 8 and 128 where left out: this script's and time_phases.py's arguments."""
    dtype, workers, steps = (argv + ["float32", "8", "128"][len(argv) :])[:3]
    return dtype, int(workers), int(steps)


def main(dtype: str, workers: int, steps: int) -> None:
    """Print the profile of one rollout and one update with ``compute_dtype`` ``dtype`` at ``workers`` x ``steps``."""
    _, trainer = warmed_trainer(dtype, "profile", workers, steps)
    phases = {"rollout": trainer.collector.collect, "train": lambda: trainer.learner.optimize(trainer.buffer, 1)}
    for phase, run in phases.items():
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            start = time.time()
            run()
            wall = time.time() - start
        events = profiler.key_averages()
        total = sum(event.self_cpu_time_total for event in events) / 1e6
        print(f"== {dtype} {workers}x{steps} {phase}: wall {wall:.2f}s, profiled self CPU {total:.2f}s")
        for event in sorted(events, key=lambda event: -event.self_cpu_time_total)[:16]:
            seconds = event.self_cpu_time_total / 1e6
            print(f"  {event.key[:42]:42s} {seconds:7.3f}s {100 * seconds / total:5.1f}%  calls {event.count}")
    trainer.close()


if __name__ == "__main__":
    main(*size_arguments(sys.argv[1:]))
