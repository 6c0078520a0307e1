"""Turn a trained model into a folder anyone can load: the weights in safetensors, the resolved config, a model card
(README.md) with an evaluation that this command runs, a short replay, and that evaluation as JSON. enjoy.py plays
the folder as it plays the model file (``--model=FOLDER``); ``--push-to-hub`` uploads it to the Hugging Face Hub.

Usage:
  python -m lab.export --model=<path> --out=<folder> [options]
  python -m lab.export (-h | --help)

Options:
  --model=<path>          Model file written by train.py (models/<run-id>.nn) or a checkpoint (required).
  --out=<folder>          The folder to write (created where missing): the weights, the config, README.md (the model
                          card), replay.gif and evaluation.json, each replaced where it exists; other files are left
                          alone (required).
  --episodes=<n>          Unseen episodes of the evaluation that the card reports [default: 100].
  --seed=<n>              Evaluation seed, as enjoy.py's: the card's episodes are those of
                          enjoy.py --model=FOLDER --episodes=<n> --seed=<n> [default: 0].
  --replay-steps=<n>      replay.gif shows at most this many steps of the first evaluation episode [default: 100].
  --trained-with=<cmd>    The command that trained the model, for the card (default: train.py on the folder's config,
                          with the run id and seed where the model file records them).
  --push-to-hub=<repo>    Then upload the folder to this Hugging Face Hub model repository (user/name), created where
                          missing; needs pip install huggingface_hub and a login (huggingface-cli login, or HF_TOKEN).
  --cpu                   Evaluate on the CPU even where CUDA is available.
  -h --help               Show this help.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import numpy as np
import torch
import yaml

from checkpoint import FOLDER_CONFIG, FOLDER_WEIGHTS, load_file, load_model, write_folder
from cli import parse_args, shipped_path
from config import Config, ConfigError
from evaluation import evaluate, format_summary, record_episode, summarize
from summaries import gif_bytes

CARD, REPLAY, EVALUATION = "README.md", "replay.gif", "evaluation.json"


class ExportError(ValueError):
    """The model or the destination cannot be exported as asked; the message names the fix."""


def task_name(environment: dict) -> str:
    """The task of an environment section: its type, and the id or name of the task within it where that does not
    name the type already ("MemoryGym MortarMayhem-Grid-v0", "CartPole-v0")."""
    kind, inner = environment["type"], environment.get("id") or environment.get("name")
    if not inner:
        return kind
    return inner if kind.lower() in inner.lower() else f"{kind} {inner}"


def memory_description(config: Config) -> str:
    """One line on the agent's memory."""
    if config.memory == "trxl":
        t = config.transformer
        kind = "GTrXL" if t.gtrxl else "TrXL"
        encoding = t.positional_encoding or "none"
        bias = ", ALiBi recency bias" if t.recency_bias else ""
        heads = f"{t.num_heads} head{'s' if t.num_heads > 1 else ''}"
        return (
            f"Episodic {kind}: {t.num_blocks} blocks of width {t.embed_dim}, {heads}, attending to the last "
            f"{t.memory_length} steps of the episode (positional encoding {encoding}{bias})"
        )
    if config.memory in ("gru", "lstm"):
        r = config.recurrence
        return f"{config.memory.upper()}: {r.num_layers} layer(s) of {r.hidden_state_size} units"
    return "None: the encoder's features go straight to the policy and value heads"


def training_budget(config: Config, training: dict | None) -> str:
    """How long the model trained: the run's own counters where the model file records them, else its config's
    budget (a run stopped early trained less)."""
    batch = f"{config.n_workers} workers x {config.worker_steps} steps"
    if training:
        return f"{training['update']} updates of {batch}: {training['env_steps']:,} environment steps"
    steps = config.updates * config.n_workers * config.worker_steps
    return (
        f"{config.updates} updates of {batch}: {steps:,} environment steps (the config's budget: this model file "
        "does not record how far its run trained)"
    )


def training_command(out: str, training: dict | None) -> str:
    """train.py on the folder's config (the resolved config the model trained with), with the run id and seed
    where the model file records them."""
    command = ["python", "train.py", f"--config={os.path.join(out, FOLDER_CONFIG)}"]
    if training:
        command += [f"--run-id={training['run_id']}", f"--seed={training['seed']}"]
    return shlex.join(command)


def evaluation_command(out: str, episodes: int, seed: int) -> str:
    """The enjoy.py command that plays the card's evaluation again."""
    return shlex.join(
        ["python", "enjoy.py", f"--model={out}", f"--episodes={episodes}", f"--seed={seed}", "--no-render", "--json"]
    )


