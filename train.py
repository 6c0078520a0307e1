"""Train a PPO agent with an episodic Transformer-XL memory.

Usage:
  train.py [options] [--set=<key=value>]...
  train.py (-h | --help)

Options:
  --config=<path>       YAML config [default: configs/poc_memory_env.yaml].
  --run-id=<id>         Name of the run: summaries/<id>/<time>/ and models/<id>.nn [default: run].
  --cpu                 Use the CPU even where CUDA is available.
  --seed=<n>            Seed of the model, the sampling and the environments [default: 0].
  --memory-path=<path>  "fast" (K/V cache and banded attention) or "plain" (per-window specification) [default: fast].
  --set=<key=value>     Override a config key, e.g. --set updates=10 --set transformer.memory_length=16 (YAML values).
  -h --help             Show this help.
"""

from __future__ import annotations

import sys

import torch
import yaml
from docopt import docopt

from config import ConfigError, load_config
from trainer import MEMORY_PATHS, PPOTrainer


def parse_overrides(items: list[str]) -> dict:
    """Turn ["a=1", "b.c=x"] into {"a": 1, "b": {"c": "x"}} (values parsed as YAML)."""
    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        node = overrides
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = yaml.safe_load(value)
    return overrides


def main() -> int:
    args = docopt(__doc__)
    try:
        seed = int(args["--seed"])
    except ValueError:
        print(f"error: --seed must be an integer, got '{args['--seed']}'", file=sys.stderr)
        return 2
    if args["--memory-path"] not in MEMORY_PATHS:
        print(f"error: --memory-path must be one of {', '.join(MEMORY_PATHS)}, got '{args['--memory-path']}'", file=sys.stderr)
        return 2
    try:
        config = load_config(args["--config"], parse_overrides(args["--set"]))
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    print(f"training {args['--run-id']} on {device} with {args['--config']}", flush=True)
    trainer = PPOTrainer(config, args["--run-id"], device, seed, args["--memory-path"])
    trainer.run()
    print(f"saved models/{args['--run-id']}.nn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
