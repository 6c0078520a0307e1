"""The update's time with the buffer's images channels-first against channels-last, in one warmed trainer.

Run from the repository root: python results/benchmarks/channels-last-images-xeon-amx/ab_update.py DTYPE WORKERS STEPS
PAIRS. Mortar Mayhem Grid after profile_update.py's warm-up; the buffer's images are swapped between the two layouts
(the same values) before each update, the order swapped every pair, so a machine whose speed drifts affects both.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "results", "benchmarks", "profile"))

import torch  # noqa: E402
from profile_update import warmed_trainer  # noqa: E402


def main(dtype: str, workers: int, steps: int, pairs: int) -> None:
    _, trainer = warmed_trainer(dtype, "ab", workers, steps)
    buffer, learner = trainer.buffer, trainer.learner
    layouts = {"channels-first": buffer.obs.contiguous(), "channels-last": buffer.obs}
    assert not layouts["channels-last"].is_contiguous()  # the buffer's own storage: channels-last
    assert torch.equal(layouts["channels-first"], layouts["channels-last"])
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for pair in range(pairs):
        for name in list(layouts)[:: 1 if pair % 2 == 0 else -1]:
            buffer.obs = layouts[name]
            start = time.perf_counter()
            learner.optimize(buffer, 1)
            times[name].append(time.perf_counter() - start)
    for name, seconds in times.items():
        median = sorted(seconds)[len(seconds) // 2]
        listed = " ".join(f"{s:.2f}" for s in seconds)
        print(f"{dtype} {workers}x{steps} {name}: update seconds {listed} median {median:.2f}")
    ratios = [a / b for a, b in zip(times["channels-first"], times["channels-last"], strict=True)]
    print("ratio first/last per pair:", " ".join(f"{r:.3f}" for r in ratios))
    trainer.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
