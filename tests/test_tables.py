"""The README's results table and the named tables of docs/results.md and of the results/**/README.md files are what
results/tables.yaml and the summaries it names give (python -m lab.plot --tables); the results page stays short."""

from __future__ import annotations

import contextlib
import json
import os
import re

import pytest
import yaml

from lab import tables


def test_readme_table_matches_the_results() -> None:
    with open(tables.README) as file:
        text = file.read()
    assert tables.replace_table(text, tables.readme_table()) == text, "run python -m lab.plot --tables and commit the README"


def test_every_named_table_matches_the_results_wherever_it_is() -> None:
    spec = tables.load_spec()
    built = dict(zip(tables.table_names(spec), tables.page_tables(spec), strict=True))
    assert len(built) >= 5
    placed = set()
    for path in tables.result_pages():
        with open(path) as file:
            text = file.read()
        where = os.path.relpath(path, tables.ROOT)
        assert tables.fill_page(text, built, path) == text, f"{where}: run python -m lab.plot --tables and commit"
        placed.update(tables.tables_on(text))
    assert placed == set(built), f"tables of results/tables.yaml on no page: {sorted(set(built) - placed)}"


def test_a_page_with_a_table_the_spec_does_not_name_is_refused() -> None:
    begin, end = tables.markers("unknown")
    with pytest.raises(ValueError, match="does not name"):
        tables.fill_page(f"{begin}\n| old |\n{end}\n", {}, "results/x/README.md")


RESULTS_MAX_BYTES = 25_000


def test_the_results_page_is_short() -> None:
    size = os.path.getsize(tables.RESULTS)
    assert size <= RESULTS_MAX_BYTES, f"docs/results.md has {size} bytes, at most {RESULTS_MAX_BYTES}: details go to results/"


def test_the_results_page_writes_no_number_outside_its_generated_tables() -> None:
    # A measured value on the results page is a decimal or a percentage; outside the generated tables it would drift.
    with open(tables.RESULTS) as file:
        text = file.read()
    for begin, end, _ in tables.page_tables(tables.load_spec()):
        if begin in text:
            text = text[: text.index(begin)] + text[text.index(end) + len(end) :]
    prose = re.sub(r"\]\([^)]*\)|`[^`]*`", "", text)  # link targets and code name files and settings, not results
    assert not re.findall(r"\d\.\d|\d\s*%", prose), "a number on docs/results.md outside a generated table"


def test_writing_the_tables_fills_their_markers(tmp_path: str) -> None:
    demo = {"TrXL": "ablations/mortar-mayhem/mmg1-trxl-memgrad", "GRU": "memories/mortar-mayhem/mmg1-gru"}
    spec = {"readme": [], "results": {"demo": demo}}
    spec_path, readme, page = tmp_path / "tables.yaml", tmp_path / "README.md", tmp_path / "results.md"
    spec_path.write_text(yaml.safe_dump(spec))
    readme.write_text(f"intro\n{tables.BEGIN}\nold\n{tables.END}\nend\n")
    begin, end = tables.markers("demo")
    page.write_text(f"text\n{begin}\n| stale |\n{end}\nmore\n")
    assert tables.write_tables(str(readme), [str(page)], str(spec_path)) == [str(readme), str(page)]
    written = page.read_text()
    assert "| stale |" not in written and written.startswith("text\n") and written.endswith("\nmore\n")
    for label, experiment in spec["results"]["demo"].items():
        summary, _ = tables.load_experiment(experiment)
        assert f"| {label} | {len(summary['finished_seeds'])} | {tables.result(summary)} | " in written
    assert tables.write_tables(str(readme), [str(page)], str(spec_path)) == [], "a second run changes nothing"


