"""The parts of an update's minibatches, timed with the clock: the encoder's forward, the memory's forward, the heads
and the loss, the backward split where the gradient reaches the encoder's output (the memory's and heads' backward
before, the encoder's after), and the clipping with the optimizer step.

Run from the repository root: python results/benchmarks/profile/update_parts.py bfloat16 32 512 (dtype, workers,
steps; default float32 8 128). Mortar Mayhem Grid after profile_update.py's warm-up; each epoch's minibatches twice, the
seconds scaled to the config's epochs; then a real update for comparison.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from profile_update import size_arguments, warmed_trainer  # noqa: E402

import ppo  # noqa: E402


def main() -> None:
    dtype, workers, steps = size_arguments(sys.argv[1:])
    _, trainer = warmed_trainer(dtype, "parts", workers, steps)
    learner, model, buffer, config = trainer.learner, trainer.learner.model, trainer.buffer, trainer.learner.config
    minibatches = list(
        buffer.minibatches(
            config.n_mini_batch, config.sequence_length, learner.generator, config.minibatch_sampling, learner.rows
        )
    )
    reached: list[float] = []
    clip_range, beta = config.clip_range_schedule.value(1), config.beta_schedule.value(1)  # as learner.optimize(_, 1)

    def timed(minibatch: object) -> dict[str, float]:
        learner.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with model.autocast():
            h = model.encode(minibatch.obs)
        h.register_hook(lambda grad: reached.append(time.perf_counter()))
        encoded = time.perf_counter()
        with model.autocast():
            out = model.memory.forward_chunks(h, minibatch.memory)
        remembered = time.perf_counter()
        loss, _ = ppo.ppo_loss(
            model.heads(out), minibatch, clip_range, beta, config.value_loss_coefficient, config.normalize_advantages,
            learner.normalize,
        )  # fmt: skip
        lossed = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        ppo.clip_gradients(model, config.max_grad_norm)
        learner.optimizer.step()
        return {
            "encoder forward": encoded - start,
            "memory forward": remembered - encoded,
            "heads and loss": lossed - remembered,
            "backward: memory and heads": reached[-1] - lossed,
            "backward: encoder": backward - reached[-1],
            "clipping and optimizer": time.perf_counter() - backward,
        }

    for repeat in range(2):
        totals: dict[str, float] = {}
        start = time.perf_counter()
        for minibatch in minibatches:
            for part, seconds in timed(minibatch).items():
                totals[part] = totals.get(part, 0.0) + seconds
        wall = (time.perf_counter() - start) * config.epochs
        print(f"{dtype} {workers}x{steps} repeat {repeat + 1}: {wall:.2f} s per update of {config.epochs} epochs")
        for part, seconds in totals.items():
            print(f"  {part:28s} {seconds * config.epochs:7.2f} s  {100 * seconds * config.epochs / wall:5.1f}%")
    start = time.perf_counter()
    learner.optimize(buffer, 1)
    print(f"learner.optimize: {time.perf_counter() - start:.2f} s")
    trainer.close()


if __name__ == "__main__":
    main()
