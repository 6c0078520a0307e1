"""Shared test fixtures: small configs and a headless pygame."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every test process computes on one thread: under `pytest -n N` (make test, make test-fast) each of the N workers, as
# lab/experiment.py gives each of its jobs its share of the cores (N workers with a thread per core each make the
# threads spin), and a lone pytest too, which otherwise spins beside whatever else the machine runs.
import torch  # noqa: E402

from config import Config, validate_config  # noqa: E402

torch.set_num_threads(1)

POC_ENVIRONMENT = {"type": "PocMemoryEnv"}


def small_config(transformer: dict | None = None, **overrides: object) -> Config:
    """A tiny PoC config for unit tests; keyword arguments override top-level keys, ``transformer`` the memory's."""
    raw = {
        "environment": dict(POC_ENVIRONMENT),
        "n_workers": 4,
        "worker_steps": 16,
        "n_mini_batch": 2,
        "epochs": 1,
        "updates": 2,
        "hidden_layer_size": 16,
        # The reference's memory (no gradient into it, no position on the query): the path-equivalence tests compare
        # the fast path with the plain one, which has neither; tests of those options set them. The reference's rate
        # too (no bound on the transformer's, no warm-up), so that one update moves what the tests measure at the
        # schedule's rate; tests/test_memory_learning_rate.py sets the bound and the warm-up.
        "transformer": {
            "num_blocks": 2,
            "embed_dim": 16,
            "num_heads": 2,
            "memory_length": 4,
            "memory_gradients": False,
            "query_position": False,
            "max_learning_rate": 0.0,
            "warmup_updates": 0,
            **(transformer or {}),
        },  # fmt: skip
    }
    raw.update(overrides)
    return validate_config(raw)


def train_small(tmp_path: str, name: str, updates: int, checkpoint: dict | None = None, **overrides: object) -> object:
    """Train a ``small_config`` run (seed 5, no evaluations) in tmp_path/name; returns its trainer."""
    import torch

    from trainer import PPOTrainer

    config = small_config(updates=updates, eval_interval=0, **overrides)
    folder = os.path.join(tmp_path, name)
    trainer = PPOTrainer(config, name, torch.device("cpu"), 5, models_dir=folder, summaries_dir=folder, checkpoint=checkpoint)
    trainer.run()
    return trainer


def resume_matches_uninterrupted(tmp_path: str, **overrides: object) -> dict:
    """Assert that 2 updates, a checkpoint and 2 more end with the weights of 4 uninterrupted updates (episodes run
    across the interruption); returns the checkpoint for further checks."""
    import torch

    whole = train_small(tmp_path, "whole", 4, **overrides)
    first = train_small(tmp_path, "first", 2, **overrides)
    checkpoint = torch.load(first.checkpoint_path, weights_only=True)
    assert any(state["actions"] for state in checkpoint["workers"]), "an episode must be running at the interruption"
    resumed = train_small(tmp_path, "first", 4, checkpoint, **overrides)
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    return checkpoint


class RandomWorkers:
    """A stand-in for ``worker.Workers`` without environments, so that tests drive ``rollout.RolloutCollector``'s own
    loop: N single-agent lanes whose observations are uniform in [0, 1) with ``obs_shape`` ((F,), (C, H, W) or a dict
    of them by key), whose rewards are normal, and whose episodes end at random (``end_rate`` per step and lane; a
    ``truncate_share`` of the ends are time limits, with a final observation for the bootstrap value)."""

    agents = 1

    def __init__(
        self, n: int, obs_shape: tuple | dict, seed: int = 0, end_rate: float = 0.15, truncate_share: float = 0.0
    ) -> None:
        import numpy as np

        self.n, self.obs_shape, self.end_rate, self.truncate_share = n, obs_shape, end_rate, truncate_share
        self.rng = np.random.default_rng(seed)

    def observations(self) -> object:
        """(N, *obs_shape) float32 observations, per key for a dict shape."""
        import numpy as np

        def draw(shape: tuple) -> np.ndarray:
            return self.rng.random((self.n, *shape), dtype=np.float32)

        if isinstance(self.obs_shape, dict):
            return {key: draw(shape) for key, shape in self.obs_shape.items()}
        return draw(self.obs_shape)

    def reset(self) -> object:
        return self.observations()

    def step(self, actions: object) -> object:
        import numpy as np

        from env_group import StepResult

        ends = self.rng.random(self.n) < self.end_rate
        truncated = ends & (self.rng.random(self.n) < self.truncate_share)
        last = self.observations()  # the episodes' final observations; the new ones start where episodes ended
        final_obs = {
            int(i): {key: value[i] for key, value in last.items()} if isinstance(last, dict) else last[i]
            for i in np.flatnonzero(truncated)
        }
        rewards = self.rng.standard_normal(self.n).astype(np.float32)
        return StepResult(self.observations(), rewards, ends & ~truncated, truncated, final_obs, [])


def collect_random_rollout(
    model: object,
    buffer: object,
    obs_shape: tuple | dict,
    seed: int = 0,
    end_rate: float = 0.15,
    n_rollouts: int = 1,
    truncate_share: float = 0.3,
) -> object:
    """Fill the buffer with ``rollout.RolloutCollector`` itself, ``n_rollouts`` times with the memory carried on, on
    ``RandomWorkers`` (random observations of ``obs_shape``, rewards and episode ends, some of them time limits).
    Actions are sampled from torch's global generator, seeded here with ``seed``. Returns the collector."""
    import torch

    from rollout import RolloutCollector

    torch.manual_seed(seed)
    workers = RandomWorkers(buffer.n_workers, obs_shape, seed, end_rate, truncate_share)
    collector = RolloutCollector(model, workers, buffer, 0.99, 0.95, torch.device("cpu"))
    collector.start(workers.reset())
    for _ in range(n_rollouts):
        collector.collect()
    return collector


def random_rollout_buffer(model: object, obs_shape: tuple | dict, n_workers: int, worker_steps: int) -> object:
    """A CPU ``buffer.Buffer`` for the model's observations, discrete actions and memory, filled by
    ``collect_random_rollout`` (seed 0)."""
    import torch

    from buffer import Buffer

    n, t, cpu = n_workers, worker_steps, torch.device("cpu")
    buffer = Buffer(n, t, model.observation_shape, model.storage_dtype, 1, model.memory.trace(n, t, cpu), cpu)
    collect_random_rollout(model, buffer, obs_shape)
    return buffer


def assert_training_reproduces_the_rollout(model: object, buffer: object, sampling: str, chunk: int = 4) -> None:
    """At the rollout's weights, the training forward of every minibatch gives the rollout's log-probs and values."""
    import torch

    from ppo import forward_minibatch

    for minibatch in buffer.minibatches(3, chunk, torch.Generator().manual_seed(1), sampling):
        out = forward_minibatch(model, minibatch)
        valid = torch.ones_like(minibatch.log_probs, dtype=torch.bool) if minibatch.valid is None else minibatch.valid
        log_probs = out.policy.log_prob(minibatch.actions)
        torch.testing.assert_close(log_probs[valid], minibatch.log_probs[valid], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.value[valid], minibatch.values[valid], rtol=1e-5, atol=1e-5)
