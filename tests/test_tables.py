"""The README's results table and the tables of docs/results.md are what results/tables.yaml and the summaries it
names give (python plot.py --tables)."""

from __future__ import annotations

import os

import pytest
import yaml

import tables


def test_readme_table_matches_the_results() -> None:
    with open(tables.README) as file:
        text = file.read()
    assert tables.replace_table(text, tables.readme_table()) == text, "run python plot.py --tables and commit the README"


def test_results_page_tables_match_the_results() -> None:
    with open(tables.SPEC) as file:
        spec = yaml.safe_load(file)
    with open(tables.RESULTS) as file:
        text = file.read()
    page = tables.page_tables(spec)
    assert len(page) >= 5
    for begin, end, table in page:
        assert tables.replace_table(text, table, begin, end) == text, f"{begin}: run python plot.py --tables and commit"


def test_writing_the_tables_fills_their_markers(tmp_path: str) -> None:
    spec = {"readme": [], "results": {"demo": {"TrXL": "mmg1-trxl-memgrad", "GRU": "mmg1-gru"}}}
    spec_path, readme, page = tmp_path / "tables.yaml", tmp_path / "README.md", tmp_path / "results.md"
    spec_path.write_text(yaml.safe_dump(spec))
    readme.write_text(f"intro\n{tables.BEGIN}\nold\n{tables.END}\nend\n")
    begin, end = tables.markers("demo")
    page.write_text(f"text\n{begin}\n| stale |\n{end}\nmore\n")
    assert tables.write_tables(str(readme), str(page), str(spec_path)) == [str(readme), str(page)]
    written = page.read_text()
    assert "| stale |" not in written and written.startswith("text\n") and written.endswith("\nmore\n")
    for label, experiment in spec["results"]["demo"].items():
        summary, _ = tables.load_experiment(experiment)
        assert f"| {label} | {len(summary['finished_seeds'])} | {tables.result(summary)} | " in written
    assert tables.write_tables(str(readme), str(page), str(spec_path)) == [], "a second run changes nothing"


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
    low, high = (tables.value(loaded[0]["final"][key], "success") for key in ("ci_low", "ci_high"))
    assert f"0.50 [{low}, {high}]" in tables.readme_table()
    with pytest.raises(ValueError, match="markers"):
        tables.replace_table("no table here", "")
