"""A panel's learning curves: one panel of axes per task, the memories of the table overlaid (lab/panel.py --curves).

The table says where each memory ended; the curves say how it got there: a memory that is still climbing at the
budget, one that solved the task and fell back, one that never left chance. Each curve is the IQM over a pair's seeds
with its 95% bootstrap band, as lab/plot.py draws one experiment, from the summaries the table was built from.
"""

from __future__ import annotations

import json
import math
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from lab import seeds
from lab.experiment_report import draw_experiment, format_steps, save


def curve_memories(panel: dict) -> list[str]:
    """The memories whose curves a panel's figure holds: those that are not variants, in the panel's order (the
    variants are ablations of one of them, judged against them in the table)."""
    variants = set(panel.get("variants", []))
    return [memory for memory in panel["memories"] if memory not in variants]


def panel_figure(panel: dict, panel_id: str, rows: list[dict], columns: int = 4) -> Figure:
    """A panel of axes per task that has rows, in the panel's order: the IQM curve of each memory of
    ``curve_memories`` with its band (read from the summary each row names), the task's threshold as a dashed line.
    A memory keeps its colour in every panel of axes, so that one legend serves them all. ValueError where no row
    of those memories has results."""
    memories = curve_memories(panel)
    colours = {memory: f"C{index % 10}" for index, memory in enumerate(memories)}
    by_task: dict[str, list[dict]] = {}
    for entry in rows:
        if entry["memory"] in colours:
            by_task.setdefault(entry["task"], []).append(entry)
    tasks = [task for task in panel["tasks"] if task in by_task]
    if not tasks:
        raise ValueError(f"panel '{panel_id}': no pair of {', '.join(memories)} has results to draw")
    columns = min(columns, len(tasks))
    lines = math.ceil(len(tasks) / columns)
    figure = Figure(figsize=(3.6 * columns, 2.6 * lines + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(lines, columns, squeeze=False).ravel()
    for ax, task in zip(axes, tasks, strict=False):
        for entry in by_task[task]:
            with open(os.path.join(seeds.RESULTS_DIR, entry["experiment"], "summary.json")) as file:
                summary = json.load(file)
            draw_experiment(ax, summary, entry["memory"], colours[entry["memory"]])
        if by_task[task][0]["threshold"] is not None:
            ax.axhline(by_task[task][0]["threshold"], color="grey", linestyle="--", linewidth=1)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel(by_task[task][0]["metric"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda steps, _: format_steps(int(steps)) if steps > 0 else "0"))
        ax.grid(alpha=0.3)
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colours[memory], linewidth=2) for memory in memories]
    figure.legend(handles, memories, loc="outside lower center", ncols=len(memories), fontsize=9)
    figure.suptitle(
        f"Panel {panel_id}: IQM over each pair's seeds (the table's seeds column) with its 95% bootstrap band, "
        "against environment steps; dashed: the task's threshold",
        fontsize=10,
    )
    return figure


def draw_panel(panel: dict, panel_id: str, rows: list[dict], path: str) -> int:
    """Write ``panel_figure`` to ``path`` (PNG, SVG or PDF by its extension); returns the number of tasks drawn."""
    figure = panel_figure(panel, panel_id, rows)
    save(figure, path)
    return sum(ax.get_visible() for ax in figure.axes)
