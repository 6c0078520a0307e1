"""How large a MiniGrid TrXL agent's gradients are, element by element, against AdamW's epsilon.

For the shipped solved agent (models/trained/minigrid.nn: seed 0 of results/ablations/minigrid/minigrid-defaults-mb16
when gradient_scale.json was written, seed 0 of results/ablations/minigrid/minigrid-eps-rise since 2026-12-05) and for a
fresh one of the same config: one rollout of the config's 16 x 512 steps, then the gradients of one epoch's minibatches
(clipped as in training, no optimiser step).
An element's root mean square over the minibatches stands for the root of AdamW's second moment, sqrt(v): where it is
far below epsilon, the step is about lr * g / epsilon instead of about lr. Prints percentiles per part of the model
and the share of elements below 1e-5, 1e-4 and 1e-3; writes them to gradient_scale.json beside this file.

    # from the repository root, ~5 min
    OMP_NUM_THREADS=1 python results/ablations/minigrid/minigrid-gradient-scale/gradient_scale.py
"""

import json
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from checkpoint import load_model  # noqa: E402
from ppo import clip_gradients  # noqa: E402
from trainer import PPOTrainer  # noqa: E402

EPSILONS = (1e-5, 1e-4, 1e-3)


def gradient_rms(model: torch.nn.Module | None, config: object, scratch: str) -> dict:
    """The RMS gradient of every part of a fresh agent of ``config``, or of ``model`` (the solved one)."""
    solved = model is not None
    trainer = PPOTrainer(config, "probe", torch.device("cpu"), seed=7, models_dir=scratch, summaries_dir=scratch)
    if solved:
        trainer.model.load_state_dict(model.state_dict())
    episodes = trainer.rollout().episodes
    learner, update = trainer.learner, config.updates - 1 if solved else 0
    squares = {name: torch.zeros_like(p) for name, p in trainer.model.named_parameters()}
    minibatches = trainer.buffer.minibatches(
        config.n_mini_batch, config.sequence_length, learner.generator, config.minibatch_sampling, learner.rows
    )
    for minibatch in minibatches:
        learner.optimizer.zero_grad(set_to_none=True)
        learner.backward(minibatch, config.clip_range_schedule.value(update), config.beta_schedule.value(update))
        clip_gradients(trainer.model, config.max_grad_norm)
        for name, p in trainer.model.named_parameters():
            if p.grad is not None:
                squares[name] += p.grad**2
    trainer.workers.close()
    parts: dict[str, list[torch.Tensor]] = {}
    for name, total in squares.items():
        parts.setdefault(name.split(".")[0], []).append((total / config.n_mini_batch).sqrt().flatten())
    result = {"success": float(np.mean(episodes["success"])), "parts": {}}
    for part, values in parts.items():
        rms = torch.cat(values).numpy()
        result["parts"][part] = {
            "elements": int(rms.size),
            "percentiles_10_50_90_99": [float(x) for x in np.percentile(rms, [10, 50, 90, 99])],
            "share_below": {str(e): float((rms < e).mean()) for e in EPSILONS},
        }
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    solved, config = load_model("models/trained/minigrid.nn", torch.device("cpu"))
    with tempfile.TemporaryDirectory() as scratch:
        results = {name: gradient_rms(model, config, scratch) for name, model in (("fresh", None), ("solved", solved))}
    for name, result in results.items():
        print(f"{name}: rollout success {result['success']:.2f}")
        for part, row in result["parts"].items():
            q = " ".join(f"{x:.1e}" for x in row["percentiles_10_50_90_99"])
            below = " ".join(f"{share:.2f}" for share in row["share_below"].values())
            print(f"  {part:8s} {row['elements']:8d} elements  rms p10/50/90/99 {q}  below 1e-5/1e-4/1e-3 {below}")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gradient_scale.json"), "w") as file:
        json.dump(results, file, indent=1)
