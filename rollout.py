"""Collecting a rollout: policy step, environment step, outcome recording, bootstrap values, then GAE.

Shapes follow the legend in buffer.py. Each step of the rollout is

    policy step      the model acts on the current observations with each worker's memory; the step is stored
    environment      every worker steps its environment (same-step autoreset, worker.py)
    outcome          rewards and episode ends are stored; truncated episodes get the value of their final observation;
                     the memory starts new episodes where episodes ended

and after T steps the value of the next observation closes the advantage recursion.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import NamedTuple

import numpy as np
import torch

import observations
from buffer import Buffer
from distributed import SINGLE, Ranks, Rows
from memories.base import MemoryState
from model import ActorCriticModel
from normalization import RewardScaler
from worker import StepResult, Workers


class RolloutStats(NamedTuple):
    """Finished episodes of one rollout: metric name -> values."""

    episodes: dict[str, list[float]]


class RolloutCollector:
    """Steps N workers for T steps with the model and their memory, into the buffer.

    Attributes:
        obs: (N, *obs_shape) current observations, as ``model.prepare`` makes them.
        state: each worker's memory (``Memory.start``), carried from rollout to rollout.
    """

    def __init__(
        self,
        model: ActorCriticModel,
        workers: Workers,
        buffer: Buffer,
        gamma: float,
        lamda: float,
        device: torch.device,
        rows: Rows | None = None,
        reward_scaler: RewardScaler | None = None,
        ranks: Ranks = SINGLE,
    ) -> None:
        """``rows``: where these N workers sit among all processes' workers (distributed.py), None for one process;
        ``reward_scaler``: scales each rollout's rewards before the advantages (``normalize_rewards``), with the
        statistics of all ``ranks``."""
        self.model = model
        self.rows = rows
        self.workers = workers
        self.buffer = buffer
        self.gamma, self.lamda = gamma, lamda
        self.device = device
        self.n_workers, self.worker_steps = buffer.n_workers, buffer.worker_steps
        self.reward_scaler = reward_scaler
        self.ranks = ranks
        self.state: MemoryState = model.memory.start(self.n_workers, device)
        self.obs: torch.Tensor | None = None

    def start(self, obs: np.ndarray) -> None:
        """Take the workers' current observations (N, *obs_shape), after their reset or restore."""
        self.obs = self.model.prepare(obs)

    def resume(self, workers_state: list[dict]) -> None:
        """Restore the workers from a checkpoint's state and take their observations. An environment whose episode was
        too long to replay (``replay.MAX_REPLAY_ACTIONS``) starts its next episode instead, and so does the memory of
        its lanes, and so does the running return of ``normalize_rewards``."""
        self.start(self.workers.restore(workers_state))
        restarted = np.repeat([state["actions"] is None for state in workers_state], self.workers.agents)
        if restarted.any():
            lanes = torch.as_tensor(restarted, device=self.device)
            self.state.end_episodes(lanes)
            if self.reward_scaler is not None:  # the checkpoint's running return belongs to the episode left behind
                self.reward_scaler.end_episodes(lanes)

    @torch.no_grad()
    def collect(self) -> RolloutStats:
        """Collect T steps from every worker into the buffer, then compute advantages."""
        self.model.eval()
        self.buffer.start_rollout()
        episodes: dict[str, list[float]] = defaultdict(list)
        with self.model.fixed_weights():  # bfloat16 compute: the weights cast once per rollout, not at every step
            self.model.memory.sync(self.state)
            for t in range(self.worker_steps):
                actions = self.policy_step(t)
                result = self.workers.step(actions.cpu().numpy())
                self.record_outcome(t, result)
                for episode in result.episodes:
                    for key, value in episode.items():
                        episodes[key].append(float(value))
            # The bootstrap value uses exactly the memory the next rollout step will use.
            bootstrap = self.values(self.obs)
        if self.reward_scaler is not None:
            ended = self.buffer.terminated | self.buffer.truncated
            self.buffer.rewards = self.reward_scaler.scale(self.buffer.rewards, ended, self.ranks)
        self.buffer.compute_advantages(bootstrap, self.gamma, self.lamda)
        return RolloutStats(dict(episodes))

    def policy_step(self, t: int) -> torch.Tensor:
        """Act on the current observations with the memory; store step t and remember it. Returns actions (N, A)."""
        actions, out, _ = self.model.act(self.obs, self.state, lambda policy: policy.sample(rows=self.rows))
        self.buffer.record_step(t, self.obs, actions, out.policy.log_prob(actions), out.value, out.record)
        return actions

    def record_outcome(self, t: int, result: StepResult) -> None:
        """Store the environments' answer to step t and start new episodes in the memory where episodes ended."""
        terminated = torch.as_tensor(result.terminated, device=self.device)
        truncated = torch.as_tensor(result.truncated, device=self.device)
        final_values = torch.zeros(self.n_workers, device=self.device)
        if result.truncated.any():  # asked of the host's array: no device synchronisation
            # A time limit is no terminal state: bootstrap from the final observation with its own episode's memory.
            rows = np.flatnonzero(result.truncated)
            final_obs = self.model.prepare(observations.stack([result.final_obs[i] for i in rows]))
            index = torch.as_tensor(rows, device=self.device)
            final_values[index] = self.values(final_obs, index)
        rewards = torch.as_tensor(result.rewards, dtype=torch.float32, device=self.device)
        self.buffer.record_outcome(t, rewards, terminated, truncated, final_values)
        self.state.end_episodes(result.terminated | result.truncated)  # the host's arrays: the memory need not ask the device
        self.obs = self.model.prepare(result.obs)

    @torch.no_grad()
    def start_observation_statistics(self, seed: int, one_hot: bool = False) -> None:
        """Before the first rollout of a new run (``normalize_observations``; a resumed run has its checkpoint's): leave
        the parts that the environments declare one-hot codes as they are (unless ``one_hot``: ``normalize_one_hot``),
        then take the observations of ``worker_steps`` steps of uniformly random actions in every worker into the
        model's statistics (N x T of them, as many as a rollout holds), and start every environment's next episode.

        So the first rollout and the first update already see normalised inputs, with the statistics they keep until
        the update is done; starting at mean 0 and standard deviation 1 instead, the network would train on raw inputs
        and then see them rescaled. Random steps rather than the reset observations alone: N resets are few, and
        their spread can be far below an episode's (CartPole draws every state variable uniformly from [-0.05, 0.05]
        at reset), which would scale the inputs that follow into the clip. The actions come from ``seed`` alone, drawn
        for all ``rows.total`` lanes of all processes, so one process or several play the same steps; the memory and
        the torch generators are not touched. Nothing happens where nothing is normalised."""
        normalizer = self.model.normalizer
        if normalizer is None:
            return
        if not one_hot:  # normalize_one_hot false: one-hot codes pass as they are
            normalizer.leave_one_hot_codes(self.workers.observation_space)
        if not normalizer.normalises_anything():
            if self.ranks.main:
                print(
                    "note: normalize_observations is on, but every part of these observations is one-hot codes or a "
                    "skipped key, which are left as they are: nothing is normalised (normalize_one_hot: true "
                    "normalises one-hot codes too)",
                    file=sys.stderr,
                )
            return
        rows = self.rows or Rows(0, self.n_workers)
        rng = np.random.default_rng(seed)
        obs = self.obs
        for _ in range(self.worker_steps):
            normalizer.update(obs, self.ranks)
            actions = self.workers.action_spec.sample(rows.total, rng)[rows.first : rows.first + self.n_workers]
            if self.workers.action_spec.continuous:
                actions = actions.astype(np.float32)
            obs = self.model.prepare(self.workers.step(actions).obs)
        self.start(self.workers.reset())

    def update_observation_statistics(self) -> None:
        """Take the rollout's observations into the model's running statistics (``normalize_observations``): called
        after the update trained on them, so that the rollout and its training saw the same normalisation."""
        if self.model.normalizer is not None:
            self.model.normalizer.update(self.buffer.obs, self.ranks)

    def values(self, obs: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Values (n,) of observations (n, *obs_shape) at the current step of workers ``index`` (all), with their memory."""
        return self.model.step(obs, self.state, index).value
