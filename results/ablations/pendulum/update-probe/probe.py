"""Where one PPO update's change of the policy comes from on masked Pendulum (issue 66): the encoder, the memory
(TrXL's also split into its input embedding and its blocks) or the heads. Trains configs/pendulum.yaml as train.py
does; after each update it evaluates the rollout's chunks (one minibatch of all of them, fixed shuffle) with the
weights before the update, after it, and after it in one part only (the others as before), and writes the KL
divergence of the policy before the update from each of those, the memory output's RMS and how far it moved.

    python results/ablations/pendulum/update-probe/probe.py MEMORY SEED OUT.json [--set items ...]

e.g. ``... probe.py trxl 0 trxl-0.json updates=12`` (extra arguments are --set items without the flag).
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT)

from config import load_config, parse_overrides  # noqa: E402
from ppo import forward_minibatch  # noqa: E402
from trainer import PPOTrainer  # noqa: E402


def gaussian_kl(m0: torch.Tensor, ls0: torch.Tensor, m1: torch.Tensor, ls1: torch.Tensor) -> torch.Tensor:
    """KL(p0 || p1) of diagonal Gaussians per step, summed over the action entries."""
    v0, v1 = (2 * ls0).exp(), (2 * ls1).exp()
    return (ls1 - ls0 + (v0 + (m0 - m1) ** 2) / (2 * v1) - 0.5).sum(-1)


def evaluate(model: torch.nn.Module, state: dict, minibatch: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's means and log-stds and the memory's output for a minibatch, with the weights ``state``."""
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        output = forward_minibatch(model, minibatch)
    return output.policy.mean.clone(), output.policy.log_std.clone(), output.features.clone()  # not views of the weights


def main() -> None:
    memory, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    sets = parse_overrides([f"memory={memory}", "recurrence.hidden_state_size=64", *sys.argv[4:]])
    config = load_config(os.path.join(ROOT, "configs", "pendulum.yaml"), sets)
    folder = os.path.join("/tmp", f"update-probe-{memory}-{seed}")
    trainer = PPOTrainer(config, "probe", torch.device("cpu"), seed, models_dir=folder, summaries_dir=folder)
    parts = {
        "encoder": lambda key: key.startswith("encoder"),
        "memory": lambda key: key.startswith("memory"),
        "memory_embedding": lambda key: key.startswith("memory.transformer.embedding"),  # TrXL's input Linear + ReLU
        "memory_blocks": lambda key: key.startswith("memory.transformer.blocks"),
        "heads": lambda key: key.startswith(("policy", "value")),
    }
    rows = []
    for update in range(config.updates):
        trainer.rollout()
        before = copy.deepcopy(trainer.model.state_dict())
        shuffle = torch.Generator().manual_seed(123)
        minibatch = next(iter(trainer.buffer.minibatches(1, config.sequence_length, shuffle)))  # every chunk, all real
        mean0, log_std0, features0 = evaluate(trainer.model, before, minibatch)
        stats = trainer.learner.optimize(trainer.buffer, update)
        after = copy.deepcopy(trainer.model.state_dict())
        row = {"update": update + 1, "approx_kl": stats["approx_kl"], "log_std": log_std0.flatten()[0].item()}
        row["features_rms"] = features0.pow(2).mean().sqrt().item()
        for name, selects in [("all", lambda key: True), *parts.items()]:
            mixed = {key: (after[key] if selects(key) else before[key]) for key in before}
            mean, log_std, features = evaluate(trainer.model, mixed, minibatch)
            row[f"kl_{name}"] = gaussian_kl(mean0, log_std0, mean, log_std).mean().item()
            row[f"features_moved_{name}"] = (features - features0).pow(2).mean().sqrt().item()
        trainer.model.load_state_dict(after)
        rows.append(row)
        print(json.dumps({key: round(value, 4) for key, value in row.items()}), flush=True)
    trainer.close()
    with open(out, "w") as file:
        json.dump({"memory": memory, "seed": seed, "sets": sys.argv[4:], "updates": rows}, file, indent=1)


if __name__ == "__main__":
    main()