def test_every_row_links_a_heading_of_the_results_page() -> None:
    from test_docs import anchors  # the docs tests' heading anchors

    with open(tables.SPEC) as file:
        spec = yaml.safe_load(file)
    headings = anchors(os.path.join(os.path.dirname(tables.README), "docs", "results.md"))
    for row in spec["readme"]:
        assert row["section"] in headings, row["task"]


def test_a_changed_summary_changes_the_table(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gru = "memories/mortar-mayhem/mmg1-gru"
    loaded = tables.load_experiment(gru)
    changed = ({**loaded[0], "final": {**loaded[0]["final"], "iqm": 0.5}}, loaded[1])
    monkeypatch.setattr(tables, "load_experiment", lambda experiment: changed if experiment == gru else loaded)
    low, high = (tables.format_value(loaded[0]["final"][key], "success") for key in ("ci_low", "ci_high"))
    assert f"0.50 [{low}, {high}]" in tables.readme_table()
    with pytest.raises(ValueError, match="markers"):
        tables.replace_table("no table here", "")


def fake_summary(finished: list[int], finals: list[float], falls: dict | None) -> dict:
    """A summary with what results_table reads: ``finals`` in the order the seeds ``finished``."""
    return {
        "finished_seeds": finished,
        "metric": "success",
        "final": {"iqm": 0.75, "ci_low": 0.5, "ci_high": 1.0, "per_seed": finals},
        "per_seed": [{"seed": seed, "env_steps": 4096} for seed in finished],
        "steps_to_threshold": {"threshold": None},
        "falls_after_solving": falls,
    }


def test_the_results_table_counts_the_seeds_that_fell_after_solving(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    falls = {"reach": 1.0, "floor": 0.8, "runs_reached": 3, "runs_below": 2, "updates_below": 7}
    summaries = {
        "fell": fake_summary([2, 0, 1], [0.5, 1.0, 0.75], falls),
        "held": fake_summary([0, 1], [1.0, 1.0], {**falls, "runs_reached": 2, "runs_below": 0, "updates_below": 0}),
        "never solved": fake_summary([0], [0.5], {**falls, "runs_reached": 0, "runs_below": 0}),
        "not counted": fake_summary([0], [0.5], None),
    }
    for name, summary in summaries.items():
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(tables, "ROOT", str(tmp_path))
    rows = tables.results_table("demo", {name: name for name in summaries}).splitlines()
    header = [cell.strip() for cell in rows[1].split("|")]
    assert "fell below 0.8 after reaching 1" in header
    column = header.index("fell below 0.8 after reaching 1")
    cells = {row.split("|")[1].strip(): [cell.strip() for cell in row.split("|")] for row in rows[3:-1]}
    assert {name: row[column] for name, row in cells.items()} == {
        "fell": "2 of 3 (7 updates)",
        "held": "0 of 2",
        "never solved": "-",
        "not counted": "-",
    }
    assert cells["fell"][header.index("per seed")] == "1.00, 0.75, 0.50", "per seed in the order of the seeds"
    without = tables.results_table("demo", {"not counted": "not counted"}).splitlines()[1]
    assert "| fell back after solving |" in without


def test_the_committed_panel_table_is_the_one_the_summaries_give() -> None:
    from lab import panel

    spec = tables.load_spec()
    name, entry = next(iter(spec["panels"].items()))
    with contextlib.chdir(tables.ROOT):
        spec_file = panel.load_panel(entry["file"])
        fresh = panel.panel_markdown(spec_file, entry["id"])
    with open(os.path.join(tables.ROOT, "results", "panel", entry["id"], "table.md")) as file:
        committed = file.read()
    assert committed == fresh, "run python -m lab.plot --tables and commit results/panel"
    rows = [line for line in committed.splitlines() if line.startswith("|")]
    assert len(rows) > 2 and rows[0].startswith("| task | memory |")
    on_page = dict((begin, text) for begin, _, text in tables.page_tables(spec))[tables.markers(name)[0]]
    assert on_page.splitlines()[1:-1] == rows  # the results page shows the panel's own table
