"""The trainer end to end: rollout bookkeeping at episode ends, smoke runs of every config, learning on the PoC task."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import small_config

from config import load_config
from environments import agents_per_env
from ppo import clip_gradients
from trainer import PPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


@pytest.mark.parametrize("scale", [0.01, 100.0])  # below and above max_grad_norm
def test_gradient_clipping_matches_torch(tmp_path: str, scale: float) -> None:
    trainer = PPOTrainer(small_config(max_grad_norm=0.5), "clip", torch.device("cpu"), 0, "fast", str(tmp_path), str(tmp_path))
    try:
        parameters = list(trainer.model.parameters())
        for p in parameters:
            p.grad = torch.randn_like(p) * scale
        reference = [torch.nn.Parameter(p.detach().clone()) for p in parameters]
        for r, p in zip(reference, parameters, strict=True):
            r.grad = p.grad.clone()
        expected_modules = {
            f"grad_norm/{name}": torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in module.parameters()]))
            for name, module in trainer.model.named_children()
        }
        expected_norm = torch.nn.utils.clip_grad_norm_(reference, 0.5)
        norms, total = clip_gradients(trainer.model, 0.5)
        assert total == pytest.approx(expected_norm.item(), rel=1e-6)
        for name, norm in norms.items():  # each module's norm before clipping, for the summaries
            assert norm == pytest.approx(expected_modules[name].item(), rel=1e-5)
        for p, r in zip(parameters, reference, strict=True):
            torch.testing.assert_close(p.grad, r.grad)
        assert set(norms) == {f"grad_norm/{name}" for name, _ in trainer.model.named_children()}
    finally:
        trainer.close()


def test_rollout_bookkeeping_at_episode_ends(tmp_path: str) -> None:
    config = small_config(worker_steps=40, n_mini_batch=2, sequence_length=8)
    trainer = PPOTrainer(
        config, "bookkeeping", torch.device("cpu"), seed=3, models_dir=str(tmp_path), summaries_dir=str(tmp_path)
    )
    try:
        for _ in range(2):  # the second rollout starts with the trace carried over the boundary
            trainer.rollout()
            buffer, length = trainer.buffer, config.transformer.memory_length
            steps, episodes = buffer.trace.steps[:, length:], buffer.trace.episodes[:, length:]
            done = buffer.terminated | buffer.truncated
            assert done.any(), "PoC episodes (<= 32 steps) must end inside a 40-step rollout"
            for t in range(1, config.worker_steps):
                ended = done[:, t - 1]
                # the very next step after an end is step 0 of a new episode; otherwise the counter moves on by one
                assert torch.equal(steps[:, t], torch.where(ended, 0, steps[:, t - 1] + 1))
                assert torch.equal(episodes[:, t], episodes[:, t - 1] + ended.long())
            # across the rollout boundary the counter continues from the carried token
            assert ((steps[:, 0] == 0) | (steps[:, 0] == buffer.trace.steps[:, length - 1] + 1)).all()
            assert (buffer.truncated & buffer.terminated).sum() == 0
            assert (buffer.final_values[~buffer.truncated] == 0).all()
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_train_smoke_every_config(path: str, tmp_path: str) -> None:
    # Each agent of a multi-agent environment is a worker lane: one environment's agents, at least 2 lanes.
    workers = max(2, agents_per_env(load_config(path, {}).environment))
    overrides = ["updates=1", f"n_workers={workers}", "worker_steps=8", "n_mini_batch=1", "sequence_length=0", "epochs=1"]
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={path}", "--run-id=smoke", "--cpu", "--seed=1"]
    command += [f"--set={item}" for item in overrides]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "update    1/1" in result.stdout
    assert os.path.isfile(os.path.join(tmp_path, "models", "smoke.nn"))
    assert glob.glob(os.path.join(tmp_path, "summaries", "smoke", "*", "events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["trxl", "gru", "none"])
def test_enjoy_runs_a_trained_model(tmp_path: str, memory: str) -> None:
    config = os.path.join(ROOT, "configs", "poc_memory_env.yaml")
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={config}", "--run-id=tiny", "--cpu"]
    command += ["--set=updates=1", "--set=n_workers=2", f"--set=memory={memory}"]
    assert subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=300).returncode == 0
    enjoy = [sys.executable, os.path.join(ROOT, "enjoy.py"), "--model=models/tiny.nn", "--episodes=3", "--no-render", "--json"]
    result = subprocess.run(enjoy, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])["summary"]
    assert summary["length"]["episodes"] == 3 and 1 <= summary["length"]["mean"] <= 32
    if memory != "trxl":  # the attention figure needs the transformer: a clear error, not a crash
        attention = subprocess.run(
            enjoy[:-1] + ["--record=out.gif", "--attention"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert attention.returncode == 2 and f"memory is '{memory}'" in attention.stderr


@pytest.mark.slow
def test_poc_memory_task_is_learned(tmp_path: str) -> None:
    """The proof-of-memory task needs memory: without it the agent can only guess (success ~0.5)."""
    from config import load_config

    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"), {"updates": 60})
    trainer = PPOTrainer(
        config, "learning", torch.device("cpu"), seed=0, models_dir=str(tmp_path), summaries_dir=str(tmp_path)
    )
    means = trainer.run(log_every=10)
    assert means["success"] >= 0.95, means


@pytest.mark.slow
@pytest.mark.parametrize("memory,solved", [("gru", True), ("none", False)])
def test_poc_memory_task_needs_a_memory_gru_learns_it(tmp_path: str, memory: str, solved: bool) -> None:
    """A GRU solves the proof-of-memory task with the recurrent sister repository's settings; without a memory the
    same agent cannot do better than guessing which end of the corridor rewards."""
    from config import load_config

    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env_gru.yaml"), {"memory": memory})
    trainer = PPOTrainer(
        config, "learning", torch.device("cpu"), seed=0, models_dir=str(tmp_path), summaries_dir=str(tmp_path)
    )
    means = trainer.run(log_every=10)
    if solved:
        assert means["success"] >= 0.95, means
    else:
        assert means["success"] <= 0.75, means


def test_evaluation_cuts_an_episode_that_does_not_end() -> None:
    # A task without a step limit (or a good agent on an Endless task) must not keep an evaluation running forever.
    from evaluation import evaluate
    from model import ActorCriticModel

    config = small_config(environment={"type": "CartPole", "name": "CartPole-v1", "mask_velocity": True})
    model = ActorCriticModel(config, (4,), [2])
    results = evaluate(model, config, torch.device("cpu"), episodes=2, max_steps=3)  # CartPole lasts 8 steps at least
    assert [(r["length"], r["evaluation_cut"]) for r in results] == [(3.0, 1.0), (3.0, 1.0)]
    assert all(r["reward"] == pytest.approx(3 * 0.01) for r in results)  # as the steps gave it (CartPole's 1/100 scale)
