"""Aggregating and reporting the finished seeds of an experiment (lab/experiment.py): the final values and curves over
the seeds (IQM, 95% interval, steps to a threshold, falls after solving) as summary.json holds them, the console
table, and the figure of the curves (curves.png; lab/plot.py draws several experiments with the same functions). The
number formats of the results tables (lab/tables.py, lab/panel.py) are here too, so that a result reads the same
everywhere.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evaluation import summarize
from lab.aggregation import falls_after_reaching, iqm_curve, steps_to_threshold, summarize_runs, summarize_steps
from lab.seeds import Seed

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


def format_value(number: float, metric: str) -> str:
    """A success rate with 2 decimals; a reward with one decimal from 100 on, else 3 (0.594, -0.145, 187.9)."""
    if metric == "success":
        return f"{number:.2f}"
    return f"{number:.1f}" if abs(number) >= 100 else f"{number:.3f}"


def format_steps(count: int) -> str:
    """Environment steps as a table shows them: 1.23M, 295k."""
    return f"{count / 1e6:.2f}M" if count >= 1e6 else f"{count / 1e3:.0f}k"


def as_array(values: list[float | None]) -> np.ndarray:
    """A JSON list of numbers (null: no value) as a float array with NaN for null."""
    return np.array([np.nan if value is None else value for value in values], dtype=np.float64)


def draw_experiment(ax: Axes, summary: dict, label: str, color: str, per_seed: bool = False) -> None:
    """Draw one experiment's IQM curve against environment steps with its band, and optionally each seed's curve."""
    curves = summary["curves"]
    steps = np.array(curves["steps"], dtype=np.float64)
    if len(steps) == 0:
        return
    if per_seed:
        for index, values in enumerate(curves["per_seed"].values()):
            single = "single seeds" if index == 0 else None  # one legend entry for all of them
            ax.plot(steps, as_array(values), color=color, linewidth=0.6, alpha=0.4, label=single)
    seeds = len(curves["per_seed"])
    ax.fill_between(steps, as_array(curves["ci_low"]), as_array(curves["ci_high"]), color=color, alpha=0.25, linewidth=0)
    counted = f"{seeds} seed{'s' if seeds != 1 else ''}"
    ax.plot(steps, as_array(curves["iqm"]), color=color, linewidth=2, label=f"{label} (IQM of {counted}, 95% CI)")


def metric_label(summaries: list[dict]) -> str:
    """The y-axis label: the metric the curves show, per update."""
    metrics = sorted({summary["metric"] for summary in summaries})
    return f"{' / '.join(metrics)} (mean of the episodes that ended in each update)"


def new_axes(title: str, ylabel: str) -> tuple[Figure, Axes]:
    """A figure with one set of axes, drawn with Agg: no display is needed."""
    figure = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return figure, ax


def save(figure: Figure, path: str) -> None:
    """Write the figure (its format from the file's extension), creating the folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=120)


def experiment_figure(summary: dict, path: str) -> None:
    """The figure of one experiment: IQM curve with its 95% band and thin per-seed curves (lab/experiment.py's curves.png)."""
    seeds = len(summary["curves"]["per_seed"])
    title = f"{os.path.basename(summary['config'])}: {seeds} seed{'s' if seeds != 1 else ''}"
    figure, ax = new_axes(title, metric_label([summary]))
    draw_experiment(ax, summary, summary["run_id"], "C0", per_seed=True)
    threshold = summary.get("steps_to_threshold", {}).get("threshold")
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.legend(loc="best")
    save(figure, path)
