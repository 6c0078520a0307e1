"""Evaluation on unseen seeds, shared by the trainer and enjoy.py; summaries with IQM and bootstrap intervals.

An episode steps through the model's memory exactly as a training rollout does (``ActorCriticModel.act``), so
evaluation sees exactly the memory the agent was trained with. Seeds: episode k of an evaluation is reset with
``episode_seed(seed, 0, k, evaluation=True)``, which is odd, while training episodes get even seeds (worker.py); Memory
Gym in addition draws evaluation episodes from task seeds outside its training range (start-seed .. start-seed +
num-seeds).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import observations
from action_spec import ActionSpec
from aggregation import bootstrap_ci, interquartile_mean, mean
from config import Config
from env_group import lanes_of, reset_lanes, step_lanes
from environments import create_env
from figures import attention_frame
from model import ActorCriticModel
from worker import episode_seed

# Steps after which an evaluation episode ends, whatever the task: Atari's usual cap (108,000 frames at frame skip 4).
MAX_EPISODE_STEPS = 27_000

# on_step(env, step, attention): called after every agent step; attention is per block (H, L) over the ring slots
# ordered from oldest to newest visible step, or None when not asked for.
StepCallback = Callable[[object, int, list[np.ndarray] | None], None]


@torch.no_grad()
def evaluate(
    model: ActorCriticModel,
    config: Config,
    device: torch.device,
    episodes: int,
    seed: int = 0,
    deterministic: bool = False,
    render_mode: str | None = None,
    on_step: StepCallback | None = None,
    attention: bool = False,
    max_steps: int = MAX_EPISODE_STEPS,
) -> list[dict[str, float]]:
    """Run ``episodes`` episodes on evaluation seeds and return each one's ``info["episode"]`` metrics.

    In a multi-agent environment with K agents (any K: each agent is a lane with its own memory of the one policy) an
    episode gives K results, one per agent, in agent order.

    Args:
        model: the agent (put in eval mode here).
        config: its config (environment and memory settings).
        device: where the model lives.
        episodes: number of episodes.
        seed: offset of the evaluation seed stream.
        deterministic: take the most likely action instead of sampling.
        render_mode: passed to the environment (None, "rgb_array", "human").
        on_step: called after every step, e.g. to record frames.
        attention: compute attention weights for ``on_step``.
        max_steps: an episode still running after this many steps ends there (a good agent on an Endless task, or a
            task without a step limit, would otherwise play on): its result holds the sum of the steps' rewards so far
            (as the environment's steps give them, which may be scaled), the length and ``"evaluation_cut": 1``.
    """
    model.eval()
    env = create_env(config.environment, render_mode=render_mode, evaluation=True)
    lanes = lanes_of(env)  # agents of a multi-agent environment, each with its own memory; 1 otherwise
    memory = model.memory
    state = memory.start(lanes, device)
    generator = torch.Generator(device=device).manual_seed(episode_seed(seed, 0, 0, evaluation=True))
    results = []
    try:
        memory.sync(state)
        for episode in range(episodes):
            obs = reset_lanes(env, episode_seed(seed, 0, episode, evaluation=True))
            state.end_episodes(torch.ones(lanes, dtype=torch.bool, device=device))
            step, ended, returns = 0, [], np.zeros(lanes)
            while not ended:
                prepared = model.prepare(observations.stack(obs))
                actions, _, weights = model.act(
                    prepared, state, lambda policy: policy.sample(deterministic, generator), attention
                )
                obs, rewards, _, _, ended = step_lanes(env, list(actions.cpu().numpy()))
                returns += rewards
                step += 1
                if on_step is not None:
                    on_step(env, step, weights)
                if not ended and step >= max_steps:
                    ended = [{"reward": float(total), "length": float(step), "evaluation_cut": 1.0} for total in returns]
            results.extend({key: float(value) for key, value in lane.items()} for lane in ended)
    finally:
        env.close()
    return count_cut_episodes_as_failures(results)


def count_cut_episodes_as_failures(results: list[dict[str, float]]) -> list[dict[str, float]]:
    """Give every episode cut at ``max_steps`` ``success`` 0 where the task reports success: the agent did not
    succeed in it, and without the key the success rate would leave it out. (Where every episode was cut, no
    episode tells that the task has a success, and the results have none.)"""
    if any("success" in result for result in results):
        for result in results:
            if "evaluation_cut" in result:
                result.setdefault("success", 0.0)
    return results


def metric_means(results: list[dict[str, float]]) -> dict[str, float]:
    """Per metric any episode reports: the mean over the episodes that report it (``reward`` and ``length``: all)."""
    keys = dict.fromkeys(key for result in results for key in result)  # in order of first appearance
    return {key: float(np.mean([result[key] for result in results if key in result])) for key in keys}


def record_episode(model: ActorCriticModel, config: Config, device: torch.device, seed: int = 0) -> list[np.ndarray]:
    """Frames of the first evaluation episode of ``seed``, with the attention strips (figures.py) for the transformer
    memory."""
    frames = []
    length = config.transformer.memory_length
    attention = config.memory == "trxl"

    def on_step(env: object, step: int, weights: list[np.ndarray] | None) -> None:
        frame = env.render()
        frames.append(frame if weights is None else attention_frame(frame, weights, length, 1, step))

    evaluate(model, config, device, 1, seed, render_mode="rgb_array", on_step=on_step, attention=attention)
    return frames


def random_play(env_config: dict, episodes: int, seed: int = 0) -> list[dict[str, float]]:
    """The chance level of a task: ``episodes`` episodes on the evaluation seeds ``evaluate`` uses, played with
    uniformly random actions (each entry of a Discrete or MultiDiscrete action uniform over its values, each entry of
    a continuous one uniform within its bounds; every agent of a multi-agent environment alike). Returns each
    episode's ``info["episode"]`` metrics (one per agent), as ``evaluate``."""
    env = create_env(env_config, evaluation=True)
    lanes = lanes_of(env)
    spec = ActionSpec.of(env.action_space)
    rng = np.random.default_rng(episode_seed(seed, 0, 0, evaluation=True))
    results = []
    try:
        for episode in range(episodes):
            reset_lanes(env, episode_seed(seed, 0, episode, evaluation=True))
            ended = []
            while not ended:
                if spec.continuous:
                    actions = rng.uniform(spec.low, spec.high, size=(lanes, spec.width))
                else:
                    actions = rng.integers(0, spec.counts, size=(lanes, spec.width))
                _, _, _, _, ended = step_lanes(env, list(actions))
            results.extend({key: float(value) for key, value in lane.items()} for lane in ended)
    finally:
        env.close()
    return results


def summarize(results: list[dict[str, float]], resamples: int = 2000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per metric: mean, IQM and a 95% percentile-bootstrap confidence interval of the mean."""
    summary = {}
    for key in sorted({key for result in results for key in result}):
        values = np.array([result[key] for result in results if key in result], dtype=np.float64)
        ci_low, ci_high = bootstrap_ci(values, mean, resamples, seed=seed)
        summary[key] = {
            "mean": float(values.mean()),
            "iqm": interquartile_mean(values),
            "ci_low": ci_low,
            "ci_high": ci_high,
            "episodes": len(values),
        }
    return summary


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    """One line per metric."""
    lines = [f"{'metric':<22}{'mean':>10}{'IQM':>10}   95% CI of the mean"]
    for key, s in summary.items():
        lines.append(f"{key:<22}{s['mean']:10.3f}{s['iqm']:10.3f}   [{s['ci_low']:.3f}, {s['ci_high']:.3f}]")
    return "\n".join(lines)
