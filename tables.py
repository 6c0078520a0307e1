"""Results tables generated from the experiments' summaries, so that a number is written once: the README's results
table comes from results/tables.yaml and each listed experiment's results/<id>/summary.json (``python plot.py
--tables`` writes it; tests/test_tables.py fails when the committed README differs from what the JSON gives).
"""

from __future__ import annotations

import json
import os

import numpy as np
import yaml

from cli import ROOT

SPEC = os.path.join(ROOT, "results", "tables.yaml")
README = os.path.join(ROOT, "README.md")
BEGIN = "<!-- results table: written by `python plot.py --tables` from results/tables.yaml; do not edit by hand -->"
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


def value(number: float, metric: str) -> str:
    """A success rate with 2 decimals; a reward with one decimal from 100 on, else 3 (0.594, -0.145, 187.9)."""
    if metric == "success":
        return f"{number:.2f}"
    return f"{number:.1f}" if abs(number) >= 100 else f"{number:.3f}"


def result(summary: dict) -> str:
    """ "0.99 [0.97, 1.00]" (one seed: no interval)."""
    final, metric = summary["final"], summary["metric"]
    shown = value(final["iqm"], metric)
    if len(summary["finished_seeds"]) > 1:
        shown += f" [{value(final['ci_low'], metric)}, {value(final['ci_high'], metric)}]"
    return shown


def steps(count: int) -> str:
    return f"{count / 1e6:.2f}M" if count >= 1e6 else f"{count / 1e3:.0f}k"


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
    return f"| {link} | {labels} | {seeds} | {results} | {steps(env_steps)} | {times} |"


def readme_table(spec_path: str = SPEC) -> str:
    """The README's results table, between its markers."""
    with open(spec_path) as file:
        spec = yaml.safe_load(file)
    rows = [readme_row(row) for row in spec["readme"]]
    return "\n".join([BEGIN, HEADER, *rows, END])


def replace_table(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``; ValueError without the markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README lacks the results table's markers:\n{BEGIN}\n...\n{END}")
    return text[:start] + table + text[end + len(END) :]


def write_readme_table(readme: str = README) -> bool:
    """Rewrite the README's results table; returns whether it changed."""
    with open(readme) as file:
        text = file.read()
    updated = replace_table(text, readme_table())
    if updated != text:
        with open(readme, "w") as file:
            file.write(updated)
    return updated != text
