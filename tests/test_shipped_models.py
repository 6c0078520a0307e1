"""The trained models shipped in models/trained/ (docs/evaluation.md#trained-models): each is the final model of its config
in configs/, stored in half precision, and plays; the proof-of-memory one still solves its task."""

from __future__ import annotations

import glob
import os

import numpy as np
import torch

from checkpoint import load_file, load_model
from cli import ROOT
from config import load_config, parse_overrides
from evaluation import evaluate
from lab.seeds import config_changes

SHIPPED = sorted(glob.glob(os.path.join(ROOT, "models", "trained", "*.nn")))
EXPECTED = {"poc_memory_env", "cartpole", "mortar_mayhem_grid_1", "minigrid"}  # the small CPU tasks
# The defaults that changed after the shipped models were trained (2026-12-05), at the values they trained with: how
# fast the transformer learns, not what the network is (docs/evaluation.md#trained-models).
TRAINED_WITH = ["transformer.max_learning_rate=0.0", "transformer.warmup_updates=0"]


def name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def test_the_small_cpu_tasks_have_a_shipped_model() -> None:
    assert EXPECTED <= {name(path) for path in SHIPPED}


def test_each_shipped_model_is_its_configs_in_half_precision_and_plays() -> None:
    for path in SHIPPED:
        payload = load_file(path)
        config = load_config(os.path.join(ROOT, "configs", f"{name(path)}.yaml"), parse_overrides(TRAINED_WITH))
        assert config_changes(payload["config"], config.to_dict()) == [], path
        floats = [value for value in payload["model"].values() if value.is_floating_point()]
        assert floats and all(value.dtype == torch.float16 for value in floats), path
        model, _ = load_model(path, torch.device("cpu"))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert len(evaluate(model, config, torch.device("cpu"), episodes=2)) >= 2, path


def test_the_shipped_proof_of_memory_model_solves_unseen_episodes() -> None:
    path = os.path.join(ROOT, "models", "trained", "poc_memory_env.nn")
    model, config = load_model(path, torch.device("cpu"))
    results = evaluate(model, config, torch.device("cpu"), episodes=30)
    assert np.mean([result["success"] for result in results]) >= 0.9
