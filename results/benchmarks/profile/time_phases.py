"""Wall time of a rollout's and an update's parts, timed with the clock around each call instead of torch.profiler,
whose own allocations break up the freed memory the trainer reuses and so inflate the copies it reports
(docs/performance.md, "Timed without the profiler").

Run from the repository root: python results/benchmarks/profile/time_phases.py float32 (or bfloat16); a second and
third argument set the workers and steps (default 8 128; the config's own size is 32 512). Mortar Mayhem Grid, after a
warm-up update (profile_update.py's), then one rollout and one update, twice; each part's seconds and share of its
phase. Parts nest (an update's "backward" holds the whole model's backward; "encoder.forward" is part of "act").
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from profile_update import size_arguments, warmed_trainer  # noqa: E402

import ppo  # noqa: E402


class PhaseClock:
    """Seconds per (phase, part): each timed call adds its wall time to the part of the phase running now."""

    def __init__(self) -> None:
        self.phase = ""
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)

    def time(self, owner: object, name: str, part: str) -> None:
        """Replace ``owner.name`` by a call that adds its wall time to ``part`` of the current phase."""
        original: Callable = getattr(owner, name)

        def call(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[self.phase, part] += time.perf_counter() - start

        setattr(owner, name, call)

    def time_minibatches(self, buffer: object) -> None:
        """Time the making of each minibatch (the gather of its steps from the buffer), not the training between."""
        original = buffer.minibatches

        def minibatches(*args: object, **kwargs: object) -> object:
            made = original(*args, **kwargs)
            while True:
                start = time.perf_counter()
                try:
                    minibatch = next(made)
                except StopIteration:
                    return
                finally:
                    self.seconds[self.phase, "minibatch gather"] += time.perf_counter() - start
                yield minibatch

        buffer.minibatches = minibatches

    def run(self, phase: str, function: Callable[[], object]) -> float:
        """Run ``function`` as ``phase`` (its parts counted anew); returns its wall time."""
        self.phase = phase
        for key in [key for key in self.seconds if key[0] == phase]:
            del self.seconds[key]
        start = time.perf_counter()
        function()
        return time.perf_counter() - start

    def parts(self, phase: str) -> list[tuple[str, float]]:
        return sorted(((part, s) for (p, part), s in self.seconds.items() if p == phase), key=lambda item: -item[1])


def main() -> None:
    dtype, workers, steps = size_arguments(sys.argv[1:])
    _, trainer = warmed_trainer(dtype, "phases", workers, steps)
    collector, learner, model = trainer.collector, trainer.learner, trainer.learner.model
    clock = PhaseClock()
    clock.time(model, "act", "act (model step and commit)")
    clock.time(model.encoder, "forward", "encoder forward")
    clock.time(model.memory, "step", "memory.step")
    clock.time(model.memory, "commit", "memory.commit")
    clock.time(collector.workers, "step", "environments' step")
    clock.time(collector, "record_outcome", "record_outcome (with prepare)")
    clock.time(model.encoder, "prepare", "encoder.prepare (quantise)")
    clock.time(ppo, "ppo_loss", "loss")
    clock.time(torch.Tensor, "backward", "backward (whole model)")
    clock.time(ppo, "clip_gradients", "gradient clipping")
    clock.time(learner.optimizer, "step", "optimizer step")
    clock.time_minibatches(trainer.buffer)
    for repeat in range(2):
        walls = {
            "rollout": clock.run("rollout", collector.collect),
            "update": clock.run("update", lambda: learner.optimize(trainer.buffer, 1 + repeat)),  # noqa: B023
        }
        for phase, wall in walls.items():
            print(f"{dtype} {workers}x{steps} repeat {repeat + 1}: {phase} {wall:.2f} s")
            for part, seconds in clock.parts(phase):
                print(f"  {part:32s} {seconds:7.3f} s  {100 * seconds / wall:5.1f}%")


if __name__ == "__main__":
    main()
