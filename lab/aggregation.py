"""Statistics over runs for the lab's experiments: the final values of runs, IQM curves with a stratified-bootstrap
band, the environment steps each run needs to reach a threshold, and falls after reaching it.

They are built on the interquartile mean (IQM) and the percentile bootstrap of evaluation.py (which the evaluation
summaries of the trainer and enjoy.py use too), following rliable (Agarwal et al., 2021, "Deep Reinforcement Learning
at the Edge of the Statistical Precipice"): the IQM is the mean of the middle 50% of the values, and its uncertainty
comes from resampling whole runs with replacement, separately within each task (stratum). With one task, that is
resampling the runs.

Every resampling is seeded, so the same values give the same interval. A NaN stands for "no value" (e.g. a run that
logged nothing at that point of a curve) and is left out, not counted as a number.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evaluation import (
    CONFIDENCE,
    RESAMPLES,
    bootstrap_ci,
    bootstrap_distribution,
    interquartile_mean,
    iqm,
    mean,
    percentile_interval,
)


def summarize_runs(values: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> dict[str, float]:
    """Final values of runs: IQM, mean, and the 95% stratified-bootstrap interval of the IQM (rliable's estimate)."""
    values = np.asarray(values, dtype=np.float64)
    low, high = bootstrap_ci(values, iqm, resamples, CONFIDENCE, seed=seed)
    return {"iqm": interquartile_mean(values), "mean": float(mean(values)), "ci_low": low, "ci_high": high}


def iqm_curve(
    values: np.ndarray,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    strata: Sequence[object] | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM across runs at each point of a curve, with its stratified-bootstrap confidence band.

    The same resample of the runs serves every point (as in rliable), so the band is that of whole runs, not of
    points drawn independently.

    Args:
        values: (M runs, U points), NaN where a run has no value at a point.
        resamples: number of bootstrap resamples.
        confidence: coverage of the band.
        strata: a task label per run (None: one task).
        seed: seed of the resampling.

    Returns:
        (iqm, low, high), each of shape (U,); NaN at points where no run has a value.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"curves must have shape (runs, points), got {values.shape}")
    distribution = bootstrap_distribution(values, iqm, resamples, strata, seed)
    low, high = percentile_interval(distribution, confidence)
    return iqm(values, axis=0), low, high


def steps_to_threshold(steps: Sequence[int] | np.ndarray, values: np.ndarray, threshold: float) -> list[int | None]:
    """Per run (a row of ``values``, shape (M, U) against ``steps`` (U,)): the first step at which the metric is at
    least ``threshold``, or None where it never is."""
    steps = np.asarray(steps)
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if values.shape[1] != len(steps):
        raise ValueError(f"{values.shape[1]} values per run for {len(steps)} steps")
    reached = np.nan_to_num(values, nan=-np.inf) >= threshold  # a missing value never reaches it
    return [int(steps[np.argmax(row)]) if row.any() else None for row in reached]


def summarize_steps(per_run: Sequence[int | None]) -> dict[str, float | int | None]:
    """Aggregate of ``steps_to_threshold``: how many runs reached it, of how many, and the median and IQM of the steps
    of those that did (None where none did)."""
    reached = np.array([step for step in per_run if step is not None], dtype=np.float64)
    return {
        "reached": len(reached),
        "runs": len(per_run),
        "median": float(np.median(reached)) if len(reached) else None,
        "iqm": interquartile_mean(reached) if len(reached) else None,
    }


def falls_after_reaching(values: np.ndarray, reach: float, floor: float) -> dict:
    """Stability of runs that solved a task: per run (a row of ``values`` (M, U), one value per update), how many
    updates after the first one at or above ``reach`` were below ``floor``, and the lowest value from that update on
    (None for runs that never reached it); over the runs, how many fell below ``floor`` and for how many updates in
    all. Missing values (NaN) neither reach nor fall."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    per_run = []
    for row in values:
        reached = np.nan_to_num(row, nan=-np.inf) >= reach
        if not reached.any():
            per_run.append({"updates_below": None, "lowest": None})
            continue
        after = row[np.argmax(reached) :]
        after = after[~np.isnan(after)]
        per_run.append({"updates_below": int((after < floor).sum()), "lowest": float(after.min())})
    below = [run["updates_below"] for run in per_run if run["updates_below"]]
    return {
        "reach": reach,
        "floor": floor,
        "runs_reached": sum(run["updates_below"] is not None for run in per_run),
        "runs_below": len(below),
        "updates_below": sum(below),
        "per_run": per_run,
    }
