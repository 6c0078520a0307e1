"""The image encoder alone, forward and backward, on the same uint8 images channels-first and channels-last.

Run from the repository root: python results/benchmarks/channels-last-images-xeon-amx/encoder_ab.py DTYPE IMAGES.
Mortar Mayhem Grid's encoder (84x84 RGB, embedding 384) on 2 threads; the layouts alternate, and each line is the
mean of 5 rounds after one warm-up round.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from encoders import ImageEncoder, channels_last_levels  # noqa: E402


def main(dtype: str, n: int) -> None:
    torch.set_num_threads(2)
    encoder = ImageEncoder((3, 84, 84), 384)
    first = torch.randint(0, 256, (1, n, 3, 84, 84), dtype=torch.uint8)
    layouts = {"nchw": first, "cl": channels_last_levels(first)}
    gradient = torch.randn(1, n, 384)

    def run(obs: torch.Tensor) -> tuple[float, float]:
        encoder.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            start = time.perf_counter()
            h = encoder(obs)
            middle = time.perf_counter()
        h.backward(gradient.to(h.dtype))
        return middle - start, time.perf_counter() - middle

    times: dict[str, list[tuple[float, float]]] = {name: [] for name in layouts}
    for round_ in range(6):
        for name, obs in layouts.items():
            timed = run(obs)
            if round_:
                times[name].append(timed)
    for name, rounds in times.items():
        forward, backward = (1000 * sum(r[i] for r in rounds) / len(rounds) for i in (0, 1))
        print(f"{dtype} {n} {name} forward {forward:.0f} ms backward {backward:.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
