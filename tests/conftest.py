"""Shared test fixtures: small configs and a headless pygame."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from config import Config, validate_config  # noqa: E402

POC_ENVIRONMENT = {"type": "PocMemoryEnv"}


def small_config(transformer: dict | None = None, **overrides: object) -> Config:
    """A tiny PoC config for unit tests; keyword arguments override top-level keys."""
    raw = {
        "environment": dict(POC_ENVIRONMENT),
        "n_workers": 4,
        "worker_steps": 16,
        "n_mini_batch": 2,
        "epochs": 1,
        "updates": 2,
        "hidden_layer_size": 16,
        "transformer": {"num_blocks": 2, "embed_dim": 16, "num_heads": 2, "memory_length": 4, **(transformer or {})},
    }
    raw.update(overrides)
    return validate_config(raw)
