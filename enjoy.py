"""Watch or evaluate a trained agent on unseen seeds.

Usage:
  enjoy.py [options] [--set=<key=value>]...
  enjoy.py (-h | --help)

Options:
  --model=<path>      Model file written by train.py, holding the weights and the config, or a model folder written by
                      python -m lab.export (its weights in safetensors and its config) [default: models/run.nn].
  --random            Play uniformly random actions instead of a model (each action entry uniform over its values or
                      within its bounds) in the environment of --config, on the same unseen seeds: the chance level to
                      compare a score with (no window; --set then changes any config key).
  --config=<path>     With --random: the config whose environment is played.
  --episodes=<n>      Number of episodes [default: 1].
  --seed=<n>          Evaluation seed; evaluation seeds never overlap training seeds [default: 0].
  --no-render         Do not open a window.
  --deterministic     Take the most likely action instead of sampling.
  --record=<file>     Write the frames to a GIF without a display (.mp4 works where imageio-ffmpeg is installed).
  --attention         With --record: under each frame, one labelled strip per block and head showing the step's
                      attention over its memory window.
  --set=<key=value>   Change a key of the model's environment section (repeatable), e.g. environment.kwargs.agents=4
                      to play a multi-agent task with 4 agents; only environment keys, and observations and actions
                      must still fit the model.
  --json              Print the summary as one JSON object on the last line.
  --quiet             Print nothing on stdout but the --json line (errors and notes still go to stderr), for scripts.
  --cpu               Use the CPU even where CUDA is available.
  -h --help           Show this help.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import torch

import observations
from checkpoint import load_model
from cli import ROOT, no_display_reason, parse_args, shipped_path
from config import Config, ConfigError, apply_overrides, load_config, parse_overrides
from environments import create_env, validate_env_config
from environments.action_spec import ActionSpec
from evaluation import evaluate, format_summary, random_play, summarize
from model import ActorCriticModel
from summaries import attention_frame

DEFAULT_MODEL = "models/run.nn"  # the --model default of the usage text: train.py's default --run-id
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm")  # what imageio writes through its ffmpeg plugin


def check_record_path(path: str) -> None:
    """Raise ValueError now, before any episode runs, where ``path`` cannot be written: a GIF always can, a video only
    where imageio's ffmpeg plugin finds an ffmpeg (the imageio-ffmpeg package)."""
    extension = os.path.splitext(path)[1].lower()
    if extension == ".gif":
        return
    if extension not in VIDEO_EXTENSIONS:
        raise ValueError(f"--record '{path}': record to a .gif file (or {', '.join(VIDEO_EXTENSIONS)} with imageio-ffmpeg)")
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        raise ValueError(
            f"--record '{path}' needs ffmpeg, which imageio cannot find: pip install imageio-ffmpeg, or record a .gif"
        ) from None


def write_video(frames: list[np.ndarray], path: str, fps: int = 8) -> None:
    """Write frames (each (H, W, 3) uint8, same size) to a GIF or video file (``check_record_path`` first)."""
    import imageio.v2 as imageio

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if path.lower().endswith(".gif"):
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
        return
    try:
        imageio.mimsave(path, frames, fps=fps)
    except (ImportError, ValueError, RuntimeError) as error:
        raise ValueError(f"cannot write '{path}': {str(error).splitlines()[0]}") from None


def existing_models() -> list[str]:
    """The model files in models/ of the current folder and of the repository root, as paths enjoy.py takes."""
    found = []
    for folder in ("models", os.path.join(ROOT, "models")):
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                path = os.path.join(folder, name)
                if name.endswith(".nn") and os.path.isfile(path) and os.path.abspath(path) not in map(os.path.abspath, found):
                    found.append(path)
    return found


def missing_model_message(path: str) -> str:
    """Say that the model file ``path`` does not exist, and which ones do (or how to train one)."""
    message = f"error: model file '{path}' does not exist"
    if path == DEFAULT_MODEL:
        message += " (the default --model: what python train.py writes with the default --run-id run)"
    models = existing_models()
    if models:
        shown = ", ".join(models[:10]) + (f" and {len(models) - 10} more" if len(models) > 10 else "")
        return f"{message}. Models found: {shown}; pass one with --model={models[0]}"
    return (
        f"{message}, and models/ holds no *.nn file. Train one first: make train (writes models/poc.nn), "
        "or python train.py --run-id=<id> (writes models/<id>.nn)"
    )


