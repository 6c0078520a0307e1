"""Checkpoints: safe to load, atomic, and a resumed run ends exactly where an uninterrupted one does."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import small_config

from checkpoint import atomic_save, load_model
from config import apply_overrides, resumable, validate_config
from trainer import PPOTrainer


def train(tmp_path: str, name: str, updates: int, checkpoint: dict | None = None, **overrides: object) -> PPOTrainer:
    config = small_config(updates=updates, eval_interval=0, **overrides)
    folder = os.path.join(tmp_path, name)
    trainer = PPOTrainer(
        config, name, torch.device("cpu"), seed=5, models_dir=folder, summaries_dir=folder, checkpoint=checkpoint
    )
    trainer.run()
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("n_processes,memory", [(0, "trxl"), (2, "trxl"), (0, "gru"), (0, "lstm")])
def test_resumed_run_equals_uninterrupted_run(tmp_path: str, n_processes: int, memory: str) -> None:
    # worker_steps 20 and PoC episodes of up to 32 steps: episodes run across the interruption
    options = dict(worker_steps=20, sequence_length=10, n_processes=n_processes, memory=memory)
    whole = train(tmp_path, "whole", 4, **options)
    first = train(tmp_path, "first", 2, **options)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    assert checkpoint["update"] == 2
    assert any(state["actions"] for state in checkpoint["workers"]), "an episode must be running at the interruption"
    resumed = train(tmp_path, "first", 4, checkpoint=checkpoint, **options)
    assert resumed.env_steps == whole.env_steps
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_checkpoint_loads_weights_only_and_model_file_round_trips(tmp_path: str) -> None:
    trainer = train(tmp_path, "files", 1)
    payload = torch.load(trainer.checkpoint_path, weights_only=True)
    for key in ("model", "optimizer", "config", "update", "env_steps", "rng", "workers", "memory", "trace"):
        assert key in payload
    model, config = load_model(trainer.model_path, torch.device("cpu"))
    assert config == trainer.config
    for (name, a), (_, b) in zip(model.state_dict().items(), trainer.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "file.pt")
    atomic_save({"version": 1}, path)

    class Unpicklable:
        def __reduce__(self) -> tuple:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_save({"version": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {"version": 1}
    assert os.listdir(tmp_path) == ["file.pt"]


def test_a_model_saved_before_query_position_loads_without_it(tmp_path: str) -> None:
    # query_position came with default true; a model saved before it was trained without it and must stay so.
    from checkpoint import load_model, save_model
    from lab.seeds import config_changes
    from model import ActorCriticModel

    config = small_config({"positional_encoding": "relative", "query_position": False})
    model = ActorCriticModel(config, (3,), [3])
    path = os.path.join(tmp_path, "old.nn")
    save_model(model, config, path)
    payload = torch.load(path, weights_only=True)
    del payload["config"]["transformer"]["query_position"]
    torch.save(payload, path)
    loaded, loaded_config = load_model(path, torch.device("cpu"))
    assert loaded_config.transformer.query_position is False
    assert config_changes(payload["config"], config.to_dict()) == []


@pytest.mark.slow
def test_an_episode_too_long_to_replay_restarts_on_resume(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The state of an Endless task must not grow with its episode: beyond the bound the episode is not recorded, and a
    # resume starts that environment's next episode, with a fresh memory for its lanes.
    from environments import replay

    monkeypatch.setattr(replay, "MAX_REPLAY_ACTIONS", 3)
    from conftest import train_small

    first = train_small(tmp_path, "run", 1)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    states = checkpoint["workers"]
    assert all(state["actions"] is None or len(state["actions"]) <= 3 for state in states)
    cut = [i for i, state in enumerate(states) if state["actions"] is None]
    assert cut, "some episode must have run past the bound"
    from trainer import PPOTrainer

    resumed = PPOTrainer(first.config, "run", torch.device("cpu"), 5, models_dir=str(tmp_path), summaries_dir=str(tmp_path),
                         checkpoint=checkpoint)  # fmt: skip
    try:
        steps = resumed.collector.state.episode_steps
        assert all(int(steps[i]) == 0 for i in cut)  # a new episode, a fresh memory
        assert all(int(steps[i]) == len(states[i]["actions"]) for i in range(len(states)) if i not in cut)
        assert resumed.workers.state()[cut[0]]["episode"] == states[cut[0]]["episode"] + 1
    finally:
        resumed.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule, expected",
    [
        ({}, {0: 1e-3, 1: 1e-3, 150: 1e-3}),  # a constant epsilon becomes the new constant
        ({"final": 1e-2, "start": 99, "max_decay_steps": 1}, {0: 1e-3, 99: 1e-3, 100: 1e-2}),  # a schedule starts anew
    ],
    ids=["constant", "scheduled"],
)
def test_resuming_with_a_new_adam_epsilon_sets_it_where_the_schedule_starts(
    tmp_path: str, schedule: dict, expected: dict
) -> None:
    # The checkpoint's config, as train.py --resume reads it, with --set adam_epsilon=1e-3 (issue: refused, or with
    # the schedule's initial set too, epsilon fell back to the saved final after update 0).
    trainer = train(tmp_path, "eps", 1, adam_epsilon=1e-4, adam_epsilon_schedule=schedule)
    saved = torch.load(trainer.checkpoint_path, weights_only=True)["config"]
    resumed = validate_config(apply_overrides(resumable(saved), {"adam_epsilon": 1e-3}))
    assert {update: resumed.adam_epsilon_schedule.value(update) for update in expected} == pytest.approx(expected)
    unchanged = validate_config(resumable(saved))
    assert unchanged == trainer.config  # resuming without --set keeps the run's config as it was
