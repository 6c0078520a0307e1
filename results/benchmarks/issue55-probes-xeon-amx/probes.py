"""The small probes behind figures of issue 55's last session (docs/performance.md and the closing note), each printing
what it measured. Run from the repository root:

    python results/benchmarks/issue55-probes-xeon-amx/probes.py NAME

NAME is one of:
- convolutions: the second and third convolutions' forward, input gradient and weight gradient (2048 images,
  channels-last), with oneDNN and without it;
- space_to_depth: the second convolution plain against space-to-depth (``pixel_unshuffle``), forward and backward;
- flatten: the encoder with its embedding reading the convolutions' output in (C, H, W) order (as it does) against
  (H, W, C) order with the weight's columns permuted (not adopted);
- prepare: quantising 32 images, then laying them out channels-last, against fusing the two;
- observe: Memory Gym's frame to a (3, H, W) float32 image, as the wrapper does and three other ways;
- threads: a warmed Mortar Mayhem Grid trainer's rollout on 1 and 2 threads, alternating (needs memory-gym).
Times are means over repeats after a warm-up, on 2 threads unless said.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "results", "benchmarks", "profile"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from encoders import IMAGE_CHUNK, ImageEncoder, _ConvOnLevels, channels_last_levels, quantize_images  # noqa: E402


def milliseconds(function: Callable[[], object], repeats: int = 5) -> float:
    """Mean wall milliseconds of ``function`` over ``repeats`` calls after one warm-up call."""
    function()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return 1000 * (time.perf_counter() - start) / repeats


def gradients(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, stride: int, mask: list[bool]) -> Callable[[], object]:
    """A call of the convolution's backward computing the gradients ``mask`` selects (input, weight, bias)."""
    return lambda: torch.ops.aten.convolution_backward(
        grad, x, w, [w.shape[0]], [stride, stride], [0, 0], [1, 1], False, [0, 0], 1, mask
    )


def convolutions() -> None:
    layers = (("second", 32, 64, 4, 2, 20), ("third", 64, 64, 3, 1, 9))
    for onednn in (True, False):
        with torch.backends.mkldnn.flags(enabled=onednn):
            for dtype in (torch.bfloat16, torch.float32):
                for name, inputs, outputs, kernel, stride, side in layers:
                    x = torch.randn(2048, inputs, side, side, dtype=dtype).contiguous(memory_format=torch.channels_last)
                    w = torch.randn(outputs, inputs, kernel, kernel, dtype=dtype)
                    grad = torch.randn_like(F.conv2d(x, w, None, stride))
                    print(
                        f"oneDNN {onednn} {dtype} {name}: forward {milliseconds(lambda: F.conv2d(x, w, None, stride)):.1f}"  # noqa: B023
                        f" input gradient {milliseconds(gradients(x, w, grad, stride, [True, False, False])):.1f}"
                        f" weight gradient {milliseconds(gradients(x, w, grad, stride, [False, True, False])):.1f} ms"
                    )


