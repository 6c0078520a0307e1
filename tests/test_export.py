"""python -m lab.export: a model folder that plays exactly as its model file (``enjoy.py --model=FOLDER``), a model
card whose numbers are those of an evaluation the export runs, and errors that name what to install."""

from __future__ import annotations

import json
import os
import sys

import imageio.v2 as imageio
import pytest
import torch
from conftest import small_config

import enjoy
from checkpoint import FOLDER_CONFIG, FOLDER_WEIGHTS, load_file
from cli import ROOT
from lab import export
from trainer import PPOTrainer

SHIPPED = os.path.join(ROOT, "models", "trained", "poc_memory_env.nn")
FILES = sorted([FOLDER_WEIGHTS, FOLDER_CONFIG, export.CARD, export.REPLAY, export.EVALUATION])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The model file of one update of a tiny run (seed 5): a policy still far from solved, whose episodes differ."""
    folder = str(tmp_path_factory.mktemp("tiny"))
    config = small_config(updates=1, eval_interval=0)
    PPOTrainer(config, "tiny", torch.device("cpu"), 5, models_dir=folder, summaries_dir=folder).run()
    return os.path.join(folder, "tiny.nn")


def enjoy_json(model: str, episodes: int, seed: int, capsys: pytest.CaptureFixture) -> dict:
    """What ``enjoy.py --model=<model> --episodes=<episodes> --seed=<seed> --no-render --json`` prints."""
    capsys.readouterr()
    flags = [f"--model={model}", f"--episodes={episodes}", f"--seed={seed}", "--no-render", "--json", "--quiet", "--cpu"]
    assert enjoy.main(flags) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_shipped_proof_of_memory_model_exports_to_a_folder_that_plays_as_its_file(
    tmp_path: str, capsys: pytest.CaptureFixture
) -> None:
    out = os.path.join(tmp_path, "poc_memory_env")
    assert export.main([f"--model={SHIPPED}", f"--out={out}", "--cpu"]) == 0
    assert sorted(os.listdir(out)) == FILES
    folder = load_file(out)
    file = load_file(SHIPPED)
    assert set(folder["model"]) == set(file["model"])
    for key, value in file["model"].items():  # as stored: float16, as shipped
        assert folder["model"][key].dtype == value.dtype and torch.equal(folder["model"][key], value), key
    played = enjoy_json(out, 100, 0, capsys)
    expected = enjoy_json(SHIPPED, 100, 0, capsys)
    assert played["summary"] == expected["summary"] and expected["summary"]["success"]["episodes"] == 100
    with open(os.path.join(out, export.EVALUATION)) as handle:
        assert json.load(handle)["summary"] == expected["summary"]  # the card's evaluation is enjoy.py's
    frames = imageio.mimread(os.path.join(out, export.REPLAY))
    assert 2 <= len(frames) <= 100


@pytest.mark.slow
def test_the_card_reports_the_evaluation_the_export_ran_and_the_run(
    tiny_model: str, tmp_path: str, capsys: pytest.CaptureFixture
) -> None:
    out = os.path.join(tmp_path, "tiny-card")
    assert export.main([f"--model={tiny_model}", f"--out={out}", "--episodes=20", "--seed=3", "--cpu"]) == 0
    ours = enjoy_json(tiny_model, 20, 3, capsys)["summary"]  # this test's own evaluation
    length = ours["length"]
    assert length["ci_low"] < length["ci_high"], "the episodes must differ, or any typed-in number could match"
    card = open(os.path.join(out, export.CARD)).read()
    for key, s in ours.items():
        assert f"| {key} | {s['mean']:.3f} | {s['iqm']:.3f} | [{s['ci_low']:.3f}, {s['ci_high']:.3f}] |" in card, key
    assert "20 unseen episodes with evaluation seed 3" in card
    assert f"python enjoy.py --model={out} --episodes=20 --seed=3 --no-render --json" in card
    assert "1 updates of 4 workers x 16 steps: 64 environment steps" in card  # from the model file's own counters
    assert f"python train.py --config={os.path.join(out, FOLDER_CONFIG)} --run-id=tiny --seed=5" in card
    assert enjoy_json(out, 20, 3, capsys)["summary"] == ours  # the folder plays as the file


def test_a_folder_without_a_model_is_named(tmp_path: str, capsys: pytest.CaptureFixture) -> None:
    assert enjoy.main([f"--model={tmp_path}", "--no-render", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert f"'{tmp_path}' is a folder without {FOLDER_WEIGHTS} and {FOLDER_CONFIG}" in error


def test_optional_packages_are_named_with_their_install(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name in (FOLDER_WEIGHTS, FOLDER_CONFIG):
        open(os.path.join(tmp_path, name), "w").close()
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    assert enjoy.main([f"--model={tmp_path}", "--no-render", "--cpu"]) == 2
    assert "pip install safetensors" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(export.ExportError, match="pip install huggingface_hub"):
        export.push_to_hub(str(tmp_path), "someone/poc")


def test_each_shipped_model_has_its_folder_with_the_same_weights() -> None:
    for name in ("poc_memory_env", "cartpole", "mortar_mayhem_grid_1", "minigrid"):
        file = load_file(os.path.join(ROOT, "models", "trained", f"{name}.nn"))
        folder = os.path.join(ROOT, "models", "trained", name)
        assert sorted(os.listdir(folder)) == FILES, name
        weights = load_file(folder)["model"]
        assert set(weights) == set(file["model"]) and all(torch.equal(weights[k], v) for k, v in file["model"].items()), name
        with open(os.path.join(folder, export.EVALUATION)) as handle:
            assert json.load(handle)["summary"]["reward"]["episodes"] == 100, name
