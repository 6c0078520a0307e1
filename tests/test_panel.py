"""lab/panel.py end to end on a tiny panel (one task, two memories, one seed of 2 updates), and panel files answered with
clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import small_config

from cli import module_environment
from config import TRANSFORMER_SCHEMA, load_config, parse_overrides
from lab import panel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = """
seeds: "0"
eval_episodes: 2
memories:
  trxl: []
  none: [memory=none]
tasks:
  poc:
    config: configs/poc_memory_env.yaml
    sets: [updates=2, n_workers=2, worker_steps=16, n_mini_batch=2, eval_interval=0, transformer.embed_dim=16,
           transformer.num_blocks=1, hidden_layer_size=16, transformer.memory_length=8]
"""


def run_panel(folder: str, text: str, *flags: str, panel_id: str = "tiny") -> subprocess.CompletedProcess:
    with open(os.path.join(folder, "panel.yaml"), "w") as file:
        file.write(text)
    command = [sys.executable, "-m", "lab.panel", "--panel=panel.yaml", f"--id={panel_id}", "--cpu", *flags]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env=module_environment())


@pytest.mark.slow
def test_tiny_panel_end_to_end(tmp_path: str) -> None:
    result = run_panel(str(tmp_path), TINY, "--only=none")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"panel": "tiny", "pairs": 2, "with_results": 1, "failed": []}
    result = run_panel(str(tmp_path), TINY)  # the finished pair is skipped, the other one trains
    assert result.returncode == 0, result.stderr
    assert "seed 0: skipped: finished earlier" in result.stdout
    table = json.load(open(os.path.join(tmp_path, "results", "panel", "tiny", "table.json")))
    assert [(row["task"], row["memory"], row["seeds"]) for row in table["rows"]] == [("poc", "trxl", 1), ("poc", "none", 1)]
    for row in table["rows"]:
        assert row["env_steps"] == 64 and row["seconds_per_seed"] > 0 and row["metric"] == "success"
        assert row["ci"][0] <= row["iqm"] <= row["ci"][1]
    markdown = open(os.path.join(tmp_path, "results", "panel", "tiny", "table.md")).read()
    assert markdown.count("| poc |") == 2 and "**" in markdown  # the best IQM of the task in bold
    # The table alone, from the results there are.
    os.remove(os.path.join(tmp_path, "results", "panel", "tiny", "table.md"))
    result = run_panel(str(tmp_path), TINY, "--table-only", "--curves")
    assert result.returncode == 0 and "(1 task)" in result.stdout, result.stderr
    for name in ("table.md", "curves.png"):
        assert os.path.isfile(os.path.join(tmp_path, "results", "panel", "tiny", name))


@pytest.mark.slow
@pytest.mark.parametrize(
    "text,flags,expected",
    [
        ("seeds: 0-1\nmemories: {trxl: []}\n", [], "lacks 'tasks'"),
        ("seeds: 0-1\nmemories: {trxl: []}\ntasks: {poc: {sets: []}}\n", [], "task 'poc' needs a config"),
        ("seeds: 0-1\nmemories: {trxl: []}\ntasks: {poc: {config: configs/nothing.yaml}}\n", [], "does not exist"),
        ("seeds: 0-1\nmemories: {trxl: []}\ntasks: {poc: {config: configs/poc_memory_env.yaml, steps: 3}}\n", [], "'steps'"),
        (TINY, ["--only=gru"], "--only 'gru' is no task, memory or task-memory pair"),
        (TINY + "variants: [gru]\n", [], "variants must list names of memories"),
        (TINY + "variants: [trxl, none]\n", [], "variants lists every memory"),
    ],
)
def test_bad_panel_is_refused(tmp_path: str, text: str, flags: list[str], expected: str) -> None:
    result = run_panel(str(tmp_path), text, *flags)
    assert result.returncode == 2 and expected in result.stderr


def test_shipped_panel_holds_the_issue_tasks_with_every_memory() -> None:
    shipped = panel.load_panel(os.path.join(ROOT, "configs", "panels", "memories.yaml"))
    assert {"trxl", "gru", "lstm", "none"} <= set(shipped["memories"])
    assert {"poc", "cartpole", "minigrid", "mmg1", "mmg3"} <= set(shipped["tasks"])
    assert sum(task.startswith("popgym") for task in shipped["tasks"]) >= 2


def test_a_reward_task_without_threshold_has_a_row(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reward metric has no steps-to-threshold unless the panel names a threshold.
    folder = os.path.join(tmp_path, "results", "panel", "p", "cartpole-gru")
    os.makedirs(folder)
    summary = {"metric": "reward", "finished_seeds": [], "per_seed": [], "failures": [], "command": "c",
               "final": {"iqm": 150.0, "ci_low": 140.0, "ci_high": 160.0, "per_seed": [150.0]},
               "steps_to_threshold": {"threshold": None}}  # fmt: skip
    with open(os.path.join(folder, "summary.json"), "w") as file:
        json.dump(summary, file)
    monkeypatch.chdir(tmp_path)
    entry = panel.row({"tasks": {"cartpole": {"config": "configs/cartpole.yaml"}}}, "p", "cartpole", "gru")
    assert entry["threshold"] is None and entry["reached"] is None and entry["iqm"] == 150.0
    assert "| cartpole | gru | reward |" in panel.table(panel.with_verdicts([entry]), "p")


def test_a_linked_run_may_differ_in_bookkeeping_only() -> None:
    # How often a run wrote its checkpoint does not change what it learned; any learning setting does.
    wanted = {"memory": "trxl", "checkpoint_interval": 10, "transformer": {"memory_length": 64}}
    assert panel.settings_differences({**wanted, "checkpoint_interval": 2}, wanted) == []
    other = {**wanted, "transformer": {"memory_length": 32}}
    assert panel.settings_differences(other, wanted) == ["transformer.memory_length: 32 there, 64 in the pair"]


@pytest.mark.slow
def test_a_pair_measured_before_is_linked_not_trained(tmp_path: str) -> None:
    # The no-memory pair of a first panel becomes the linked run of a second panel's same pair.
    assert run_panel(str(tmp_path), TINY, "--only=none").returncode == 0
    linked = TINY.replace("    sets:", "    runs: {none: panel/tiny/poc-none}\n    sets:")
    result = run_panel(str(tmp_path), linked, "--only=none", panel_id="second")
    assert result.returncode == 0, result.stderr
    assert "measured as results/panel/tiny/poc-none (runs): not trained here" in result.stdout
    assert not os.path.exists(os.path.join(tmp_path, "results", "panel", "second", "poc-none"))
    table = json.load(open(os.path.join(tmp_path, "results", "panel", "second", "table.json")))
    first = json.load(open(os.path.join(tmp_path, "results", "panel", "tiny", "table.json")))
    assert [row["experiment"] for row in table["rows"]] == ["panel/tiny/poc-none"]
    assert table["rows"][0]["iqm"] == first["rows"][0]["iqm"]
    # A linked run trained with other settings, or missing, is refused before anything trains.
    changed = linked.replace("eval_interval=0,", "eval_interval=0, gamma=0.9,")
    result = run_panel(str(tmp_path), changed, panel_id="third")
    assert result.returncode == 2 and "seed 0 was trained otherwise (gamma: 0.99 there, 0.9 in the pair)" in result.stderr
    other_evaluation = linked.replace("eval_episodes: 2", "eval_episodes: 3")
    result = run_panel(str(tmp_path), other_evaluation, panel_id="third")
    assert result.returncode == 2 and "evaluated on 2 episodes: the panel samples actions on 3" in result.stderr
    missing = TINY.replace("    sets:", "    runs: {none: nothing-here}\n    sets:")
    result = run_panel(str(tmp_path), missing, panel_id="third")
    assert result.returncode == 2 and "runs names 'nothing-here', which has no" in result.stderr
    assert not os.path.exists(os.path.join(tmp_path, "results", "panel", "third"))


@pytest.mark.slow
def test_a_pair_trained_with_other_settings_is_refused_until_the_panel_names_them(tmp_path: str) -> None:
    # As after a default changes: the trxl pair trained with warmup_updates 2, and trxl now means the default.
    default = TRANSFORMER_SCHEMA["warmup_updates"][1]
    assert default != 2
    old = TINY.replace("memories:", "sets: [transformer.warmup_updates=2]\nmemories:")
    assert run_panel(str(tmp_path), old, "--only=trxl").returncode == 0
    result = run_panel(str(tmp_path), TINY, "--table-only")
    assert result.returncode == 2
    assert (
        f"task 'poc', memory 'trxl': panel/tiny/poc-trxl, whose seed 0 was trained otherwise "
        f"(transformer.warmup_updates: 2 there, {default} in the pair)"
    ) in result.stderr
    # The pair under a memory that names what it trained, in the folder it trained in; trxl moves to its own.
    renamed = TINY.replace("  none:", "  trxl-old: [transformer.warmup_updates=2]\n  none:")
    renamed += "folders: {trxl-old: trxl, trxl: trxl-now}\n"
    result = run_panel(str(tmp_path), renamed, "--table-only")
    assert result.returncode == 0, result.stderr
    table = json.load(open(os.path.join(tmp_path, "results", "panel", "tiny", "table.json")))
    assert [(row["memory"], row["experiment"]) for row in table["rows"]] == [("trxl-old", "panel/tiny/poc-trxl")]
    assert panel.arguments(panel.load_panel(os.path.join(tmp_path, "panel.yaml")), "tiny", "poc", "trxl", 1, True)[2] == (
        "--run-id=panel/tiny/poc-trxl-now"
    )
    # Or the whole panel at the settings of its day.
    assert run_panel(str(tmp_path), old, "--table-only").returncode == 0
    shared = renamed.replace("trxl: trxl-now", "none: trxl")
    result = run_panel(str(tmp_path), shared, "--table-only")
    assert result.returncode == 2 and "two memories would share the folder 'trxl'" in result.stderr


def test_the_panels_sets_come_before_the_tasks_and_the_memorys() -> None:
    spec = {"sets": ["a=1"], "memories": {"m": ["c=3"]}, "tasks": {"t": {"sets": ["b=2"], "memory_sets": {"m": ["d=4"]}}}}
    assert panel.pair_sets(spec, "t", "m") == ["a=1", "b=2", "c=3", "d=4"]


def test_the_public_suite_holds_sixteen_tasks_whose_configs_build() -> None:
    suite = panel.load_panel(os.path.join(ROOT, "configs", "panels", "suite.yaml"))
    assert len(suite["tasks"]) == 16 and {"trxl", "lstm"} <= set(suite["memories"])
    for name, task in suite["tasks"].items():
        for sets in suite["memories"].values():
            overrides = parse_overrides([*task.get("sets", []), *sets])
            config = load_config(os.path.join(ROOT, task["config"]), overrides)  # builds each environment once
            assert config.environment["type"] in ("CartPole", "Gymnasium", "PettingZoo", "MiniGrid"), name


def test_a_record_from_before_a_changed_default_counts_with_the_value_it_had() -> None:
    # A TrXL record written before memory_gradients, query_position and positional_values has none of them: its run
    # had false, false and true (config.SAVED_DEFAULTS); today's defaults are true, true and false.
    recorded = small_config().to_dict()
    for key in ("memory_gradients", "query_position", "positional_values"):
        del recorded["transformer"][key]
    wanted = small_config({"memory_gradients": True, "query_position": True, "positional_values": False}).to_dict()
    differences = panel.settings_differences(recorded, wanted)
    assert {difference.split(":")[0] for difference in differences} == {
        "transformer.memory_gradients", "transformer.query_position", "transformer.positional_values"
    }  # fmt: skip


def test_each_row_is_judged_against_its_tasks_best_memory() -> None:
    def entry(task: str, memory: str, iqm: float, low: float) -> dict:
        return {"task": task, "memory": memory, "iqm": iqm, "ci": [low, iqm + 0.1]}

    rows = panel.with_verdicts([
        entry("a", "trxl", 0.95, 0.90), entry("a", "gru", 0.92, 0.80), entry("a", "none", 0.80, 0.70),
        entry("b", "trxl", -300.0, -350.0), entry("b", "gru", -200.0, -250.0), entry("b", "none", -210.0, -260.0),
        entry("c", "trxl", 0.5, 0.4),
    ])  # fmt: skip
    assert [row["versus_best"] for row in rows] == ["best", "in its CI", "-15.8%", "-50.0%", "best", "in its CI", "-"]
    counts = panel.tally(rows)
    assert counts["trxl"] == {"tasks": 2, "best_or_in_ci": 1, "within_10_percent": [], "short": ["b"]}
    assert counts["none"] == {"tasks": 2, "best_or_in_ci": 1, "within_10_percent": [], "short": ["a"]}
    near = panel.with_verdicts([entry("d", "trxl", 1.0, 0.99), entry("d", "lstm", 0.95, 0.9)])
    assert near[1]["versus_best"] == "-5.0%" and panel.tally(near)["lstm"]["within_10_percent"] == ["d"]


def test_a_variant_is_judged_against_the_memories_best_without_becoming_it() -> None:
    def entry(task: str, memory: str, iqm: float, low: float) -> dict:
        return {"task": task, "memory": memory, "iqm": iqm, "ci": [low, iqm + 0.01]}

    rows = [
        entry("a", "trxl", 0.90, 0.85), entry("a", "gru", 0.80, 0.70), entry("a", "trxl-post", 0.99, 0.98),
        entry("b", "trxl", 0.50, 0.45), entry("b", "gru", 0.60, 0.55), entry("b", "trxl-post", 0.545, 0.40),
    ]  # fmt: skip
    assert [row["versus_best"] for row in panel.with_verdicts(rows)] == [
        "-9.1%", "-19.2%", "best", "-16.7%", "best", "-9.2%"
    ]  # fmt: skip
    judged = panel.with_verdicts(rows, variants=["trxl-post"])
    assert [row["versus_best"] for row in judged] == ["best", "-11.1%", "best", "-16.7%", "best", "-9.2%"]
    counts = panel.tally(judged)
    assert counts["trxl"]["best_or_in_ci"] == 1 and counts["trxl-post"] == {
        "tasks": 2, "best_or_in_ci": 1, "within_10_percent": ["b"], "short": []
    }  # fmt: skip


def ci_row(task: str, memory: str, low: float, high: float) -> dict:
    """A row of the table with the interval [low, high] and its middle as the IQM."""
    return {"task": task, "memory": memory, "iqm": (low + high) / 2, "ci": [low, high]}


def test_a_task_tells_memories_apart_where_a_memorys_interval_lies_wholly_above_no_memorys() -> None:
    rows = panel.with_verdicts([
        ci_row("apart", "trxl", 0.8, 1.0), ci_row("apart", "gru", 0.3, 0.5), ci_row("apart", "none", 0.4, 0.6),
        ci_row("touching", "trxl", 0.6, 0.9), ci_row("touching", "none", 0.4, 0.6),
        ci_row("variant only", "trxl-post", 0.8, 0.9), ci_row("variant only", "none", 0.1, 0.2),
        ci_row("no control", "trxl", 0.1, 0.2),
    ], variants=["trxl-post"])  # fmt: skip
    assert panel.discriminating(rows, ["trxl-post"]) == {"apart": True, "touching": False}
    # a variant is never the memory another row falls under
    assert panel.clearly_below(rows, ["trxl-post"]) == {"gru": ["apart (under trxl)"], "none": ["apart (under trxl)"]}
    lines = panel.discrimination_lines(rows, ["trxl-post"])
    assert "1 of 2 (not: touching)" in lines[1]
    assert "- trxl: the best or inside the best one's interval on 1 of 1" in lines
    below = "- gru: the best or inside the best one's interval on 0 of 1; its interval wholly below another memory's on"
    assert f"{below} apart (under trxl)" in lines


def test_a_variant_is_compared_with_the_memory_it_varies_task_by_task() -> None:
    rows = panel.with_verdicts([
        ci_row("better", "trxl", 0.2, 0.4), ci_row("better", "trxl-bound", 0.5, 0.7), ci_row("better", "gru", 0.8, 0.9),
        ci_row("worse", "trxl", 0.5, 0.7), ci_row("worse", "trxl-bound", 0.2, 0.4),
        ci_row("touching", "trxl", 0.5, 0.7), ci_row("touching", "trxl-bound", 0.3, 0.5),
        ci_row("no base", "trxl-bound", 0.1, 0.2), ci_row("no base", "gru", 0.1, 0.2),
    ], variants=["trxl-bound"])  # fmt: skip
    # above trxl on "better" though below the task's best (the GRU): the comparison the best cannot give
    sides = {"above": ["better"], "below": ["worse"], "level": ["touching"]}
    assert panel.against_base(rows, ["trxl-bound"], "trxl") == {"trxl-bound": sides}
    assert panel.base_memory({"memories": {"gru": [], "trxl": [], "trxl-bound": []}, "variants": ["trxl-bound"]}) == "gru"
    assert panel.base_memory({"memories": {"trxl": [], "gru": []}}) is None
    lines = panel.base_lines(rows, ["trxl-bound"], "trxl")
    assert "- trxl-bound: above on better; below on worse; level on 1 of 3" in lines


def curve_summary(folder: str, level: float) -> None:
    os.makedirs(folder)
    curves = {"steps": [100, 200], "per_seed": {"0": [0.0, level]}, "iqm": [0.0, level], "ci_low": [0.0, level],
              "ci_high": [0.0, level]}  # fmt: skip
    with open(os.path.join(folder, "summary.json"), "w") as file:
        json.dump({"metric": "success", "curves": curves}, file)


def test_the_curves_hold_a_panel_of_axes_per_task_with_the_memories_that_are_not_variants(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lab import panel_curves

    monkeypatch.chdir(tmp_path)
    shipped = {"memories": {"trxl": [], "gru": [], "trxl-post": []}, "variants": ["trxl-post"],
               "tasks": {"poc": {}, "cue": {}, "unmeasured": {}}}  # fmt: skip
    rows = []
    for task, memory, level in [("cue", "gru", 0.5), ("poc", "trxl", 1.0), ("poc", "gru", 0.25), ("poc", "trxl-post", 0.75)]:
        curve_summary(os.path.join("results", "panel", "p", f"{task}-{memory}"), level)
        rows.append({"task": task, "memory": memory, "metric": "success", "threshold": 0.9 if task == "poc" else None,
                     "experiment": os.path.join("panel", "p", f"{task}-{memory}")})  # fmt: skip
    figure = panel_curves.panel_figure(shipped, "p", rows)
    poc, cue = [ax for ax in figure.axes if ax.get_visible()]  # the panel's order; no axes for a task without rows
    assert (poc.get_title(), cue.get_title()) == ("poc", "cue")
    ends = {line.get_label().split(" ")[0]: line.get_ydata()[-1] for line in poc.get_lines() if line.get_label()[0] != "_"}
    assert ends == {"trxl": 1.0, "gru": 0.25}  # the variant is not drawn; each memory its own curve
    assert [line.get_ydata()[0] for line in poc.get_lines() if line.get_label()[0] == "_"] == [0.9]  # the threshold
    assert [line.get_label().split(" ")[0] for line in cue.get_lines()] == ["gru"]
    assert panel_curves.draw_panel(shipped, "p", rows, "curves.png") == 2 and os.path.getsize("curves.png") > 0
    with pytest.raises(ValueError, match="no pair of trxl, gru has results"):
        panel_curves.panel_figure(shipped, "p", [row for row in rows if row["memory"] == "trxl-post"])
