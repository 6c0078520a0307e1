"""Overlay the IQM curves of several experiments (written by lab/experiment.py), each with its 95% confidence band.

Usage:
  python -m lab.plot <experiment>... [--out=<file>] [--title=<text>] [--metric=<name>]
  python -m lab.plot --tables
  python -m lab.plot (-h | --help)

Arguments:
  <experiment>          A folder written by lab/experiment.py (results/<id>) or its summary.json; the legend names
                        each by its run id.

Options:
  --out=<file>          Figure to write, PNG, SVG or PDF by its extension; plots/ is a git-ignored scratch folder, so
                        name a figure to commit, e.g. --out=results/name.png (default: plots/compare.png).
  --title=<text>        Title (default: "<metric>: IQM over seeds with 95% stratified-bootstrap bands").
  --metric=<name>       Curves of another logged metric (reward, success, length, or a tag: training/approx_kl,
                        losses/entropy), rebuilt from the seeds' records (results/<id>/seed-k.json; the two tags
                        since 2026-12-03) (default: the experiments' own).
  --tables              Instead: write the README's results table, the named tables of docs/results.md and
                        results/**/README.md and the panels' tables from results/tables.yaml (the experiments of
                        each row) and the summaries it names (lab/tables.py); tests/test_tables.py fails when a
                        committed table differs.
  -h --help             Show this help.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from cli import parse_args
from lab.aggregation import iqm_curve
from lab.experiment_report import draw_experiment, metric_label, new_axes, save
from lab.tables import write_tables

SUMMARY_FILE = "summary.json"


def summary_path(path: str) -> str:
    """The summary.json of an experiment folder, or ``path`` itself where it is a file."""
    return os.path.join(path, SUMMARY_FILE) if os.path.isdir(path) else path


def load_summary(path: str) -> dict:
    """Read an experiment's summary.json (``path``: the file or its folder); ValueError with the fix where it is not one."""
    file = summary_path(path)
    if not os.path.isfile(file):
        raise ValueError(f"'{file}' does not exist: pass a folder that lab/experiment.py wrote (results/<run-id>)")
    try:
        with open(file) as handle:
            summary = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read '{file}': {error}") from None
    if not isinstance(summary, dict) or "curves" not in summary or "metric" not in summary:
        raise ValueError(f"'{file}' is not a summary written by lab/experiment.py (no curves and metric inside)")
    return summary


def with_metric(summary: dict, path: str, metric: str) -> dict:
    """``summary`` with its curves rebuilt for ``metric`` from the seed records beside it; ValueError naming the fix
    where a record is missing or lacks the metric."""
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


def default_output(first: str) -> str:
    """plots/compare.png beside the results folder of the first experiment (results/<id> -> plots/compare.png): a
    git-ignored scratch folder, so a look at some curves leaves ``git status`` clean; a figure to commit is named with
    --out (e.g. results/<name>.png)."""
    folder = os.path.dirname(os.path.abspath(summary_path(first)))
    return os.path.join(os.path.dirname(os.path.dirname(folder)), "plots", "compare.png")


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.plot`` with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    if args["--tables"]:
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
