"""Count the dtype casts (aten::copy_ and aten::_to_copy calls) of one rollout and one update's epochs of the Mortar
Mayhem Grid config at 8 workers x 128 steps with torch.profiler, after a warm-up update: per rollout step and per
minibatch (docs/performance.md, "bfloat16 weights once per rollout"). Counts, not times: they do not depend on what
else runs on the machine.

A cast whose input has the shape of one of the model's parameters is counted as a weight cast (at these sizes no
activation has such a shape); the rest are casts of activations, observations and memory tokens.

Run from the repository root: python results/benchmarks/profile/count_casts.py bfloat16 [--out counts.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from profile_update import CONFIG, warmed_trainer  # noqa: E402  (this folder, on sys.path as the script's own)

CASTS = ("aten::copy_", "aten::_to_copy")


def count(run: object, parameter_shapes: set[tuple[int, ...]]) -> dict[str, int]:
    """Calls of each cast operator while ``run()`` runs, and how many of the _to_copy calls cast a parameter-shaped
    tensor."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        run()
    counts = dict.fromkeys(CASTS, 0)
    counts["weight_casts"] = 0
    for event in profiler.key_averages(group_by_input_shape=True):
        if event.key in CASTS:
            counts[event.key] += event.count
            if event.key == "aten::_to_copy" and event.input_shapes and tuple(event.input_shapes[0]) in parameter_shapes:
                counts["weight_casts"] += event.count
    return counts


def main(dtype: str, out: str | None) -> None:
    """Print (and with ``out`` write as JSON) the cast counts with ``compute_dtype`` ``dtype``."""
    config, trainer = warmed_trainer(dtype, "casts")
    shapes = {tuple(p.shape) for p in trainer.model.parameters()}
    rollout = count(trainer.collector.collect, shapes)
    train = count(lambda: trainer.learner.optimize(trainer.buffer, 1), shapes)
    trainer.close()
    minibatches = config.epochs * config.n_mini_batch
    result = {
        "compute_dtype": dtype,
        "config": CONFIG,
        "workers": config.n_workers,
        "worker_steps": config.worker_steps,
        "minibatches": minibatches,
        "parameters": len(list(trainer.model.parameters())),
        "per_rollout_step": {key: round(value / config.worker_steps, 2) for key, value in rollout.items()},
        "per_minibatch": {key: round(value / minibatches, 2) for key, value in train.items()},
        "rollout_total": rollout,
        "train_total": train,
    }
    print(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as file:
            json.dump(result, file, indent=2)
            file.write("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtype", nargs="?", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--out", help="write the counts to this JSON file")
    arguments = parser.parse_args()
    main(arguments.dtype, arguments.out)
