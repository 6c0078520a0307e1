"""Results tables generated from the experiments' summaries, so that a number is written once: the README's results
table and the named tables of docs/results.md and of the results/**/README.md files beside the experiments come from
results/tables.yaml and each listed experiment's results/<id>/summary.json (``python -m lab.plot --tables`` writes them;
tests/test_tables.py fails when a committed table differs from what the JSON gives).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re

import numpy as np
import yaml

from cli import ROOT
from lab import panel
from lab.experiment_report import format_steps, format_value

SPEC = os.path.join(ROOT, "results", "tables.yaml")
README = os.path.join(ROOT, "README.md")
RESULTS = os.path.join(ROOT, "docs", "results.md")
# A named table's first line, wherever it is: its name
TABLE_START = re.compile(r"^<!-- table (\S+): written by", flags=re.MULTILINE)
BEGIN = "<!-- results table: written by `python -m lab.plot --tables` from results/tables.yaml; do not edit by hand -->"
END = "<!-- end of the results table -->"
HEADER = (
    "| task | memory | seeds | final result (IQM [95% CI]) | env steps | CPU minutes per seed |\n|---|---|---|---|---|---|"
)


def load_experiment(experiment: str) -> tuple[dict, list[dict]]:
    """An experiment's summary and its finished seeds' records (results/<id>/seed-k.json, where committed)."""
    folder = os.path.join(ROOT, "results", experiment)
    with open(os.path.join(folder, "summary.json")) as file:
        summary = json.load(file)
    records = []
    for seed in summary["finished_seeds"]:
        path = os.path.join(folder, f"seed-{seed}.json")
        if os.path.isfile(path):
            with open(path) as file:
                records.append(json.load(file))
    return summary, records


def result(summary: dict) -> str:
    """ "0.99 [0.97, 1.00]" (one seed: no interval)."""
    final, metric = summary["final"], summary["metric"]
    shown = format_value(final["iqm"], metric)
    if len(summary["finished_seeds"]) > 1:
        shown += f" [{format_value(final['ci_low'], metric)}, {format_value(final['ci_high'], metric)}]"
    return shown


def minutes(records: list[dict]) -> str:
    """Median training minutes per seed from the records that kept them (experiments since 2026-12-02), else "-"."""
    seconds = [record["seconds"] for record in records if record.get("seconds") is not None]
    return f"{np.median(seconds) / 60:.1f}" if seconds else "-"


def readme_row(row: dict) -> str:
    loaded = {label: load_experiment(experiment) for label, experiment in row["experiments"].items()}
    labels = " / ".join(loaded)
    seeds = " / ".join(str(len(summary["finished_seeds"])) for summary, _ in loaded.values())
    metrics = sorted({summary["metric"] for summary, _ in loaded.values()})
    results = " / ".join(metrics) + " " + " / ".join(result(summary) for summary, _ in loaded.values())
    env_steps = max(seed["env_steps"] for summary, _ in loaded.values() for seed in summary["per_seed"])
    times = " / ".join(minutes(records) for _, records in loaded.values())
    link = f"[{row['task']}](docs/results.md#{row['section']})"
    return f"| {link} | {labels} | {seeds} | {results} | {format_steps(env_steps)} | {times} |"


def load_spec(spec_path: str = SPEC) -> dict:
    """results/tables.yaml: the README's rows and the results page's tables."""
    with open(spec_path) as file:
        return yaml.safe_load(file)


def readme_table(spec: dict | None = None) -> str:
    """The README's results table of ``spec`` (results/tables.yaml by default), between its markers."""
    spec = load_spec() if spec is None else spec
    rows = [readme_row(row) for row in spec["readme"]]
    return "\n".join([BEGIN, HEADER, *rows, END])


def replace_table(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the block from ``begin`` to ``end`` replaced by ``table`` (which holds both markers); ValueError
    without the markers."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the markers of a generated table are missing:\n{begin}\n...\n{end}")
    return text[:start] + table + text[stop + len(end) :]


def markers(name: str) -> tuple[str, str]:
    """The lines around the results page's table ``name``."""
    return (
        f"<!-- table {name}: written by `python -m lab.plot --tables` from results/tables.yaml; do not edit by hand -->",
        f"<!-- end of table {name} -->",
    )


def reached(summary: dict) -> str:
    """ "4 of 5: at 295k, 393k, ..." (the seeds whose training metric reached the threshold, and where), "-" without
    a threshold."""
    to_threshold = summary["steps_to_threshold"]
    if to_threshold["threshold"] is None:
        return "-"
    at = sorted(step for step in to_threshold["per_seed"] if step is not None)
    shown = f"{to_threshold['reached']} of {to_threshold['runs']}"
    return shown + (f": at {', '.join(format_steps(s) for s in at)}" if at else "")


def fell(summary: dict) -> str:
    """ "1 of 6 (11 updates)": of the seeds whose training metric reached ``reach``, those that later fell below
    ``floor`` (and their updates below it, all seeds together); "-" without the count or without a seed that reached."""
    falls = summary.get("falls_after_solving")
    if not falls or not falls["runs_reached"]:
        return "-"
    shown = f"{falls['runs_below']} of {falls['runs_reached']}"
    return shown + (f" ({falls['updates_below']} updates)" if falls["runs_below"] else "")


