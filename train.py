"""Train a PPO agent with an episodic Transformer-XL memory.

Usage:
  train.py [options] [--set=<key=value>]...
  train.py (-h | --help)

Options:
  --config=<path>       YAML config [default: configs/poc_memory_env.yaml].
  --run-id=<id>         Name of the run: summaries/<id>/<time>/, models/<id>.nn, models/<id>/checkpoint.pt [default: run].
  --resume=<path>       Continue the run saved in this checkpoint (its config, run id and seed; --set still applies).
  --cpu                 Use the CPU even where CUDA is available.
  --seed=<n>            Seed of the model, the sampling and the environments [default: 0].
  --memory-path=<path>  "fast" (K/V cache and banded attention) or "plain" (per-window specification) [default: fast].
  --set=<key=value>     Override a config key, e.g. --set updates=10 --set transformer.memory_length=16 (YAML values).
  -h --help             Show this help.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch
from docopt import docopt

from checkpoint import load_file
from config import ConfigError, apply_overrides, load_config, parse_overrides, validate_config
from trainer import PPOTrainer, TrainingStopped, check_memory_path
from worker import WorkerError

MIN_FREE_MB = 100  # refuse to start with less free disk space than this for models and summaries


def check_writable(folder: str) -> None:
    """Fail now, not after an hour of training, if ``folder`` cannot take files."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        raise OSError(f"cannot write to '{folder}/' ({error.strerror}): fix its permissions or run elsewhere") from None
    free_mb = shutil.disk_usage(folder).free / 2**20
    if free_mb < MIN_FREE_MB:
        raise OSError(f"only {free_mb:.0f} MB free for '{folder}/' (at least {MIN_FREE_MB} MB needed): free some disk space")


def main() -> int:
    args = docopt(__doc__)
    try:
        seed = int(args["--seed"])
    except ValueError:
        print(f"error: --seed must be an integer, got '{args['--seed']}'", file=sys.stderr)
        return 2
    checkpoint, run_id = None, args["--run-id"]
    try:
        overrides = parse_overrides(args["--set"])
        if args["--resume"]:
            checkpoint = load_file(args["--resume"])
            if checkpoint.get("kind") != "checkpoint":
                raise ValueError(f"'{args['--resume']}' is a model file, not a checkpoint: use models/<run-id>/checkpoint.pt")
            config = validate_config(apply_overrides(checkpoint["config"], overrides))
            run_id, seed = checkpoint["run_id"], checkpoint["seed"]
        else:
            config = load_config(args["--config"], overrides)
        check_memory_path(args["--memory-path"], config)
        for folder in ("models", "summaries"):
            check_writable(folder)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    source = f"checkpoint {args['--resume']}" if checkpoint else args["--config"]
    print(f"training {run_id} on {device} from {source}", flush=True)
    try:
        trainer = PPOTrainer(config, run_id, device, seed, args["--memory-path"], checkpoint=checkpoint)
    except WorkerError as error:
        print(f"error: the environment failed to start: {error}", file=sys.stderr)
        return 1
    except (ValueError, KeyError) as error:
        if checkpoint is None:
            raise
        print(f"error: the checkpoint does not fit this environment or config: {error}", file=sys.stderr)
        return 2
    try:
        trainer.run()
    except TrainingStopped as error:
        print(error, file=sys.stderr)
        return 130 if isinstance(error.__cause__, KeyboardInterrupt) else 1
    print(f"saved {trainer.model_path} and {trainer.checkpoint_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
