"""The README's results table is what results/tables.yaml and the summaries it names give (python plot.py --tables)."""

from __future__ import annotations

import os

import pytest
import yaml

import tables


def test_readme_table_matches_the_results() -> None:
    with open(tables.README) as file:
        text = file.read()
    assert tables.replace_table(text, tables.readme_table()) == text, "run python plot.py --tables and commit the README"


def test_every_row_links_a_heading_of_the_results_page() -> None:
    from test_docs import anchors  # the docs tests' heading anchors

    with open(tables.SPEC) as file:
        spec = yaml.safe_load(file)
    headings = anchors(os.path.join(os.path.dirname(tables.README), "docs", "results.md"))
    for row in spec["readme"]:
        assert row["section"] in headings, row["task"]


def test_a_changed_summary_changes_the_table(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = tables.load_experiment("mmg1-gru")
    changed = ({**loaded[0], "final": {**loaded[0]["final"], "iqm": 0.5}}, loaded[1])
    monkeypatch.setattr(tables, "load_experiment", lambda experiment: changed if experiment == "mmg1-gru" else loaded)
    assert "0.50 [0.97, 1.00]" in tables.readme_table()
    with pytest.raises(ValueError, match="markers"):
        tables.replace_table("no table here", "")