def space_to_depth() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(2048, 32, 20, 20, dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
        w = torch.randn(64, 32, 4, 4, dtype=dtype, requires_grad=True)

        def plain() -> None:
            y = F.conv2d(x, w, None, 2)  # noqa: B023
            y.backward(torch.ones_like(y))

        def blocks() -> None:  # x[n, c, 2i + a, 2j + b] -> [n, 4c + 2a + b, i, j], the same for the weight
            xs = F.pixel_unshuffle(x, 2).contiguous(memory_format=torch.channels_last)  # noqa: B023
            y = F.conv2d(xs, F.pixel_unshuffle(w, 2))  # noqa: B023
            y.backward(torch.ones_like(y))

        difference = (F.conv2d(x, w, None, 2) - F.conv2d(F.pixel_unshuffle(x, 2), F.pixel_unshuffle(w, 2))).abs().max()
        print(f"{dtype}: forward + backward plain {milliseconds(plain):.1f} ms, space-to-depth {milliseconds(blocks):.1f} ms"
              f" (outputs differ by at most {difference.item():.2g})")  # fmt: skip


def flatten() -> None:
    encoder = ImageEncoder((3, 84, 84), 384)
    n = 2048
    obs = channels_last_levels(torch.randint(0, 256, (1, n, 3, 84, 84), dtype=torch.uint8))
    grad = torch.randn(1, n, 384)

    def features(x: torch.Tensor) -> torch.Tensor:
        conv = encoder.conv
        x = _ConvOnLevels.apply(x, conv[0].weight, conv[0].bias, 4, 0).relu_()
        return conv[4](conv[2](x).relu_()).relu_()

    def in_hwc_order(obs: torch.Tensor) -> torch.Tensor:
        x = torch.cat([features(c).permute(0, 2, 3, 1).reshape(len(c), -1) for c in obs[0].split(IMAGE_CHUNK)])
        weight = encoder.embedding.weight.view(384, 64, 7, 7).permute(0, 2, 3, 1).reshape(384, -1)
        return torch.relu(F.linear(x, weight, encoder.embedding.bias)).view(1, n, -1)

    for dtype in ("bfloat16", "float32"):
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
        times: dict[str, list[tuple[float, float]]] = {"(C, H, W) order": [], "(H, W, C) order": []}
        for round_ in range(6):
            for name, encode in zip(times, (encoder, in_hwc_order), strict=True):
                encoder.zero_grad(set_to_none=True)
                with autocast:
                    start = time.perf_counter()
                    h = encode(obs)
                    middle = time.perf_counter()
                h.backward(grad.to(h.dtype))
                if round_:
                    times[name].append((middle - start, time.perf_counter() - middle))
        with torch.no_grad(), autocast:
            difference = (encoder(obs).float() - in_hwc_order(obs).float()).abs().max().item()
        for name, rounds in times.items():
            forward, backward = (1000 * sum(r[i] for r in rounds) / len(rounds) for i in (0, 1))
            print(f"{dtype} {n} images, {name}: forward {forward:.1f} backward {backward:.1f} ms")
        print(f"{dtype}: the outputs differ by at most {difference:.2g}")


def prepare() -> None:
    images = (np.random.default_rng(0).integers(0, 256, (32, 3, 84, 84)) / 255.0).astype(np.float32)
    reference = quantize_images(torch.as_tensor(images))
    ways = {
        "quantise": lambda: quantize_images(torch.as_tensor(images)),
        "quantise, then channels-last (as prepare does)": lambda: channels_last_levels(
            quantize_images(torch.as_tensor(images))
        ),
        "channels-last floats, then quantise": lambda: quantize_images(
            torch.as_tensor(images).contiguous(memory_format=torch.channels_last)
        ),
    }  # fmt: skip
    for name, way in ways.items():
        assert torch.equal(way(), reference)
        print(f"{name}: {milliseconds(way, 200):.3f} ms for 32 images")


def observe() -> None:
    frame = np.random.default_rng(0).integers(0, 256, (84, 84, 3), dtype=np.uint8)  # memory-gym's (x, y, 3) frame

    def divided_into() -> np.ndarray:
        out = np.empty((3, 84, 84), np.float32)
        np.divide(frame.transpose(2, 1, 0), np.float32(255), out=out)
        return out

    def divided_in_place() -> np.ndarray:
        out = np.ascontiguousarray(frame.transpose(2, 1, 0), dtype=np.float32)
        out /= np.float32(255)
        return out

    def converted_after() -> np.ndarray:
        out = np.ascontiguousarray(frame.transpose(2, 1, 0)).astype(np.float32)
        out /= np.float32(255)
        return out

    ways = {
        "as the wrapper does": lambda: np.ascontiguousarray(frame.transpose(2, 1, 0), dtype=np.float32) / 255.0,
        "divide into a new array": divided_into,
        "divide in place": divided_in_place,
        "reorder the bytes, convert, divide in place": converted_after,
    }
    reference = ways["as the wrapper does"]()
    for name, way in ways.items():
        assert np.array_equal(way(), reference)
        print(f"{name}: {1000 * milliseconds(way, 3000):.1f} us per frame")


def threads() -> None:
    from profile_update import warmed_trainer

    for dtype, workers, steps in (("float32", 8, 128), ("bfloat16", 8, 128), ("float32", 32, 128)):
        _, trainer = warmed_trainer(dtype, "threads", workers, steps)
        seconds: dict[int, list[float]] = {1: [], 2: []}
        for round_ in range(4):
            for count in (1, 2) if round_ % 2 == 0 else (2, 1):
                torch.set_num_threads(count)
                start = time.perf_counter()
                trainer.collector.collect()
                seconds[count].append(time.perf_counter() - start)
        torch.set_num_threads(2)
        trainer.close()
        for count, values in seconds.items():
            print(f"{dtype} {workers}x{steps}, {count} thread(s): rollout seconds", " ".join(f"{s:.2f}" for s in values))


if __name__ == "__main__":
    torch.set_num_threads(2)
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    probes = {p.__name__: p for p in (convolutions, space_to_depth, flatten, prepare, observe, threads)}
    if len(sys.argv) != 2 or sys.argv[1] not in probes:
        sys.exit(f"usage: probes.py NAME, NAME one of {', '.join(probes)}")
    probes[sys.argv[1]]()
