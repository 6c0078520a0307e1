"""PPOTrainer: rollouts with the episodic memory, GAE, and clipped PPO updates on sequence chunks.

Shapes follow the legend in buffer.py.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from buffer import Buffer, Minibatch
from checkpoint import save_model
from config import Config
from memory import RolloutMemory
from model import ActorCriticModel, ModelOutput, distributions, entropy, log_prob, sample_actions
from worker import Workers

MEMORY_PATHS = ("fast", "plain")
MEMORY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def forward_minibatch(model: ActorCriticModel, minibatch: Minibatch, memory_length: int, path: str) -> ModelOutput:
    """Logits, values and tokens of a minibatch's B x C steps, each attending to its own memory window.

    ``fast`` projects each of a chunk's S memory slots once and lets the C queries attend to their bands of it in one
    attention call. ``plain`` (the executable specification) cuts out every step's window and projects it on its own.
    Both give the same numbers; tests/test_equivalence.py holds them to it.
    """
    if path == "fast":
        keys_values = model.project_memory(minibatch.memory, minibatch.memory_steps)  # per block (B, H, S, d)
        return model(minibatch.obs, keys_values, minibatch.mask)
    b, c = minibatch.obs.shape[:2]
    windows = minibatch.memory.unfold(1, memory_length, 1)  # (B, C, K, D, L)
    windows = windows.permute(0, 1, 4, 2, 3).reshape(b * c, memory_length, *windows.shape[2:4])  # (B C, L, K, D)
    steps = minibatch.memory_steps.unfold(1, memory_length, 1).reshape(b * c, memory_length)  # (B C, L)
    visible = minibatch.windows_visible.reshape(b * c, memory_length)  # (B C, L)
    out = model.forward_windows(minibatch.obs.reshape(b * c, *minibatch.obs.shape[2:]), windows, steps, visible)
    return ModelOutput(
        [logits.view(b, c, -1) for logits in out.logits],
        out.value.view(b, c),
        out.tokens.view(b, c, *out.tokens.shape[2:]),
        None,
    )


class RolloutStats(NamedTuple):
    """Finished episodes of one rollout: metric name -> values."""

    episodes: dict[str, list[float]]


class PPOTrainer:
    """Runs the whole training loop for one config."""

    def __init__(
        self,
        config: Config,
        run_id: str,
        device: torch.device,
        seed: int = 0,
        memory_path: str = "fast",
        models_dir: str = "models",
        summaries_dir: str = "summaries",
    ) -> None:
        if memory_path not in MEMORY_PATHS:
            raise ValueError(f"memory path '{memory_path}' is unknown: use one of {', '.join(MEMORY_PATHS)}")
        self.config = config
        self.run_id = run_id
        self.device = device
        self.memory_path = memory_path
        self.models_dir = models_dir
        torch.manual_seed(seed)
        np.random.seed(seed)
        self.generator = torch.Generator().manual_seed(seed)

        self.workers = Workers(config.environment, config.n_workers, config.n_processes, seed)
        obs_shape = self.workers.observation_space.shape
        action_dims = self.workers.action_dims
        tf = config.transformer
        self.model = ActorCriticModel(config, obs_shape, action_dims).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate_schedule.initial)
        memory_dtype = MEMORY_DTYPES[config.memory_dtype]
        self.buffer = Buffer(
            config.n_workers, config.worker_steps, tf.memory_length, tf.num_blocks, tf.embed_dim, obs_shape,
            len(action_dims), memory_dtype, device,
        )  # fmt: skip
        self.memory = RolloutMemory(
            config.n_workers,
            tf.memory_length,
            tf.num_blocks,
            tf.embed_dim,
            memory_dtype,
            device,
            cache_kv=memory_path == "fast",
        )
        self.obs = self._tensor(self.workers.reset())
        self.update = 0
        self.env_steps = 0
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.writer = SummaryWriter(os.path.join(summaries_dir, run_id, stamp))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, dtype=torch.float32, device=self.device)

    @torch.no_grad()
    def rollout(self) -> RolloutStats:
        """Collect T steps from every worker into the buffer, then compute advantages."""
        self.model.eval()
        buffer, memory = self.buffer, self.memory
        buffer.start_rollout()
        memory.refresh(self.model)
        episodes: dict[str, list[float]] = defaultdict(list)
        for t in range(self.config.worker_steps):
            keys_values, mask = memory.inputs(self.model)
            out = self.model(self.obs.unsqueeze(1), keys_values, mask)
            actions, log_probs = sample_actions([logits[:, 0] for logits in out.logits])
            tokens = out.tokens[:, 0]  # (N, K, D)
            buffer.record_step(
                t, self.obs, actions, log_probs, out.value[:, 0], tokens, memory.episode_steps, memory.episode_ids
            )
            memory.append(self.model, tokens)
            result = self.workers.step(actions.cpu().numpy())
            terminated = torch.as_tensor(result.terminated, device=self.device)
            truncated = torch.as_tensor(result.truncated, device=self.device)
            final_values = torch.zeros(self.config.n_workers, device=self.device)
            if truncated.any():
                # A time limit is no terminal state: bootstrap from the final observation with its own episode's memory.
                index = truncated.nonzero().squeeze(1)
                final_obs = self._tensor(np.stack([result.final_obs[i] for i in index.tolist()]))
                keys_values, mask = memory.inputs(self.model, index)
                final_values[index] = self.model(final_obs.unsqueeze(1), keys_values, mask).value[:, 0]
            buffer.record_outcome(t, self._tensor(result.rewards), terminated, truncated, final_values)
            memory.end_episodes(terminated | truncated)
            self.obs = self._tensor(result.obs)
            for episode in result.episodes:
                for key, value in episode.items():
                    episodes[key].append(float(value))
        # The bootstrap value uses exactly the window the next rollout step will use.
        keys_values, mask = memory.inputs(self.model)
        last_values = self.model(self.obs.unsqueeze(1), keys_values, mask).value[:, 0]
        buffer.compute_advantages(last_values, self.config.gamma, self.config.lamda)
        self.env_steps += self.config.n_workers * self.config.worker_steps
        return RolloutStats(dict(episodes))

    def optimize(self) -> dict[str, float]:
        """Run the PPO epochs over the buffer; returns mean training statistics."""
        self.model.train()
        config = self.config
        learning_rate = config.learning_rate_schedule.value(self.update)
        beta = config.beta_schedule.value(self.update)
        clip_range = config.clip_range_schedule.value(self.update)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(config.epochs):
            for minibatch in self.buffer.minibatches(config.n_mini_batch, config.sequence_length, self.generator):
                for key, value in self._train_minibatch(minibatch, clip_range, beta).items():
                    stats[key].append(value)
        values, returns = self.buffer.values.flatten(), self.buffer.returns.flatten()
        variance = returns.var()
        explained = (1 - (returns - values).var() / variance).item() if variance > 0 else float("nan")
        result = {key: float(np.mean(value)) for key, value in stats.items()}
        result.update(
            explained_variance=explained, learning_rate=learning_rate, entropy_coefficient=beta, clip_range=clip_range
        )
        return result

    def _train_minibatch(self, minibatch: Minibatch, clip_range: float, beta: float) -> dict[str, float]:
        """One gradient step on one minibatch; returns its losses and diagnostics."""
        out = forward_minibatch(self.model, minibatch, self.config.transformer.memory_length, self.memory_path)
        dists = distributions(out.logits)
        log_probs = log_prob(dists, minibatch.actions)  # (B, C)
        advantages = minibatch.advantages
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        log_ratio = log_probs - minibatch.log_probs
        ratio = log_ratio.exp()
        surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip_range, 1 + clip_range) * advantages)
        policy_loss = -surrogate.mean()
        clipped_value = minibatch.values + (out.value - minibatch.values).clamp(-clip_range, clip_range)
        value_loss = torch.max((out.value - minibatch.returns) ** 2, (clipped_value - minibatch.returns) ** 2).mean()
        entropy_bonus = entropy(dists).mean()
        loss = policy_loss + self.config.value_loss_coefficient * value_loss - beta * entropy_bonus

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norms = self._grad_norms()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            stats = {
                "policy_loss": policy_loss.item(),
                "value_loss": value_loss.item(),
                "entropy": entropy_bonus.item(),
                "total_loss": loss.item(),
                "approx_kl": ((ratio - 1) - log_ratio).mean().item(),
                "clip_fraction": ((ratio - 1).abs() > clip_range).float().mean().item(),
            }
        stats.update(grad_norms)
        return stats

    def _grad_norms(self) -> dict[str, float]:
        """Gradient norm of each top-level module (before clipping)."""
        norms = {}
        for name, module in self.model.named_children():
            grads = [p.grad.norm() for p in module.parameters() if p.grad is not None]
            if grads:
                norms[f"grad_norm/{name}"] = torch.stack(grads).norm().item()
        return norms

    def log(self, rollout: RolloutStats, stats: dict[str, float], seconds: float) -> str:
        """Write TensorBoard summaries of one update and return its console line."""
        step = self.env_steps
        episode_means = {key: float(np.mean(values)) for key, values in rollout.episodes.items()}
        for key, value in episode_means.items():
            self.writer.add_scalar(f"episode/{key}_mean", value, step)
        losses = {"policy": "policy_loss", "value": "value_loss", "entropy": "entropy", "total": "total_loss"}
        for tag, key in losses.items():
            self.writer.add_scalar(f"losses/{tag}", stats[key], step)
        sps = self.config.n_workers * self.config.worker_steps / seconds
        for key in ("approx_kl", "clip_fraction", "explained_variance", "learning_rate", "entropy_coefficient", "clip_range"):
            self.writer.add_scalar(f"training/{key}", stats[key], step)
        self.writer.add_scalar("training/sps", sps, step)
        for key, value in stats.items():
            if key.startswith("grad_norm/"):
                self.writer.add_scalar(key, value, step)
        line = f"update {self.update + 1:4d}/{self.config.updates}  steps {step:9d}  sps {sps:6.0f}"
        if episode_means:
            line += f"  reward {episode_means['reward']:7.3f}  length {episode_means['length']:6.1f}"
            if "success" in episode_means:
                line += f"  success {episode_means['success']:.2f}"
        else:
            line += "  (no episode ended)"
        line += (
            f"  pi {stats['policy_loss']:7.4f}  v {stats['value_loss']:7.4f}  entropy {stats['entropy']:.3f}"
            f"  kl {stats['approx_kl']:.4f}"
        )
        return line

    def run(self, log_every: int = 1) -> dict[str, float]:
        """Train for the configured number of updates; returns the episode means of the last update with episodes."""
        last_means: dict[str, float] = {}
        start = time.time()
        try:
            while self.update < self.config.updates:
                tick = time.time()
                rollout = self.rollout()
                stats = self.optimize()
                line = self.log(rollout, stats, time.time() - tick)
                self.update += 1
                if rollout.episodes:
                    last_means = {key: float(np.mean(values)) for key, values in rollout.episodes.items()}
                if self.update % log_every == 0 or self.update == self.config.updates:
                    elapsed = time.time() - start
                    left = elapsed / self.update * (self.config.updates - self.update)
                    print(f"{line}  [{elapsed:5.0f}s, ~{left:.0f}s left]", flush=True)
        finally:
            self.close()
        save_model(self.model, self.config, os.path.join(self.models_dir, f"{self.run_id}.nn"))
        return last_means

    def close(self) -> None:
        """Stop the workers and flush the summaries."""
        self.workers.close()
        self.writer.close()
