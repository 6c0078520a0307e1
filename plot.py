"""Overlay the IQM curves of several experiments (written by experiment.py), each with its 95% confidence band.

Usage:
  plot.py <experiment>... [--out=<file>] [--title=<text>] [--metric=<name>]
  plot.py --tables
  plot.py (-h | --help)

Arguments:
  <experiment>          A folder written by experiment.py (results/<id>) or its summary.json.

Options:
  --out=<file>          Figure to write (default: plots/compare.png, a git-ignored scratch folder).
  --title=<text>        Title (default: "<metric>: IQM over seeds with 95% stratified-bootstrap bands").
  --metric=<name>       Curves of another logged metric than the experiments' own (reward, success, length, or a
                        tag: training/approx_kl, losses/entropy), rebuilt from their seeds' records
                        (results/<id>/seed-k.json; the two tags since 2026-12-03).
  --tables              Instead: write the README's results table and the tables of docs/results.md from
                        results/tables.yaml and the summaries it names (tables.py).
  -h --help             Show this help.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cli import parse_args

SUMMARY_FILE = "summary.json"


def summary_path(path: str) -> str:
    """The summary.json of an experiment folder, or ``path`` itself where it is a file."""
    return os.path.join(path, SUMMARY_FILE) if os.path.isdir(path) else path


def load_summary(path: str) -> dict:
    """Read an experiment's summary.json (``path``: the file or its folder); ValueError with the fix where it is not one."""
    file = summary_path(path)
    if not os.path.isfile(file):
        raise ValueError(f"'{file}' does not exist: pass a folder that experiment.py wrote (results/<run-id>)")
    try:
        with open(file) as handle:
            summary = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read '{file}': {error}") from None
    if not isinstance(summary, dict) or "curves" not in summary or "metric" not in summary:
        raise ValueError(f"'{file}' is not a summary written by experiment.py (no curves and metric inside)")
    return summary


def with_metric(summary: dict, path: str, metric: str) -> dict:
    """``summary`` with its curves rebuilt for ``metric`` from the seed records beside it; ValueError naming the fix
    where a record is missing or lacks the metric."""
    from aggregation import iqm_curve

    if metric == summary["metric"]:
        return summary
    folder, tag, series = os.path.dirname(summary_path(path)), (metric if "/" in metric else f"episode/{metric}_mean"), {}
    for seed in summary["finished_seeds"]:
        record = os.path.join(folder, f"seed-{seed}.json")
        if not os.path.isfile(record):
            raise ValueError(f"--metric {metric}: '{record}' is missing (experiments before 2026-11-30 kept no records)")
        with open(record) as handle:
            points = json.load(handle)["curves"].get(tag)
        if not points:
            raise ValueError(f"--metric {metric}: '{record}' has no '{tag}'")
        series[str(seed)] = dict(points)
    steps = sorted({step for points in series.values() for step in points})
    values = np.array([[points.get(step, np.nan) for step in steps] for points in series.values()], dtype=np.float64)
    center, low, high = iqm_curve(values)
    rows = {seed: [float(v) for v in row] for seed, row in zip(series, values, strict=True)}
    curves = {"tag": tag, "steps": steps, "per_seed": rows, "iqm": list(center), "ci_low": list(low), "ci_high": list(high)}
    return summary | {"metric": metric, "curves": curves}


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
    """The figure of one experiment: IQM curve with its 95% band and thin per-seed curves (experiment.py's curves.png)."""
    seeds = len(summary["curves"]["per_seed"])
    title = f"{os.path.basename(summary['config'])}: {seeds} seed{'s' if seeds != 1 else ''}"
    figure, ax = new_axes(title, metric_label([summary]))
    draw_experiment(ax, summary, summary["run_id"], "C0", per_seed=True)
    threshold = summary.get("steps_to_threshold", {}).get("threshold")
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.legend(loc="best")
    save(figure, path)


def default_output(first: str) -> str:
    """plots/compare.png beside the results folder of the first experiment (results/<id> -> plots/compare.png): a
    git-ignored scratch folder, so a look at some curves leaves ``git status`` clean; a figure to commit is named with
    --out (e.g. results/<name>.png)."""
    folder = os.path.dirname(os.path.abspath(summary_path(first)))
    return os.path.join(os.path.dirname(os.path.dirname(folder)), "plots", "compare.png")


def main(argv: list[str] | None = None) -> int:
    """Run plot.py with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    if args["--tables"]:
        from tables import write_tables

        changed = write_tables()
        print(f"wrote {', '.join(os.path.relpath(path) for path in changed)}" if changed else "unchanged: every table")
        return 0
    try:
        paths = args["<experiment>"]
        summaries = [load_summary(path) for path in paths]
        if args["--metric"]:
            summaries = [with_metric(summary, path, args["--metric"]) for summary, path in zip(summaries, paths, strict=True)]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metrics = {summary["metric"] for summary in summaries}
    if len(metrics) > 1:
        print(f"note: the experiments measure different metrics ({', '.join(sorted(metrics))})", file=sys.stderr)
    out = args["--out"] or default_output(args["<experiment>"][0])
    title = args["--title"] or f"{' / '.join(sorted(metrics))}: IQM over seeds with 95% stratified-bootstrap bands"
    figure, ax = new_axes(title, metric_label(summaries))
    for index, summary in enumerate(summaries):
        draw_experiment(ax, summary, summary["run_id"], f"C{index % 10}")
    ax.legend(loc="best")
    try:
        save(figure, out)
    except (OSError, ValueError) as error:  # matplotlib raises ValueError for an unknown extension
        print(f"error: cannot write '{out}': {error}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
