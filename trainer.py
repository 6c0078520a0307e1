"""PPOTrainer: rollouts with the episodic memory, GAE, and clipped PPO updates on sequence chunks.

Shapes follow the legend in buffer.py.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections import defaultdict
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from buffer import Buffer, Minibatch
from checkpoint import atomic_save, save_model
from config import Config
from evaluation import evaluate
from memory import MEMORY_DTYPES, RolloutMemory
from model import ActorCriticModel, ModelOutput, distributions, entropy, log_prob, sample_actions
from worker import StepResult, WorkerError, Workers

MEMORY_PATHS = ("fast", "plain")


def check_memory_path(memory_path: str, config: Config, flag: str = "--memory-path") -> None:
    """Raise ValueError, naming the fix, for an unknown memory path or a config option the path does not implement.

    ``flag`` is the command-line option that chose the path, for the message.
    """
    if memory_path not in MEMORY_PATHS:
        raise ValueError(f"{flag} '{memory_path}' is unknown: use one of {', '.join(MEMORY_PATHS)}")
    if config.transformer.memory_gradients and memory_path != "fast":
        raise ValueError(
            "'transformer.memory_gradients' is true, which only the fast memory path implements: "
            f"use {flag} fast or set it to false"
        )


def forward_minibatch(
    model: ActorCriticModel, minibatch: Minibatch, memory_length: int, path: str, memory_gradients: bool = False
) -> ModelOutput:
    """Logits, values and tokens of a minibatch's B x C steps, each attending to its own memory window.

    ``fast`` projects each of a chunk's S memory slots once and lets the C queries attend to their bands of it in one
    attention call. ``plain`` (the executable specification) cuts out every step's window and projects it on its own.
    Both give the same numbers; tests/test_equivalence.py holds them to it.

    With ``memory_gradients`` (fast path only) the slots of the chunk's own steps hold this pass's block inputs, with
    gradient, instead of the rollout's tokens (see ActorCriticModel.forward_chunk).
    """
    if memory_gradients:
        if path != "fast":
            raise ValueError("memory_gradients needs the fast memory path")
        return model.forward_chunk(minibatch.obs, minibatch.memory, minibatch.memory_steps, minibatch.mask)
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


class TrainingStopped(RuntimeError):
    """Training stopped early (signal, failing worker, non-finite loss); a checkpoint of the last good update exists."""


class NonFiniteError(RuntimeError):
    """A loss or gradient became NaN or infinite."""


class PPOTrainer:
    """Runs the whole training loop for one config.

    Checkpoints. After every update (and before the first) the trainer takes a snapshot of everything a resumed run
    needs: model, optimizer, counters, random number generator states, each worker's memory ring and the carried
    trace, and the environments' state (their episode counters and the actions of the running episodes, which
    ``Workers.restore`` replays). The snapshot is written to ``models/<run-id>/checkpoint.pt`` every
    ``checkpoint_interval`` updates, at the end, and whenever training stops early, so a stop never loses more than
    the update in progress.
    """

    def __init__(
        self,
        config: Config,
        run_id: str,
        device: torch.device,
        seed: int = 0,
        memory_path: str = "fast",
        models_dir: str = "models",
        summaries_dir: str = "summaries",
        checkpoint: dict | None = None,
    ) -> None:
        """Build workers, model, optimizer, buffer and memory; with ``checkpoint``, continue that run exactly."""
        check_memory_path(memory_path, config)
        self.config = config
        self.run_id = run_id
        self.device = device
        self.seed = seed
        self.memory_path = memory_path
        self.model_path = os.path.join(models_dir, f"{run_id}.nn")
        self.checkpoint_path = os.path.join(models_dir, run_id, "checkpoint.pt")
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)

        self.workers = Workers(config.environment, config.n_workers, config.n_processes, seed)
        obs_shape = self.workers.observation_space.shape
        action_dims = self.workers.action_dims
        tf = config.transformer
        self.model = ActorCriticModel(config, obs_shape, action_dims).to(device)
        # The fused implementation is several times faster than the per-tensor loop, on the CPU too.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate_schedule.initial, fused=True)
        memory_dtype = MEMORY_DTYPES[config.memory_dtype]
        self.buffer = Buffer(
            config.n_workers, config.worker_steps, tf.memory_length, tf.num_blocks, tf.embed_dim, obs_shape,
            len(action_dims), memory_dtype, device,
        )  # fmt: skip
        self.memory = RolloutMemory(
            config.n_workers, tf.memory_length, tf.num_blocks, tf.embed_dim, memory_dtype, device, memory_path == "fast"
        )
        self.update = 0
        self.env_steps = 0
        if checkpoint is None:
            self.obs = self.model.prepare(self.workers.reset())
            self.summary_dir = os.path.join(summaries_dir, run_id, time.strftime("%Y%m%d-%H%M%S"))
        else:
            self._restore(checkpoint)
        self.writer = SummaryWriter(self.summary_dir)
        self.snapshot: dict | None = None

    def snapshot_state(self) -> dict:
        """Everything a resumed run needs, copied (the model keeps training after this)."""
        length = self.config.transformer.memory_length
        return {
            "kind": "checkpoint",
            "model": {key: value.detach().cpu().clone() for key, value in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "config": self.config.to_dict(),
            "observation_shape": list(self.model.observation_shape),
            "action_dims": list(self.model.action_dims),
            "run_id": self.run_id,
            "seed": self.seed,
            "memory_path": self.memory_path,
            "summary_dir": self.summary_dir,
            "update": self.update,
            "env_steps": self.env_steps,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else [],
                "minibatch": self.generator.get_state(),
            },
            "workers": self.workers.state(),
            "memory": {
                "tokens": self.memory.tokens.cpu().clone(),
                "token_steps": self.memory.token_steps.cpu().clone(),
                "episode_steps": self.memory.episode_steps.cpu().clone(),
                "episode_ids": self.memory.episode_ids.cpu().clone(),
            },
            "trace": {
                "tokens": self.buffer.trace[:, -length:].cpu().clone(),
                "steps": self.buffer.trace_steps[:, -length:].cpu().clone(),
                "episodes": self.buffer.trace_episodes[:, -length:].cpu().clone(),
            },
        }

    def _restore(self, checkpoint: dict) -> None:
        """Load a ``snapshot_state`` payload into this freshly built trainer."""
        length = self.config.transformer.memory_length
        found = (tuple(checkpoint["observation_shape"]), list(checkpoint["action_dims"]))
        expected = (tuple(self.model.observation_shape), list(self.model.action_dims))
        if found != expected:
            raise ValueError(
                f"the checkpoint's model takes observations {found[0]} and actions {found[1]}, but the environment "
                f"gives observations {expected[0]} and actions {expected[1]}: resume with the config it was trained with"
            )
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.update, self.env_steps = checkpoint["update"], checkpoint["env_steps"]
        self.summary_dir = checkpoint["summary_dir"]
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if self.device.type == "cuda" and checkpoint["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
        self.generator.set_state(checkpoint["rng"]["minibatch"])
        for key, value in checkpoint["memory"].items():
            getattr(self.memory, key).copy_(value)
        self.buffer.trace[:, -length:] = checkpoint["trace"]["tokens"].to(self.device)
        self.buffer.trace_steps[:, -length:] = checkpoint["trace"]["steps"].to(self.device)
        self.buffer.trace_episodes[:, -length:] = checkpoint["trace"]["episodes"].to(self.device)
        self.obs = self.model.prepare(self.workers.restore(checkpoint["workers"]))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, dtype=torch.float32, device=self.device)

    @torch.no_grad()
    def rollout(self) -> RolloutStats:
        """Collect T steps from every worker into the buffer, then compute advantages."""
        self.model.eval()
        self.buffer.start_rollout()
        self.memory.refresh(self.model)
        episodes: dict[str, list[float]] = defaultdict(list)
        for t in range(self.config.worker_steps):
            actions = self._policy_step(t)
            result = self.workers.step(actions.cpu().numpy())
            self._record_outcome(t, result)
            for episode in result.episodes:
                for key, value in episode.items():
                    episodes[key].append(float(value))
        # The bootstrap value uses exactly the window the next rollout step will use.
        self.buffer.compute_advantages(self._values(self.obs), self.config.gamma, self.config.lamda)
        self.env_steps += self.config.n_workers * self.config.worker_steps
        return RolloutStats(dict(episodes))

    def _policy_step(self, t: int) -> torch.Tensor:
        """Act on the current observations with the memory; store step t and its memory tokens. Returns (N, A)."""
        memory = self.memory
        keys_values, mask = memory.inputs(self.model)
        out = self.model(self.obs.unsqueeze(1), keys_values, mask)
        actions, log_probs = sample_actions([logits[:, 0] for logits in out.logits])
        tokens = out.tokens[:, 0]  # (N, K, D)
        self.buffer.record_step(
            t, self.obs, actions, log_probs, out.value[:, 0], tokens, memory.episode_steps, memory.episode_ids
        )
        memory.append(self.model, tokens)
        return actions

    def _record_outcome(self, t: int, result: StepResult) -> None:
        """Store the environments' answer to step t and start new episodes in the memory where episodes ended."""
        terminated = torch.as_tensor(result.terminated, device=self.device)
        truncated = torch.as_tensor(result.truncated, device=self.device)
        final_values = torch.zeros(self.config.n_workers, device=self.device)
        if truncated.any():
            # A time limit is no terminal state: bootstrap from the final observation with its own episode's memory.
            index = truncated.nonzero().squeeze(1)
            final_obs = self.model.prepare(np.stack([result.final_obs[i] for i in index.tolist()]))
            final_values[index] = self._values(final_obs, index)
        self.buffer.record_outcome(t, self._tensor(result.rewards), terminated, truncated, final_values)
        self.memory.end_episodes(terminated | truncated)
        self.obs = self.model.prepare(result.obs)

    def _values(self, obs: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Values (n,) of observations (n, *obs_shape) at the current step of workers ``index`` (all), with their memory."""
        keys_values, mask = self.memory.inputs(self.model, index)
        return self.model(obs.unsqueeze(1), keys_values, mask).value[:, 0]

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
        tf = self.config.transformer
        out = forward_minibatch(self.model, minibatch, tf.memory_length, self.memory_path, tf.memory_gradients)
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

        if not torch.isfinite(loss):
            raise NonFiniteError(f"the loss became {loss.item()} in update {self.update + 1}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norms, total_norm = self._clip_gradients()
        if not torch.isfinite(total_norm):
            raise NonFiniteError(f"the gradient norm became {total_norm.item()} in update {self.update + 1}")
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

    def _clip_gradients(self) -> tuple[dict[str, float], torch.Tensor]:
        """Clip the gradients to a total norm of ``max_grad_norm``, as torch.nn.utils.clip_grad_norm_ does.

        Returns each top-level module's gradient norm before clipping (for the summaries) and the total norm; every
        tensor's norm is computed once for both.
        """
        module_norms = {}
        grads = []
        groups = [(name, module.parameters()) for name, module in self.model.named_children()]
        groups.append(("model", self.model.parameters(recurse=False)))  # parameters outside the modules, if any
        for name, parameters in groups:
            module_grads = [p.grad for p in parameters if p.grad is not None]
            if module_grads:
                module_norms[name] = torch.stack([grad.norm() for grad in module_grads]).norm()
                grads += module_grads
        total_norm = torch.stack(list(module_norms.values())).norm()
        scale = (self.config.max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, scale)
        return {f"grad_norm/{name}": norm.item() for name, norm in module_norms.items()}, total_norm

    def log(self, episode_means: dict[str, float], stats: dict[str, float], seconds: float) -> str:
        """Write TensorBoard summaries of one update (``episode_means``: metric -> mean over the episodes that ended)
        and return its console line."""
        step = self.env_steps
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

    def evaluate(self) -> dict[str, float]:
        """Evaluate on unseen seeds, log under ``evaluation/``, and return the metric means."""
        results = evaluate(self.model, self.config, self.device, self.config.eval_episodes, seed=self.update)
        means = {key: float(np.mean([r[key] for r in results if key in r])) for key in results[0]}
        for key, value in means.items():
            self.writer.add_scalar(f"evaluation/{key}_mean", value, self.env_steps)
        return means

    def save_checkpoint(self, snapshot: dict) -> None:
        """Write a ``snapshot_state`` payload to the checkpoint file, atomically."""
        atomic_save(snapshot, self.checkpoint_path)

    def run(self, log_every: int = 1) -> dict[str, float]:
        """Train until ``updates``; returns the episode means of the last update in which episodes ended.

        Stops early with ``TrainingStopped`` on SIGINT/SIGTERM, a failing worker or a non-finite loss, after writing
        the snapshot of the last completed update as checkpoint and the model file.
        """
        config = self.config
        last_means: dict[str, float] = {}
        start, start_update = time.time(), self.update
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, _raise_interrupt)
        try:
            self.snapshot = self.snapshot_state()
            while self.update < config.updates:
                tick = time.time()
                rollout = self.rollout()
                stats = self.optimize()
                episode_means = {key: float(np.mean(values)) for key, values in rollout.episodes.items()}
                line = self.log(episode_means, stats, time.time() - tick)
                self.update += 1
                self.snapshot = self.snapshot_state()
                if config.checkpoint_interval and self.update % config.checkpoint_interval == 0:
                    self.save_checkpoint(self.snapshot)
                if episode_means:
                    last_means = episode_means
                if config.eval_interval and (self.update % config.eval_interval == 0 or self.update == config.updates):
                    evaluation = self.evaluate()
                    line += "  eval " + " ".join(f"{k} {v:.3f}" for k, v in evaluation.items() if k in ("reward", "success"))
                if self.update % log_every == 0 or self.update == config.updates:
                    done = self.update - start_update
                    elapsed = time.time() - start
                    left = elapsed / done * (config.updates - self.update)
                    print(f"{line}  [{elapsed:5.0f}s, ~{left:.0f}s left]", flush=True)
            self.save_checkpoint(self.snapshot)
            save_model(self.model, config, self.model_path)
        except (KeyboardInterrupt, WorkerError, NonFiniteError) as error:
            self._stop(error)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()
        return last_means

    def _stop(self, error: BaseException) -> None:
        """Keep the last good update on disk, then raise TrainingStopped explaining why and how to resume."""
        reason = {
            KeyboardInterrupt: "interrupted",
            WorkerError: "an environment worker failed",
            NonFiniteError: "a non-finite loss or gradient",
        }[type(error)]
        kept = "nothing (it stopped before the first update)"
        if self.snapshot is not None:
            self.save_checkpoint(self.snapshot)
            model = ActorCriticModel(self.config, self.model.observation_shape, self.model.action_dims)
            model.load_state_dict(self.snapshot["model"])
            save_model(model, self.config, self.model_path)
            kept = f"{self.checkpoint_path} (after update {self.snapshot['update']})"
        message = f"training stopped: {reason} during update {self.update + 1}"
        if not isinstance(error, KeyboardInterrupt):
            message += f": {error}"
        message += f"\nkept {kept}; continue with: python train.py --resume={self.checkpoint_path}"
        raise TrainingStopped(message) from error

    def close(self) -> None:
        """Stop the workers and flush the summaries."""
        self.workers.close()
        self.writer.close()


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM both stop training through the same path as Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")
