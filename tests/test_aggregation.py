"""The statistics over runs (lab/aggregation.py, and the IQM and bootstrap of evaluation.py it builds on) against values
computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

import evaluation
from evaluation import bootstrap_ci, interquartile_mean, iqm, mean, resample_indices
from lab.aggregation import falls_after_reaching, iqm_curve, steps_to_threshold, summarize_runs, summarize_steps

NAN = float("nan")


@pytest.mark.parametrize(
    "values,expected",
    [
        (list(range(1, 9)), (3 + 4 + 5 + 6) / 4),  # 8 values: 2 cut from each end
        ([8, 1, 7, 2, 6, 3, 5, 4], (3 + 4 + 5 + 6) / 4),  # the order does not matter
        ([1, 2, 3, 4, 100], (2 + 3 + 4) / 3),  # 5 values: one cut from each end, the outlier with it
        ([0, 0, 0, 1, 1, 1, 1, 1000], (0 + 1 + 1 + 1) / 4),
        ([1, 2, 30], 11.0),  # fewer than 4: the plain mean
        ([5.0], 5.0),
    ],
)
def test_interquartile_mean_by_hand(values: list[float], expected: float) -> None:
    assert interquartile_mean(values) == pytest.approx(expected)
    assert interquartile_mean(np.array(values)) == pytest.approx(expected)  # an array as well as a list


def test_iqm_leaves_out_nans_and_works_along_an_axis() -> None:
    assert interquartile_mean([1, 2, NAN, 3, 4, 100, NAN]) == pytest.approx(3.0)  # the IQM of [1, 2, 3, 4, 100]
    table = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [NAN, NAN, NAN, NAN]])
    np.testing.assert_allclose(iqm(table, axis=1), [2.5, 25.0, NAN])
    np.testing.assert_allclose(iqm(table.T, axis=0), [2.5, 25.0, NAN])
    np.testing.assert_allclose(mean(np.array([[1.0, NAN, 3.0]]), axis=1), [2.0])


def test_bootstrap_interval_of_two_values() -> None:
    # Resamples of [0, 1] have means 0, 0.5 and 1 with probabilities 1/4, 1/2 and 1/4: more than 2.5% of the
    # resamples sit at each end, so the 95% percentile interval is [0, 1] exactly.
    assert bootstrap_ci([0.0, 1.0], mean) == (0.0, 1.0)
    # At 40% coverage the percentiles 30 and 70 fall into the block of means 0.5.
    assert bootstrap_ci([0.0, 1.0], mean, confidence=0.4) == (0.5, 0.5)


def test_bootstrap_interval_of_constant_values_has_zero_width() -> None:
    assert bootstrap_ci([0.7] * 5, iqm) == pytest.approx((0.7, 0.7))
    assert bootstrap_ci([3.0], mean) == (3.0, 3.0)


def test_bootstrap_is_seeded_and_contains_the_estimate() -> None:
    values = np.random.default_rng(1).normal(size=10)
    first = bootstrap_ci(values, iqm, seed=3)
    assert bootstrap_ci(values, iqm, seed=3) == first
    assert bootstrap_ci(values, iqm, seed=4) != first
    assert first[0] < interquartile_mean(values) < first[1]


def test_stratified_resampling_stays_within_each_task() -> None:
    strata = ["a", "a", "b", "b", "b"]
    indices = resample_indices(5, 200, strata, np.random.default_rng(0))
    assert indices.shape == (200, 5)
    assert set(indices[:, :2].ravel()) == {0, 1} and set(indices[:, 2:].ravel()) == {2, 3, 4}
    # Task a always scores 0 and task b always 1: every stratified resample keeps 2 runs of a and 3 of b, so its mean
    # is always 0.6; resampling across the tasks would not.
    values = [0.0, 0.0, 1.0, 1.0, 1.0]
    assert bootstrap_ci(values, mean, strata=strata) == pytest.approx((0.6, 0.6))
    low, high = bootstrap_ci(values, mean)
    assert low < 0.6 < high


def test_summarize_runs() -> None:
    summary = summarize_runs([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary["iqm"] == pytest.approx(3.0) and summary["mean"] == pytest.approx(22.0)
    assert summary["ci_low"] <= summary["iqm"] <= summary["ci_high"]
    assert summarize_runs([0.5, 0.5])["ci_low"] == summarize_runs([0.5, 0.5])["ci_high"] == 0.5


def test_iqm_curve_shapes_and_a_point_by_hand() -> None:
    curves = np.array(
        [
            [0.0, 1.0, 0.2, NAN],
            [0.0, 2.0, 0.2, NAN],
            [0.0, 3.0, 0.2, 5.0],
            [0.0, 100.0, 0.2, NAN],
        ]
    )
    center, low, high = iqm_curve(curves)
    assert center.shape == low.shape == high.shape == (4,)
    np.testing.assert_allclose(center[:3], [0.0, 2.5, 0.2])  # point 1: IQM of [1, 2, 3, 100] = mean(2, 3)
    np.testing.assert_allclose([low[0], high[0], low[2], high[2]], [0.0, 0.0, 0.2, 0.2])  # equal runs: no width
    assert low[1] < 2.5 < high[1] and high[1] <= 100
    assert center[3] == 5.0  # the only run with a value there
    assert low[3] == high[3] == 5.0  # resamples without that run have no value and are left out
    again = iqm_curve(curves)
    for a, b in zip(again, (center, low, high), strict=True):
        np.testing.assert_array_equal(a, b)  # seeded


def test_iqm_curve_does_not_depend_on_the_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    curves = np.random.default_rng(0).random((5, 30))
    whole = iqm_curve(curves, resamples=300)
    monkeypatch.setattr(evaluation, "CHUNK_ELEMENTS", 1000)  # 6 resamples at a time
    for a, b in zip(iqm_curve(curves, resamples=300), whole, strict=True):
        np.testing.assert_array_equal(a, b)


def test_steps_to_threshold() -> None:
    steps = [100, 200, 300, 400]
    curves = np.array(
        [
            [0.1, 0.95, 0.5, 1.0],  # first reaches 0.9 at step 200, even though it drops again
            [0.1, NAN, 0.9, 1.0],  # exactly the threshold counts; a missing value does not
            [0.1, 0.2, 0.3, 0.4],  # never
        ]
    )
    per_run = steps_to_threshold(steps, curves, 0.9)
    assert per_run == [200, 300, None]
    assert summarize_steps(per_run) == {"reached": 2, "runs": 3, "median": 250.0, "iqm": 250.0}
    assert summarize_steps([None, None]) == {"reached": 0, "runs": 2, "median": None, "iqm": None}
    assert summarize_steps([400, 100, 200, 300, 10_000])["iqm"] == pytest.approx(300.0)  # mean of 200, 300, 400


def test_falls_after_reaching() -> None:
    curves = np.array(
        [
            [0.5, 1.0, 0.8, 0.95, 0.4],  # reaches 1.0 at the second update, then 0.8 and 0.4 are below 0.9
            [0.95, 0.85, 1.0, 1.0, 0.9],  # 0.85 comes before it reaches 1.0; exactly the floor is not below
            [0.5, 0.6, NAN, 0.99, 0.7],  # never reaches 1.0
            [1.0, NAN, 1.0, 1.0, 1.0],  # a missing value is not a fall
        ]
    )
    result = falls_after_reaching(curves, reach=1.0, floor=0.9)
    assert result["per_run"] == [
        {"updates_below": 2, "lowest": 0.4},
        {"updates_below": 0, "lowest": 0.9},
        {"updates_below": None, "lowest": None},
        {"updates_below": 0, "lowest": 1.0},
    ]
    assert (result["runs_reached"], result["runs_below"], result["updates_below"]) == (3, 1, 2)
