"""Evaluation on unseen seeds, shared by the trainer and enjoy.py; summaries with IQM and bootstrap intervals.

An episode steps through the model's memory exactly as a training rollout does (``ActorCriticModel.act``), so
evaluation sees exactly the memory the agent was trained with. Seeds: episode k of an evaluation is reset with
``episode_seed(seed, 0, k, evaluation=True)``, which is odd, while training episodes get even seeds (worker.py); Memory
Gym in addition draws evaluation episodes from task seeds outside its training range (start-seed .. start-seed +
num-seeds).

The statistics at the end of this module follow rliable (Agarwal et al., 2021, "Deep Reinforcement Learning at the
Edge of the Statistical Precipice"): the interquartile mean (IQM) is the mean of the middle 50% of the values, and its
uncertainty comes from resampling the values (episodes here, whole runs in lab/aggregation.py) with replacement,
separately within each stratum. Every resampling is seeded, so the same values give the same interval; a NaN stands
for "no value" and is left out, not counted as a number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

import observations
from config import Config
from env_group import lanes_of, reset_lanes, step_lanes
from environments import create_env
from environments.action_spec import ActionSpec
from model import ActorCriticModel
from summaries import attention_frame
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
            (as the environment's steps give them, which may be scaled), the length and ``"evaluation_cut": 1``; an
            episode that ended by itself has ``"evaluation_cut": 0``, so that the metric's mean is the share cut.
    """
    model.eval()
    env = create_env(config.environment, render_mode=render_mode, evaluation=True)
    lanes = lanes_of(env)  # agents of a multi-agent environment, each with its own memory; 1 otherwise
    memory = model.memory
    state = memory.start(lanes, device)
    generator = torch.Generator(device=device).manual_seed(episode_seed(seed, 0, 0, evaluation=True))
    results = []
    try:
        with model.fixed_weights():  # bfloat16 compute: the weights cast once, not at every step
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


def count_cut_episodes_as_failures(results: list[dict[str, float]], success: bool = False) -> list[dict[str, float]]:
    """Give every episode cut at ``max_steps`` ``success`` 0 where the task reports success: the agent did not
    succeed in it, and without the key the success rate would leave it out. Whether the task reports success shows
    in any episode that reports it; where every episode was cut none does, and ``success`` (known from elsewhere,
    such as the run's training episodes) says so. Also gives ``evaluation_cut`` 0 to every episode without the mark
    (results of an evaluation before uncut episodes carried it), so that its mean is the share of cut episodes.
    Changes ``results`` in place and returns them."""
    success = success or any("success" in result for result in results)
    for result in results:
        cut = result.setdefault("evaluation_cut", 0.0)
        if cut and success:
            result.setdefault("success", 0.0)
    return results


def metric_means(results: list[dict[str, float]]) -> dict[str, float]:
    """Per metric any episode reports: the mean over the episodes that report it (``reward`` and ``length``: all)."""
    keys = dict.fromkeys(key for result in results for key in result)  # in order of first appearance
    return {key: float(np.mean([result[key] for result in results if key in result])) for key in keys}


def record_episode(model: ActorCriticModel, config: Config, device: torch.device, seed: int = 0) -> list[np.ndarray]:
    """Frames of the first evaluation episode of ``seed``, with the attention strips (summaries.attention_frame) for
    the transformer memory."""
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
                _, _, _, _, ended = step_lanes(env, list(spec.sample(lanes, rng)))
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


# Statistics of the evaluation summaries (and of the lab's aggregation over runs, lab/aggregation.py).

RESAMPLES = 2000  # bootstrap resamples: enough for stable 2.5% / 97.5% percentiles
CONFIDENCE = 0.95
CHUNK_ELEMENTS = 4_000_000  # resampled values held at once: bounds the memory of long curves with many resamples