def with_environment(model: ActorCriticModel, config: Config, items: list[str]) -> Config:
    """The model's config with the ``--set`` items applied to its environment section, checked against the model.

    Raises:
        ValueError: For an item that is not key=value, a key outside ``environment.``, an environment section that does
            not validate, or an environment whose observations or actions no longer fit the model.
    """
    if not items:
        return config
    try:
        overrides = parse_overrides(items)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    outside = [key for key in overrides if not key.startswith("environment.")]
    if outside:
        raise ValueError(
            f"--set {outside[0]}: enjoy.py changes only keys of the environment section (environment.<key>); the "
            "model's other settings are fixed by its training"
        )
    section = validate_env_config(apply_overrides({"environment": config.environment}, overrides)["environment"])
    env = create_env(section)
    try:
        shape, actions = observations.shape_of(env.observation_space), ActionSpec.of(env.action_space)
    finally:
        env.close()
    if shape != model.observation_shape or actions != model.actions:
        raise ValueError(
            f"with --set {' '.join(items)} the environment has observations {observations.plain_shape(shape)} and "
            f"actions {actions}, but the model takes {observations.plain_shape(model.observation_shape)} and "
            f"{model.actions}: change only keys that keep observations and actions as they are"
        )
    return dataclasses.replace(config, environment=section)


def main(argv: list[str] | None = None) -> int:
    """Run enjoy.py with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    try:
        episodes, seed = int(args["--episodes"]), int(args["--seed"])
    except ValueError:
        print("error: --episodes and --seed must be integers", file=sys.stderr)
        return 2
    if episodes < 1:
        print(f"error: --episodes must be at least 1, got {episodes}", file=sys.stderr)
        return 2
    if args["--random"]:
        return play_randomly(args, episodes, seed)
    if args["--config"] is not None:
        print("error: --config goes with --random: a model brings the config it was trained with", file=sys.stderr)
        return 2
    if args["--attention"] and not args["--record"]:
        print("error: --attention draws into recorded frames: add --record=out.gif", file=sys.stderr)
        return 2
    model_path = shipped_path(args["--model"])
    if model_path != args["--model"]:
        print(f"note: '{args['--model']}' is not in this folder; using {model_path}", file=sys.stderr)
    if not os.path.exists(model_path):
        print(missing_model_message(model_path), file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    try:
        model, config = load_model(model_path, device)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        config = with_environment(model, config, args["--set"])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args["--attention"] and config.memory != "trxl":
        print(
            f"error: --attention draws the transformer's attention, and this model's memory is '{config.memory}': "
            "leave out --attention",
            file=sys.stderr,
        )
        return 2
    record = args["--record"]
    render_mode = "rgb_array" if record else (None if args["--no-render"] else "human")
    if record:
        try:
            check_record_path(record)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    no_display = no_display_reason() if render_mode == "human" else None
    if no_display:
        print(
            f"error: no display to open a window on ({no_display}): use --record=<file.gif> to write the frames to "
            "a file, or --no-render to only evaluate",
            file=sys.stderr,
        )
        return 2
    frames: list[np.ndarray] = []
    episode = 0

    def on_step(env: object, step: int, attention: list[np.ndarray] | None) -> None:
        nonlocal episode
        episode += step == 1
        if record:
            frame = env.render()
            if attention is not None:
                frame = attention_frame(frame, attention, config.transformer.memory_length, episode, step)
            frames.append(frame)

    try:
        results = evaluate(
            model, config, device, episodes, seed, args["--deterministic"], render_mode, on_step, bool(args["--attention"])
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = report(results, seed, args["--quiet"])
    if record:
        try:
            write_video(frames, record)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if not args["--quiet"]:
            print(f"wrote {len(frames)} frames to {record}")
    if args["--json"]:
        print(json.dumps({"model": model_path, "episodes": episodes, "seed": seed, "summary": summary}))
    return 0


def report(results: list[dict[str, float]], seed: int, quiet: bool = False) -> dict[str, dict[str, float]]:
    """Prints each episode's metrics and their summary (unless ``quiet``); returns the summary."""
    summary = summarize(results, seed=seed)
    if not quiet:
        for index, result in enumerate(results):
            details = "  ".join(f"{key} {value:g}" for key, value in result.items())
            print(f"episode {index + 1}: {details}")
        print(format_summary(summary))
    return summary


def play_randomly(args: dict, episodes: int, seed: int) -> int:
    """enjoy.py --random: uniformly random actions in the environment of --config; returns the exit code."""
    if args["--config"] is None:
        print(
            "error: --random plays the environment of a config: add --config=<path>, e.g. configs/frostbite.yaml",
            file=sys.stderr,
        )
        return 2
    unused = [flag for flag in ("--record", "--attention", "--deterministic") if args[flag]]
    if unused or args["--model"] != DEFAULT_MODEL:
        print(f"error: --random plays without a model: leave out {', '.join(unused) or '--model'}", file=sys.stderr)
        return 2
    try:
        path = shipped_path(args["--config"])
        config = load_config(path, parse_overrides(args["--set"]))
        results = random_play(config.environment, episodes, seed)
    except (ConfigError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = report(results, seed, args["--quiet"])
    if args["--json"]:
        print(json.dumps({"random": path, "episodes": episodes, "seed": seed, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