def fell_header(summaries: list[dict]) -> str:
    """The stability column's header: "fell below 0.9 after reaching 1" when the summaries that count falls agree."""
    rules = {(falls["floor"], falls["reach"]) for falls in (s.get("falls_after_solving") for s in summaries) if falls}
    if len(rules) != 1:
        return "fell back after solving"
    floor, reach = rules.pop()
    return f"fell below {floor:g} after reaching {reach:g}"


def finals_by_seed(summary: dict) -> list[float]:
    """The final value of each finished seed, in the order of the seeds (a summary lists them as they finished)."""
    return [final for _, final in sorted(zip(summary["finished_seeds"], summary["final"]["per_seed"], strict=True))]


def results_table(name: str, experiments: dict[str, str]) -> str:
    """The results page's table ``name``: one row per experiment (label -> results/<id>), between its markers."""
    loaded = {label: load_experiment(experiment) for label, experiment in experiments.items()}
    summaries = [summary for summary, _ in loaded.values()]
    metric = " / ".join(sorted({summary["metric"] for summary in summaries}))
    threshold = {summary["steps_to_threshold"]["threshold"] for summary in summaries} - {None}
    reach = f"training {metric} {min(threshold):g} reached" if threshold else "training threshold"
    lines = [
        f"| setting | seeds | final {metric}, IQM [95% CI] | per seed | {reach} | {fell_header(summaries)} | env steps "
        "| minutes per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, (summary, records) in loaded.items():
        per_seed = ", ".join(format_value(final, summary["metric"]) for final in finals_by_seed(summary))
        env_steps = max(seed["env_steps"] for seed in summary["per_seed"])
        lines.append(
            f"| {label} | {len(summary['finished_seeds'])} | {result(summary)} | {per_seed} | {reached(summary)} "
            f"| {fell(summary)} | {format_steps(env_steps)} | {minutes(records)} |"
        )
    begin, end = markers(name)
    return "\n".join([begin, *lines, end])


def result_pages() -> list[str]:
    """The pages that hold named tables: docs/results.md and every README.md under results/."""
    readmes = glob.glob(os.path.join(ROOT, "results", "**", "README.md"), recursive=True)
    return [RESULTS, *sorted(readmes)]


def tables_on(text: str) -> list[str]:
    """The names of the named tables whose markers ``text`` holds, in their order."""
    return TABLE_START.findall(text)


def fill_page(text: str, built: dict[str, tuple[str, str, str]], path: str) -> str:
    """``text`` with each of its named tables rewritten from ``built`` (name -> begin, end, table); ValueError for a
    table that results/tables.yaml does not name."""
    for name in tables_on(text):
        if name not in built:
            raise ValueError(f"{path} holds table '{name}', which results/tables.yaml does not name: add it there")
        begin, end, table = built[name]
        text = replace_table(text, table, begin, end)
    return text


def write_tables(readme: str = README, pages: list[str] | None = None, spec_path: str = SPEC) -> list[str]:
    """Rewrite the README's results table and the named tables of ``pages`` (docs/results.md and the results/**/README.md
    files by default); returns the files that changed."""
    spec = load_spec(spec_path)
    changed = write_panels(spec)
    built = {name: entry for name, entry in zip(table_names(spec), page_tables(spec), strict=True)}
    for path in [readme, *(result_pages() if pages is None else pages)]:
        with open(path) as file:
            text = file.read()
        updated = replace_table(text, readme_table(spec)) if path == readme else fill_page(text, built, path)
        if updated != text:
            with open(path, "w") as file:
                file.write(updated)
            changed.append(path)
    return changed


def panel_table(name: str, panel_id: str) -> str:
    """The results page's table ``name``: the rows of the leaderboard results/panel/<panel_id>/table.md (which
    write_panels builds from the summaries first), between its markers."""
    with open(os.path.join(ROOT, panel.PANEL_DIR, panel_id, "table.md")) as file:
        rows = [line.rstrip("\n") for line in file if line.startswith("|")]
    return "\n".join([markers(name)[0], *rows, markers(name)[1]])


def read_text(path: str) -> str:
    with open(path) as file:
        return file.read()


def write_panels(spec: dict) -> list[str]:
    """Rewrite each panel's results/panel/<id>/table.md and table.json from the summaries; returns the tables that
    changed."""
    changed = []
    for entry in spec.get("panels", {}).values():
        path = os.path.join(ROOT, panel.PANEL_DIR, entry["id"], "table.md")
        before = read_text(path) if os.path.isfile(path) else None
        with contextlib.chdir(ROOT):
            panel.write_table(panel.load_panel(entry["file"]), entry["id"])
        if read_text(path) != before:
            changed.append(path)
    return changed


def table_names(spec: dict) -> list[str]:
    """The names of the named tables in ``spec``, in the order of page_tables."""
    return [*spec.get("results", {}), *spec.get("panels", {})]


def page_tables(spec: dict) -> list[tuple[str, str, str]]:
    """(begin marker, end marker, table) of every named table in ``spec``: those of experiments (``results``) and
    those of panels (``panels``)."""
    built = [(*markers(name), results_table(name, experiments)) for name, experiments in spec.get("results", {}).items()]
    panels = spec.get("panels", {}).items()
    return built + [(*markers(name), panel_table(name, entry["id"])) for name, entry in panels]