def card(name: str, config: Config, evaluation: dict, out: str, trained_with: str, budget: str) -> str:
    """The model card (README.md): Hugging Face's metadata header, then the task, the memory, the evaluation that
    the export ran, the training and how to play the folder."""
    summary, episodes, seed = evaluation["summary"], evaluation["episodes"], evaluation["seed"]
    metric = "success" if "success" in summary else "reward"
    headline = summary[metric]
    header = {
        "tags": ["reinforcement-learning", "ppo", "memory", f"memory-{config.memory}", config.environment["type"]],
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "reinforcement-learning", "name": "reinforcement-learning"},
                        "dataset": {"type": task_name(config.environment), "name": task_name(config.environment)},
                        "metrics": [
                            {
                                "type": f"mean_{metric}",
                                "name": f"mean {metric} over {episodes} unseen episodes",
                                "value": f"{headline['mean']:.3f} [{headline['ci_low']:.3f}, {headline['ci_high']:.3f}]",
                            }
                        ],
                    }
                ],
            }
        ],
    }
    rows = "\n".join(
        f"| {key} | {s['mean']:.3f} | {s['iqm']:.3f} | [{s['ci_low']:.3f}, {s['ci_high']:.3f}] |" for key, s in summary.items()
    )
    environment = yaml.safe_dump(config.environment, sort_keys=False).rstrip()
    trxl = config.memory == "trxl"
    replay = shlex.join(["python", "enjoy.py", f"--model={out}", "--record=replay.gif", *(["--attention"] if trxl else [])])
    strips = " with the attention strips (one row per block and head, over the memory's slots)" if trxl else ""
    return f"""---
{yaml.safe_dump(header, sort_keys=False).rstrip()}
---

# {name}: PPO with an episodic memory on {task_name(config.environment)}

A PPO agent trained by `train.py` of the repository "PPO with an episodic Transformer-XL memory". The weights are in
`{FOLDER_WEIGHTS}`, the resolved config it trained with (every key, defaults filled in) in `{FOLDER_CONFIG}`.

![the first evaluation episode]({REPLAY})

## Task

{task_name(config.environment)}, as the config's environment section gives it:

```yaml
{environment}
```

## Memory

{memory_description(config)}.

## Evaluation

{episodes} unseen episodes with evaluation seed {seed} (episode k is reset with a seed hashed from ({seed}, 0, k), odd,
so that no training episode had it), actions sampled from the policy, on the {evaluation["device"]}: per metric the
mean, the interquartile mean and a 95% percentile-bootstrap interval of the mean (2000 resamples). `python -m
lab.export` ran this evaluation when it wrote the folder; `{EVALUATION}` holds its numbers.

| metric | mean | IQM | 95% CI of the mean |
|---|---|---|---|
{rows}

## Training

- Budget: {budget}.
- Trained with: `{trained_with}`

## Use

```bash
{evaluation_command(out, episodes, seed)}   # the evaluation above
{replay}   # a replay of the first episode
```

`{REPLAY}` shows the first evaluation episode{strips}.

From the Hugging Face Hub: `huggingface-cli download <user/name> --local-dir FOLDER` fetches the folder, and
`python enjoy.py --model=FOLDER` plays it (enjoy.py of the repository that trained it, with `pip install safetensors`).
"""


def export(
    model_path: str, out: str, episodes: int, seed: int, replay_steps: int, trained_with: str | None, device: torch.device
) -> dict:
    """Write the model folder ``out`` of ``model_path``; returns the evaluation the card reports (as enjoy.py --json
    prints it, with the device)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out '{out}' is a file: give a folder (created where missing)")
    payload = load_file(model_path)
    model, config = load_model(model_path, device)
    print(f"evaluating {episodes} unseen episodes (seed {seed}) on the {device.type} ...", flush=True)
    start = time.perf_counter()
    results = evaluate(model, config, device, episodes, seed)
    summary = summarize(results, seed=seed)
    print(f"{format_summary(summary)}\n({time.perf_counter() - start:.0f}s)", flush=True)
    evaluation = {"model": model_path, "episodes": episodes, "seed": seed, "device": device.type, "summary": summary}
    frames = record_episode(model, config, device, seed)[:replay_steps]
    training = payload.get("training")
    name = os.path.basename(os.path.normpath(out))
    command = trained_with or training_command(out, training)
    write_folder(payload, out)
    with open(os.path.join(out, CARD), "w") as file:
        file.write(card(name, config, evaluation, out, command, training_budget(config, training)))
    with open(os.path.join(out, REPLAY), "wb") as file:
        file.write(gif_bytes([np.asarray(frame) for frame in frames]))
    with open(os.path.join(out, EVALUATION), "w") as file:
        json.dump(evaluation, file, indent=1)
        file.write("\n")
    return evaluation


def push_to_hub(folder: str, repo: str) -> str:
    """Upload ``folder`` to the Hugging Face Hub model repository ``repo`` (created where missing); returns its URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ExportError(
            f"--push-to-hub {repo} needs huggingface_hub: pip install huggingface_hub (the folder {folder} is written)"
        ) from None
    api = HfApi()
    url = api.create_repo(repo, repo_type="model", exist_ok=True)
    api.upload_folder(
        folder_path=folder, repo_id=repo, repo_type="model", commit_message="Upload a model folder of lab.export"
    )
    return str(url)


def main(argv: list[str] | None = None) -> int:
    """Run the export with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    try:
        episodes, seed, replay_steps = int(args["--episodes"]), int(args["--seed"]), int(args["--replay-steps"])
    except ValueError:
        print("error: --episodes, --seed and --replay-steps must be integers", file=sys.stderr)
        return 2
    if episodes < 1 or replay_steps < 1:
        print(f"error: --episodes ({episodes}) and --replay-steps ({replay_steps}) must be at least 1", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    model_path, out = shipped_path(args["--model"]), args["--out"]
    try:
        export(model_path, out, episodes, seed, replay_steps, args["--trained-with"], device)
        print(f"wrote {out}/: {FOLDER_WEIGHTS}, {FOLDER_CONFIG}, {CARD}, {REPLAY}, {EVALUATION}")
        if args["--push-to-hub"]:
            print(f"uploaded to {push_to_hub(out, args['--push-to-hub'])}")
    except (FileNotFoundError, ValueError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
