"""Statistics over runs, in one place: the interquartile mean (IQM), percentile-bootstrap confidence intervals, IQM
curves with a stratified-bootstrap band, and the environment steps each run needs to reach a threshold.

The statistics follow rliable (Agarwal et al., 2021, "Deep Reinforcement Learning at the Edge of the Statistical
Precipice"): the IQM is the mean of the middle 50% of the values, and its uncertainty comes from resampling whole runs
with replacement, separately within each task (stratum). With one task, that is resampling the runs.

Every resampling is seeded, so the same values give the same interval. A NaN stands for "no value" (e.g. a run that
logged nothing at that point of a curve) and is left out, not counted as a number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

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
