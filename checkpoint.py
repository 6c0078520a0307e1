"""Saving and loading models: one dict of tensors and builtins, loadable with ``torch.load(weights_only=True)``.

Files are written atomically (a temporary file in the same folder, then ``os.replace``), so a run killed while
saving leaves the previous file intact.
"""

from __future__ import annotations

import os
import tempfile

import torch

from config import Config, ConfigError, validate_config
from model import ActorCriticModel


def atomic_save(payload: dict, path: str) -> None:
    """``torch.save`` ``payload`` to ``path`` so that ``path`` is always either the old or the new file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pt")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the permissions a plain open() would
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_model(model: ActorCriticModel, config: Config, path: str) -> None:
    """Write the model file that enjoy.py takes: weights, config, observation shape and action dims."""
    atomic_save(
        {
            "kind": "model",
            "model": model.state_dict(),
            "config": config.to_dict(),
            "observation_shape": list(model.observation_shape),
            "action_dims": list(model.action_dims),
        },
        path,
    )


def load_file(path: str) -> dict:
    """Load a model or checkpoint file, with a clear error for a missing or foreign file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file '{path}' does not exist: pass a file written by train.py, e.g. models/run.nn")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for foreign files
        raise ValueError(
            f"'{path}' is not a model or checkpoint written by train.py ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise ValueError(f"'{path}' is not a model or checkpoint written by train.py (no model weights and config inside)")
    return payload


def load_model(path: str, device: torch.device) -> tuple[ActorCriticModel, Config]:
    """Rebuild the model and its config from a file written by ``save_model`` (or a checkpoint)."""
    payload = load_file(path)
    try:
        config = validate_config(payload["config"])
    except ConfigError as error:
        raise ValueError(f"'{path}' holds a config this version cannot read: {error}") from None
    model = ActorCriticModel(config, tuple(payload["observation_shape"]), payload["action_dims"])
    model.load_state_dict(payload["model"])
    return model.to(device), config
