"""Aggregating and reporting the finished seeds of an experiment (experiment.py): the final values and curves over
the seeds (IQM, 95% interval, steps to a threshold, falls after solving) as summary.json holds them, and the console
table.
"""

from __future__ import annotations

import sys

import numpy as np

from aggregation import falls_after_reaching, iqm_curve, steps_to_threshold, summarize_runs, summarize_steps
from evaluation import summarize
from seeds import Seed

SUCCESS_THRESHOLD = 0.9  # default steps-to-threshold level of the success rate
SOLVED = 1.0  # success rate of an update in which the task counts as solved (for falls_after_solving)


def curves(runs: list[Seed], metric: str) -> tuple[list[int], np.ndarray]:
    """The per-update curves of the runs on the union of their steps: (steps, values (runs, steps)), NaN where a run
    logged nothing (no episode ended in that update)."""
    tag = f"episode/{metric}_mean"
    scalars = []
    for run in runs:
        scalars.append({step: value for step, value in run.record["curves"].get(tag, [])})
        if not scalars[-1]:
            print(f"note: seed {run.seed} has no '{tag}' in {run.record_path}", file=sys.stderr)
    steps = sorted({step for series in scalars for step in series})
    values = np.array([[series.get(step, np.nan) for step in steps] for series in scalars], dtype=np.float64)
    return steps, values.reshape(len(runs), len(steps))


def to_json(values: np.ndarray | list) -> list:
    """Floats for JSON, NaN as null (JSON has no NaN)."""
    return [None if value is None or np.isnan(value) else float(value) for value in np.asarray(values, dtype=np.float64)]


def aggregate(runs: list[Seed], metric: str, threshold: float | None) -> dict:
    """The results of the finished ``runs``: per seed, the final value (mean of ``metric`` over its evaluation
    episodes) and steps to ``threshold``; over the seeds, the final IQM, mean and 95% interval of the IQM, the
    per-update curves with their IQM and band, and the steps-to-threshold aggregate."""
    finals = [float(np.mean([result[metric] for result in run.evaluation])) for run in runs]
    steps, values = curves(runs, metric)
    center, low, high = iqm_curve(values) if steps else (np.zeros(0), np.zeros(0), np.zeros(0))
    reached = steps_to_threshold(steps, values, threshold) if threshold is not None else [None] * len(runs)
    to_threshold: dict = {"threshold": threshold}
    if threshold is not None:
        to_threshold.update(summarize_steps(reached), per_seed=reached)
    falls = None
    if metric == "success" and threshold is not None:
        # Did a seed that solved the task (an update in which every training episode succeeded) lose it again?
        if steps:
            falls = falls_after_reaching(values, SOLVED, threshold)
            falls["per_seed"] = {str(run.seed): entry for run, entry in zip(runs, falls.pop("per_run"), strict=True)}
    return {
        "final": {**summarize_runs(finals), "per_seed": finals},
        "final_interval": "95% percentile bootstrap of the IQM over the seeds, resampling the seeds",
        "per_seed": [
            {
                "seed": run.seed,
                "status": run.status,
                "final": final,
                "steps_to_threshold": step,
                "model": run.model_path,
                "summary_dir": run.checkpoint["summary_dir"],
                "updates": run.checkpoint["update"],
                "env_steps": run.checkpoint["env_steps"],
                "evaluation": summarize(run.evaluation),
            }
            for run, final, step in zip(runs, finals, reached, strict=True)
        ],
        "curves": {
            "tag": f"episode/{metric}_mean",
            "steps": steps,
            "per_seed": {str(run.seed): to_json(row) for run, row in zip(runs, values, strict=True)},
            "iqm": to_json(center),
            "ci_low": to_json(low),
            "ci_high": to_json(high),
        },
        "steps_to_threshold": to_threshold,
        "falls_after_solving": falls,
    }


def print_report(runs: list[Seed], summary: dict) -> None:
    """The table of the seeds (what was done, counters, final value, steps to the threshold), then the aggregates."""
    metric, threshold, final = summary["metric"], summary["steps_to_threshold"]["threshold"], summary["final"]
    reach = f"steps to {threshold:g}" if threshold is not None else ""
    header = f"{metric} ({summary['eval_episodes']} ep.{', greedy' if summary.get('deterministic') else ''})"
    print(f"{'seed':>6}  {'status':<8}{'updates':>9}{'env steps':>12}{header:>22}{reach:>16}")
    results = {entry["seed"]: entry for entry in summary["per_seed"]}
    for run in runs:
        if run.seed not in results:
            print(f"{run.seed:>6}  {'failed':<8}  {run.stage}: {run.reason}")
            continue
        entry = results[run.seed]
        step = entry["steps_to_threshold"]
        shown = ("-" if step is None else str(step)) if threshold is not None else ""
        print(
            f"{run.seed:>6}  {entry['status']:<8}{entry['updates']:>9}{entry['env_steps']:>12}{entry['final']:>22.3f}"
            f"{shown:>16}"
        )
    seeds = len(summary["per_seed"])
    print(
        f"{metric} over {seeds} seed{'s' if seeds > 1 else ''}: IQM {final['iqm']:.3f}, mean {final['mean']:.3f}, "
        f"95% CI of the IQM [{final['ci_low']:.3f}, {final['ci_high']:.3f}]"
    )
    if threshold is not None:
        to_threshold = summary["steps_to_threshold"]
        median = "-" if to_threshold["median"] is None else f"{to_threshold['median']:.0f}"
        print(f"steps to {metric} {threshold:g}: {to_threshold['reached']} of {to_threshold['runs']} seeds, median {median}")
    falls = summary["falls_after_solving"]
    if falls is not None and falls["runs_reached"] == 0:
        print(f"no seed reached {metric} {falls['reach']:.2f} in training, so none could fall back")
    elif falls is not None:
        print(
            f"after first reaching {metric} {falls['reach']:.2f} in training: {falls['runs_below']} of "
            f"{falls['runs_reached']} seeds fell below {falls['floor']:g} ({falls['updates_below']} updates in all)"
        )
    failures = summary["failures"]
    if failures:
        print(f"{len(failures)} seed{'s' if len(failures) > 1 else ''} failed: {', '.join(str(f['seed']) for f in failures)}")