# statistic(values, axis) -> values reduced along axis, like np.mean; ``iqm`` and ``mean`` below fit
Statistic = Callable[..., np.ndarray]


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean along ``axis``, NaNs left out: the mean of the values left after cutting ``n // 4`` of the n
    values from each end (scipy's ``trim_mean(values, 0.25)``, as rliable uses). Fewer than four values: their mean.
    NaN where no value is left."""
    values = np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)
    ordered = np.sort(values, axis=-1)  # NaNs sort to the end, after every number
    count = np.sum(~np.isnan(values), axis=-1)
    cut = count // 4
    position = np.arange(values.shape[-1])
    keep = (position >= cut[..., None]) & (position < (count - cut)[..., None])
    total = np.where(keep, ordered, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 is the NaN that says "no value"
        return total / keep.sum(axis=-1)


def mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean along ``axis``, NaNs left out; NaN where there is no value (np.nanmean without its warning)."""
    values = np.asarray(values, dtype=np.float64)
    present = ~np.isnan(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(present, values, 0.0).sum(axis=axis) / present.sum(axis=axis)


def interquartile_mean(values: Sequence[float] | np.ndarray) -> float:
    """Mean of the middle 50% of the values (the IQM recommended by Agarwal et al., 2021), as a float."""
    return float(iqm(np.ravel(np.asarray(values, dtype=np.float64))))


def resample_indices(
    runs: int, resamples: int, strata: Sequence[object] | None = None, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Indices of a stratified bootstrap, shape (resamples, runs): row r is the r-th resample of the runs.

    Each stratum (runs with the same label in ``strata``; None: one stratum of all runs) is resampled with replacement
    within itself, so every resample keeps as many runs of each task as the data has.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    labels = np.zeros(runs, dtype=np.int64) if strata is None else np.unique(np.asarray(strata), return_inverse=True)[1]
    if len(labels) != runs:
        raise ValueError(f"strata has {len(labels)} labels for {runs} runs")
    indices = np.empty((resamples, runs), dtype=np.int64)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        indices[:, members] = members[rng.integers(0, len(members), size=(resamples, len(members)))]
    return indices


def bootstrap_distribution(
    values: np.ndarray,
    statistic: Statistic = iqm,
    resamples: int = RESAMPLES,
    strata: Sequence[object] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """The statistic of each bootstrap resample of the runs: ``values`` has the runs along its first axis (M, ...);
    the result has shape (resamples, ...)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0 or len(values) == 0:
        raise ValueError("the bootstrap needs at least one run")
    # All indices are drawn first, so the result does not depend on the chunking below.
    indices = resample_indices(len(values), resamples, strata, np.random.default_rng(seed))
    chunk = max(1, CHUNK_ELEMENTS // values.size)
    parts = [statistic(values[indices[start : start + chunk]], axis=1) for start in range(0, resamples, chunk)]
    return np.concatenate(parts, axis=0)


def percentile_interval(distribution: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """The central ``confidence`` interval of a bootstrap distribution along its first axis (low, high); resamples
    whose statistic is NaN (they drew only runs without a value) are left out."""
    tail = 100 * (1 - confidence) / 2
    distribution = np.asarray(distribution, dtype=np.float64)
    low, high = np.full(distribution.shape[1:], np.nan), np.full(distribution.shape[1:], np.nan)
    present = ~np.all(np.isnan(distribution), axis=0)  # nanpercentile warns on all-NaN columns: leave them NaN
    if np.any(present):
        low[present], high[present] = np.nanpercentile(distribution[:, present], [tail, 100 - tail], axis=0)
    return low, high


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Statistic = iqm,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    strata: Sequence[object] | None = None,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of ``statistic`` over the runs ``values`` (one value per run).

    Args:
        values: one value per run.
        statistic: reduces an array along ``axis`` (``iqm``, ``mean``, np.median, ...).
        resamples: number of bootstrap resamples.
        confidence: coverage of the interval (0.95: from the 2.5th to the 97.5th percentile).
        strata: a task label per run: runs are resampled within their task (None: all runs are one task).
        seed: seed of the resampling.

    Returns:
        (low, high).
    """
    distribution = bootstrap_distribution(np.ravel(np.asarray(values, dtype=np.float64)), statistic, resamples, strata, seed)
    low, high = percentile_interval(distribution[:, None], confidence)
    return float(low[0]), float(high[0])
