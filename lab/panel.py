"""Benchmark panel: a named set of (task, memory) pairs, each trained over seeds with lab/experiment.py, gathered into one
leaderboard: results/panel/<id>/table.md and table.json.

Usage:
  python -m lab.panel [options]
  python -m lab.panel (-h | --help)

Options:
  --panel=<path>   Panel file: the tasks, the memories and the seeds; configs/panels/memories.yaml is the shipped
                   one (required).
  --id=<id>        Name of this panel's results: pair (task, memory) runs as experiment panel/<id>/<task>-<memory>
                   [default: main].
  --only=<names>   Comma-separated tasks, memories or task-memory pairs to run now; the table still holds every
                   pair that has results (default: all of them).
  --jobs=<n>       Seeds trained at a time within a pair (lab/experiment.py's --jobs) [default: 1].
  --table-only     Train nothing: write the table from the results there are.
  --curves         Also draw results/panel/<id>/curves.png: per task, the learning curves of the memories that are
                   not variants (IQM over the seeds with its 95% band; lab/panel_curves.py).
  --cpu            Train and evaluate on the CPU even where CUDA is available.
  -h --help        Show this help.

A panel file:

  seeds: 0-2                       # every pair's seeds (python -m lab.experiment --seeds)
  eval_episodes: 100               # unseen episodes per final model
  memories:                        # name: --set items that choose the memory
    trxl: []
    gru: [memory=gru]
    trxl-post: [transformer.layer_norm=post]
  variants: [trxl-post]            # memories that are ablations of another (optional): each row is judged
                                   # against the best of the other memories, which a variant never becomes, and
                                   # against the first memory listed that is not a variant (the one it varies)
  sets: [transformer.warmup_updates=0]  # --set items of every pair (optional): e.g. the defaults of the day a
                                   # panel was measured, so that its rows still name what they trained after a change
  folders: {trxl: trxl-bound}      # where a memory's pairs are stored, if not under its name (optional): here the
                                   # rows of trxl are those trained as trxl-bound (panel/<id>/<task>-trxl-bound)
  tasks:                           # name: its config, --set items for every memory, and per memory (optional)
    cartpole:
      config: configs/cartpole.yaml
      sets: [updates=75]
      threshold: 190               # steps-to-threshold level (default: 0.9 for success, none for reward)
      memory_sets: {gru: [recurrence.hidden_state_size=64]}
      runs: {trxl: ablations/cartpole/cartpole-trxl}  # pairs measured as an experiment (results/<id>), same settings

Pairs run one after the other, in the file's order (tasks, then memories); running the command again skips the
seeds that finished (lab/experiment.py's records) and resumes the rest, so a panel can be spread over several sessions.
The table has one row per pair: the final models' IQM over the seeds with its 95% bootstrap interval, the seeds that
reached the threshold and the IQM of their steps to it, and the median training minutes per seed (rollouts and
optimisation, from the logged steps per second). A pair named under `runs` is not trained: its row is that
experiment's, with its own seeds. The panel refuses any pair (linked or not) whose seeds' records were trained with
other settings than the pair's: after a default changes, its rows name the settings of their day (`sets`, or a memory
that sets the old values) or move to another memory's (`folders`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable

import numpy as np

from cli import parse_args
from config import ConfigError, load_config, parse_overrides, read_yaml, validate_config, with_saved_defaults
from lab import experiment, panel_curves, seeds
from lab.experiment_report import format_steps, format_value
from train import config_path

PANEL_DIR = os.path.join("results", "panel")


class PanelError(ValueError):
    """The panel file is missing or malformed."""


def load_panel(path: str) -> dict:
    """The panel file, checked: seeds, memories and tasks with existing configs."""
    panel = read_yaml(path, "panel file", " (configs/panels/memories.yaml is the shipped one)")
    keys = {"seeds", "eval_episodes", "memories", "variants", "tasks", "sets", "folders"}
    if not isinstance(panel, dict) or set(panel) - keys:
        raise PanelError(
            f"panel file '{path}': give the keys seeds, eval_episodes, memories, tasks and optionally variants, sets "
            "and folders (see --help)"
        )
    for key in ("seeds", "memories", "tasks"):
        if key not in panel:
            raise PanelError(f"panel file '{path}' lacks '{key}' (see --help)")
    experiment.parse_seeds(str(panel["seeds"]))
    if not isinstance(panel["memories"], dict) or not panel["memories"]:
        raise PanelError(f"panel file '{path}': memories must map names to lists of --set items, e.g. gru: [memory=gru]")
    if not isinstance(panel["tasks"], dict) or not panel["tasks"]:
        raise PanelError(f"panel file '{path}': tasks must map names to {{config: ..., sets: [...]}}")
    variants = panel.get("variants", [])
    if not isinstance(variants, list) or any(variant not in panel["memories"] for variant in variants):
        raise PanelError(f"panel file '{path}': variants must list names of memories, e.g. [trxl-post]; got {variants!r}")
    sets = panel.get("sets", [])
    if not isinstance(sets, list) or not all(isinstance(item, str) for item in sets):
        raise PanelError(f"panel file '{path}': sets must list --set items, e.g. [updates=50]; got {sets!r}")
    folders = panel.get("folders", {})
    if not isinstance(folders, dict) or any(memory not in panel["memories"] for memory in folders):
        raise PanelError(
            f"panel file '{path}': folders must map names of memories to folder names, e.g. {{trxl: trxl-bound}}; "
            f"got {folders!r}"
        )
    shared = [name for name, n in Counter(folders.get(m, m) for m in panel["memories"]).items() if n > 1]
    if shared:
        raise PanelError(
            f"panel file '{path}': two memories would share the folder '{shared[0]}' (folders, or a memory's own "
            "name): give each its own"
        )
    if set(panel["memories"]) <= set(variants):
        raise PanelError(f"panel file '{path}': variants lists every memory; leave at least one to judge against")
    for name, task in panel["tasks"].items():
        if not isinstance(task, dict) or "config" not in task:
            raise PanelError(f"panel file '{path}': task '{name}' needs a config, e.g. {{config: configs/cartpole.yaml}}")
        unknown = sorted(set(task) - {"config", "sets", "threshold", "memory_sets", "runs"})
        if unknown:
            raise PanelError(f"panel file '{path}': task '{name}' has the unknown key '{unknown[0]}'")
        if not os.path.isfile(config_path(task["config"])):
            raise PanelError(f"panel file '{path}': task '{name}': config '{task['config']}' does not exist")
        for memory in task.get("memory_sets", {}) or {}:
            if memory not in panel["memories"]:
                raise PanelError(f"panel file '{path}': task '{name}' sets memory '{memory}', which memories lacks")
        for memory, run_id in (task.get("runs", {}) or {}).items():
            if memory not in panel["memories"]:
                raise PanelError(f"panel file '{path}': task '{name}' runs memory '{memory}', which memories lacks")
            check_linked_run(panel, name, memory, run_id)
    return panel


def pair_sets(panel: dict, task: str, memory: str) -> list[str]:
    """The --set items of one pair: the panel's, the task's, then the memory's, then the task's for that memory."""
    spec = panel["tasks"][task]
    memory_sets = (spec.get("memory_sets", {}) or {}).get(memory, [])
    return [*panel.get("sets", []), *spec.get("sets", []), *panel["memories"][memory], *memory_sets]


def settings_differences(recorded: dict, wanted: dict, prefix: str = "") -> list[str]:
    """Keys whose value differs between a seed record's config and a pair's config, skipping the sections of the
    memories not in use and the bookkeeping keys. The keys a record lacks (added to the trainer since) count with
    the values its run had: ``config.with_saved_defaults`` where a default changed since, the default otherwise (the
    behaviour before); a key that is still missing counts as a difference."""
    if not prefix:
        try:
            recorded = validate_config(with_saved_defaults(recorded)).to_dict()
        except ConfigError:
            pass  # a record this version cannot read: its missing keys show as differences below
    in_use = {"trxl": "transformer", "gru": "recurrence", "lstm": "recurrence"}.get(wanted.get("memory"))
    skipped = ({"transformer", "recurrence"} - {in_use}) | seeds.BOOKKEEPING
    differences = []
    for key, value in wanted.items():
        if not prefix and key in skipped:
            continue
        if key not in recorded:
            differences.append(f"{prefix}{key}: absent there, {value!r} in the pair")
            continue
        if isinstance(value, dict) and isinstance(recorded[key], dict):
            differences += settings_differences(recorded[key], value, f"{prefix}{key}.")
        elif recorded[key] != value:
            differences.append(f"{prefix}{key}: {recorded[key]!r} there, {value!r} in the pair")
    return differences


def check_linked_run(panel: dict, task: str, memory: str, run_id: str) -> None:
    """A pair's linked experiment exists and each of its finished seeds was trained with the pair's settings."""
    folder = os.path.join(seeds.RESULTS_DIR, str(run_id))
    where = f"task '{task}', memory '{memory}': runs names '{run_id}'"
    if not os.path.isfile(os.path.join(folder, "summary.json")):
        raise PanelError(
            f"{where}, which has no {folder}/summary.json: run it with python -m lab.experiment or drop it from runs"
        )
    with open(os.path.join(folder, "summary.json")) as file:
        summary = json.load(file)
    finished, episodes = summary["finished_seeds"], panel.get("eval_episodes", 100)
    if summary["eval_episodes"] != episodes or summary.get("deterministic", False):
        raise PanelError(
            f"{where}, whose final models were evaluated on {summary['eval_episodes']} episodes"
            f"{' with their most likely actions' if summary.get('deterministic') else ''}: the panel samples actions "
            f"on {episodes}; link a run evaluated that way or drop it from runs"
        )
    check_records(panel, task, memory, folder, finished, where)


def check_records(panel: dict, task: str, memory: str, folder: str, finished: list[int], where: str) -> None:
    """Each finished seed's record in ``folder`` was trained with the pair's settings, or PanelError saying where."""
    if not finished:
        return
    config = load_config(config_path(panel["tasks"][task]["config"]), parse_overrides(pair_sets(panel, task, memory)))
    wanted = config.to_dict()
    for seed in finished:
        record = os.path.join(folder, f"seed-{seed}.json")
        if not os.path.isfile(record):  # a summary from before seed records: nothing to compare
            continue
        with open(record) as file:
            recorded = json.load(file)["config"]
        differences = settings_differences(recorded, wanted)
        if differences:
            raise PanelError(f"{where}, whose seed {seed} was trained otherwise ({'; '.join(differences[:3])})")


def linked_run(panel: dict, task: str, memory: str) -> str | None:
    return (panel["tasks"][task].get("runs", {}) or {}).get(memory)


def pair_run_id(panel: dict, panel_id: str, task: str, memory: str) -> str:
    """The experiment of a pair: its linked run, else panel/<id>/<task>-<folder>, where the folder is the memory's
    name unless ``folders`` names another (the memory's rows trained under another name, e.g. as a variant that
    became the defaults)."""
    folder = (panel.get("folders", {}) or {}).get(memory, memory)
    return linked_run(panel, task, memory) or f"panel/{panel_id}/{task}-{folder}"


def pairs(panel: dict) -> list[tuple[str, str]]:
    return [(task, memory) for task in panel["tasks"] for memory in panel["memories"]]


def selected(task: str, memory: str, only: list[str] | None) -> bool:
    return only is None or bool({task, memory, f"{task}-{memory}"} & set(only))


def arguments(panel: dict, panel_id: str, task: str, memory: str, jobs: int, cpu: bool) -> list[str]:
    """The arguments of ``python -m lab.experiment`` for one pair."""
    spec, sets = panel["tasks"][task], pair_sets(panel, task, memory)
    argv = [
        f"--config={spec['config']}",
        f"--seeds={panel['seeds']}",
        f"--run-id={pair_run_id(panel, panel_id, task, memory)}",
    ]
    argv += [f"--jobs={jobs}", f"--eval-episodes={panel.get('eval_episodes', 100)}", *[f"--set={s}" for s in sets]]
    if spec.get("threshold") is not None:
        argv.append(f"--threshold={spec['threshold']}")
    return argv + (["--cpu"] if cpu else [])


def row(panel: dict, panel_id: str, task: str, memory: str) -> dict | None:
    """One pair's entry of the table from its experiment's summary and seed records (its linked run's where it has
    one); None without a summary. PanelError where a seed's record was trained with other settings than the pair's
    (a default changed since, the panel file changed): its row would be another setting's under this name."""
    folder = os.path.join(seeds.RESULTS_DIR, pair_run_id(panel, panel_id, task, memory))
    path = os.path.join(folder, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        summary = json.load(file)
    where = f"task '{task}', memory '{memory}': {os.path.relpath(folder, seeds.RESULTS_DIR)}"
    check_records(panel, task, memory, folder, summary["finished_seeds"], where)
    seconds = []  # only what the records hold, so that the table is the same on every clone
    for seed in summary["finished_seeds"]:
        path = os.path.join(folder, f"seed-{seed}.json")
        if os.path.isfile(path):
            with open(path) as file:
                value = json.load(file).get("seconds")
            seconds += [] if value is None else [value]
    final, steps = summary["final"], summary["steps_to_threshold"]
    return {
        "task": task,
        "memory": memory,
        "metric": summary["metric"],
        "seeds": len(summary["finished_seeds"]),
        "iqm": final["iqm"],
        "ci": [final["ci_low"], final["ci_high"]],
        "per_seed": final["per_seed"],
        "threshold": steps["threshold"],  # None for a reward without --threshold: then nothing was counted
        "reached": steps.get("reached"),
        "steps_to_threshold_iqm": steps.get("iqm"),
        "env_steps": max(seed["env_steps"] for seed in summary["per_seed"]) if summary["per_seed"] else None,
        "seconds_per_seed": round(float(np.median(seconds)), 3) if seconds else None,
        "failures": len(summary["failures"]),
        "command": summary["command"],
        "experiment": os.path.relpath(folder, seeds.RESULTS_DIR),
    }


def with_verdicts(rows: list[dict], variants: Iterable[str] = ()) -> list[dict]:
    """The rows, each compared with its task's best IQM: ``gap_to_best``, its IQM's gap to the best one as a share of
    the best one's size (-0.042: 0.958x the best where both are positive, the same measure for a negative reward; None
    where the best IQM is 0), and ``versus_best``: "best" (ties included), "in its CI" where its IQM lies inside the
    interval of the task's first best row, else the gap in % ("-4.2%", or "below" without a gap); "-" for a task with
    one memory so far.

    The best is that of the memories not named in ``variants`` (ablations of another memory), so that adding a
    variant's rows does not change how the memories compare; a variant row is judged against that best, and is
    "best" itself where it is above it."""
    variants = set(variants)
    best: dict[str, dict] = {}
    for entry in rows:
        if entry["memory"] in variants:
            continue
        if entry["task"] not in best or entry["iqm"] > best[entry["task"]]["iqm"]:
            best[entry["task"]] = entry
    memories_per_task = Counter(entry["task"] for entry in rows)
    judged = []
    for entry in rows:
        top = best.get(entry["task"], entry)
        top = entry if entry["iqm"] > top["iqm"] else top
        gap = None if top["iqm"] == 0 else (entry["iqm"] - top["iqm"]) / abs(top["iqm"])
        if memories_per_task[entry["task"]] < 2:
            verdict = "-"
        elif entry["iqm"] == top["iqm"]:
            verdict = "best"
        elif entry["iqm"] >= top["ci"][0]:
            verdict = "in its CI"
        else:
            verdict = "below" if gap is None else f"{100 * gap:.1f}%"
        judged.append({**entry, "gap_to_best": gap, "versus_best": verdict})
    return judged


def tally(rows: list[dict]) -> dict[str, dict]:
    """Per memory, over the tasks with at least two memories (rows from ``with_verdicts``): how many it has, on how
    many it is the best or inside the best one's interval, on which it is within 10% of the best IQM (0.9x of it or
    more, for a positive metric) without being inside, and on which it falls short of both."""
    result: dict[str, dict] = {}
    for entry in rows:
        if entry["versus_best"] == "-":
            continue
        counts = result.setdefault(entry["memory"], {"tasks": 0, "best_or_in_ci": 0, "within_10_percent": [], "short": []})
        counts["tasks"] += 1
        if entry["versus_best"] in ("best", "in its CI"):
            counts["best_or_in_ci"] += 1
        elif entry["gap_to_best"] is not None and entry["gap_to_best"] >= -0.1:
            counts["within_10_percent"].append(entry["task"])
        else:
            counts["short"].append(entry["task"])
    return result


def discriminating(rows: list[dict], variants: Iterable[str] = (), control: str = "none") -> dict[str, bool]:
    """Per task with a ``control`` row (no memory) and another memory's (variants aside): whether the task tells
    memories apart, that is whether some memory's interval lies wholly above the control's."""
    variants = set(variants) | {control}
    controls = {entry["task"]: entry for entry in rows if entry["memory"] == control}
    result: dict[str, bool] = {}
    for entry in rows:
        if entry["memory"] in variants or entry["task"] not in controls:
            continue
        above = entry["ci"][0] > controls[entry["task"]]["ci"][1]
        result[entry["task"]] = result.get(entry["task"], False) or above
    return result


def clearly_below(rows: list[dict], variants: Iterable[str] = ()) -> dict[str, list[str]]:
    """Per memory, the tasks where its interval lies wholly below that of another memory (variants aside), as
    "task (under memory, ...)"."""
    variants = set(variants)
    result: dict[str, list[str]] = {}
    for entry in rows:
        under = [
            other["memory"] for other in rows
            if other["task"] == entry["task"] and other["memory"] not in variants and other["ci"][0] > entry["ci"][1]
        ]  # fmt: skip
        if under:
            result.setdefault(entry["memory"], []).append(f"{entry['task']} (under {', '.join(under)})")
    return result


def discrimination_lines(rows: list[dict], variants: Iterable[str] = ()) -> list[str]:
    """The table's lines on the tasks that tell memories apart (``discriminating``): which they are, and per memory
    on how many of them it is the best or inside the best one's interval, and where it is clearly below another."""
    tasks = discriminating(rows, variants)
    if not tasks:
        return []
    apart = [task for task, telling in tasks.items() if telling]
    rest = [task for task, telling in tasks.items() if not telling]
    lines = [
        "",
        f"Tasks that tell memories apart (some memory's interval wholly above no memory's): {len(apart)} of "
        f"{len(tasks)}" + (f" (not: {', '.join(rest)})" if rest else "") + ". On those:",
        "",
    ]
    below = clearly_below([entry for entry in rows if entry["task"] in apart], variants)
    for memory in dict.fromkeys(entry["memory"] for entry in rows if entry["task"] in apart):
        judged = [entry for entry in rows if entry["memory"] == memory and entry["task"] in apart]
        good = sum(entry["versus_best"] in ("best", "in its CI") for entry in judged)
        line = f"- {memory}: the best or inside the best one's interval on {good} of {len(judged)}"
        if below.get(memory):
            line += f"; its interval wholly below another memory's on {'; '.join(below[memory])}"
        lines.append(line)
    return lines


def against_base(rows: list[dict], variants: Iterable[str], base: str) -> dict[str, dict[str, list[str]]]:
    """Per variant, the tasks that have both its row and ``base``'s (the memory it varies), by how their intervals
    lie: "above" (the variant's wholly above the base's), "below" (wholly below) or "level" (they overlap). This is
    the question a candidate default asks (is it better anywhere, and worse nowhere?), which the comparison with each
    task's best memory does not answer."""
    bases = {entry["task"]: entry for entry in rows if entry["memory"] == base}
    result: dict[str, dict[str, list[str]]] = {}
    for entry in rows:
        if entry["memory"] not in variants or entry["task"] not in bases:
            continue
        other = bases[entry["task"]]
        side = "above" if entry["ci"][0] > other["ci"][1] else "below" if entry["ci"][1] < other["ci"][0] else "level"
        result.setdefault(entry["memory"], {"above": [], "below": [], "level": []})[side].append(entry["task"])
    return result


def base_lines(rows: list[dict], variants: Iterable[str], base: str | None) -> list[str]:
    """The table's lines on each variant against ``base`` (``against_base``)."""
    compared = against_base(rows, set(variants), base) if base else {}
    if not compared:
        return []
    lines = ["", f"Each variant against {base}, the memory it varies (its interval wholly above or below {base}'s):", ""]
    for variant, sides in compared.items():
        tasks = sum(len(names) for names in sides.values())
        line = f"- {variant}: above on {', '.join(sides['above']) or 'none'}; below on {', '.join(sides['below']) or 'none'}"
        lines.append(f"{line}; level on {len(sides['level'])} of {tasks}")
    return lines


def base_memory(panel: dict) -> str | None:
    """The memory that the panel's variants vary: its first memory that is not a variant."""
    variants = panel.get("variants", [])
    return next((memory for memory in panel["memories"] if memory not in variants), None) if variants else None


def table(rows: list[dict], panel_id: str, variants: Iterable[str] = (), base: str | None = None) -> str:
    """The leaderboard as markdown from rows compared with their task's best (``with_verdicts``): one row per pair,
    tasks in panel order, the best IQM of a task in bold, then the per-memory tally (``tally``)."""
    lines = [
        f"# Panel {panel_id}",
        "",
        "Final models on unseen episodes: IQM over the seeds with its 95% bootstrap interval. Versus the best: the "
        "task's best IQM, inside its interval, or the IQM's gap to it as a share of its size. Steps: the "
        "IQM over the seeds that reached the threshold of the first update whose training metric reached it. "
        "Minutes: median training time per seed (rollouts and optimisation).",
        "",
        "| task | memory | metric | seeds | final IQM [95% CI] | versus the best | reached threshold | steps to it "
        "| env steps | min/seed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in rows:
        low, high = (format_value(bound, entry["metric"]) for bound in entry["ci"])
        score = f"{format_value(entry['iqm'], entry['metric'])} [{low}, {high}]"
        score = f"**{score}**" if entry["versus_best"] == "best" else score
        threshold = "-" if entry["threshold"] is None else f"{entry['reached']} of {entry['seeds']} at {entry['threshold']:g}"
        steps = "-" if entry["steps_to_threshold_iqm"] is None else format_steps(entry["steps_to_threshold_iqm"])
        minutes = "-" if entry["seconds_per_seed"] is None else f"{entry['seconds_per_seed'] / 60:.1f}"
        lines.append(
            f"| {entry['task']} | {entry['memory']} | {entry['metric']} | {entry['seeds']} | {score} "
            f"| {entry['versus_best']} | {threshold} | {steps} "
            f"| {'-' if entry['env_steps'] is None else format_steps(entry['env_steps'])} | {minutes} |"
        )
    counts = tally(rows)
    if counts:
        lines += ["", "Per memory, on the tasks with results for two memories or more:", ""]
        for memory, count in counts.items():
            line = f"- {memory}: the best or inside the best one's interval on {count['best_or_in_ci']} of {count['tasks']}"
            near = count["within_10_percent"]
            if near:
                line += f"; within 10% of the best IQM on {len(near)} more ({', '.join(near)})"
            if count["short"]:
                line += f"; short of both on {', '.join(count['short'])}"
            lines.append(line)
    lines += discrimination_lines(rows, variants)
    lines += base_lines(rows, variants, base)
    return "\n".join(lines) + "\n"


def pair_rows(panel: dict, panel_id: str) -> list[dict]:
    """The table's entries of every pair that has results, in panel order, each compared with its task's best
    (``with_verdicts``)."""
    entries = [entry for task, memory in pairs(panel) if (entry := row(panel, panel_id, task, memory)) is not None]
    return with_verdicts(entries, panel.get("variants", []))


def panel_markdown(panel: dict, panel_id: str, rows: list[dict] | None = None) -> str:
    """table.md of a panel: its rows (default: ``pair_rows``) with the tallies its variants and base call for."""
    rows = pair_rows(panel, panel_id) if rows is None else rows
    return table(rows, panel_id, panel.get("variants", []), base_memory(panel))


def write_table(panel: dict, panel_id: str, rows: list[dict] | None = None) -> dict:
    """Write table.md and table.json from every pair's results (``rows``, default: ``pair_rows``); returns the JSON."""
    rows = pair_rows(panel, panel_id) if rows is None else rows
    folder = os.path.join(PANEL_DIR, panel_id)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "table.md"), "w") as file:
        file.write(panel_markdown(panel, panel_id, rows))
    result = {"panel": panel_id, "pairs": len(pairs(panel)), "with_results": len(rows), "rows": rows, "tally": tally(rows)}
    result["discriminating"] = discriminating(rows, panel.get("variants", []))
    if base := base_memory(panel):
        result["against_base"] = {"base": base, **against_base(rows, panel.get("variants", []), base)}
    with open(os.path.join(folder, "table.json"), "w") as file:
        json.dump(result, file, indent=1)
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.panel`` with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    if args["--panel"] is None:
        print(
            "error: --panel missing: python -m lab.panel --panel=configs/panels/memories.yaml (--help explains every flag)",
            file=sys.stderr,
        )
        return 2
    try:
        panel = load_panel(config_path(args["--panel"]))
        experiment.check_run_id(args["--id"])
        jobs = experiment.number(args, "--jobs", int, 1)
        only = [name.strip() for name in args["--only"].split(",")] if args["--only"] else None
        names = {name for pair in pairs(panel) for name in (*pair, "-".join(pair))}
        unknown = sorted(set(only or []) - names)
        if unknown:
            raise PanelError(f"--only '{unknown[0]}' is no task, memory or task-memory pair of the panel")
        rows = pair_rows(panel, args["--id"])  # a pair trained otherwise is refused now, not after hours of training
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = []
    if not args["--table-only"]:
        todo = [(task, memory) for task, memory in pairs(panel) if selected(task, memory, only)]
        for n, (task, memory) in enumerate(todo, 1):
            print(f"panel {args['--id']}: pair {n} of {len(todo)}: {task} with {memory}", flush=True)
            linked = linked_run(panel, task, memory)
            if linked:
                print(f"  measured as results/{linked} (runs): not trained here", flush=True)
                continue
            code = experiment.main(arguments(panel, args["--id"], task, memory, jobs, bool(args["--cpu"])))
            if code == 130:
                print("interrupted: run the same command again to continue the panel", file=sys.stderr)
                return 130
            if code != 0:
                failed.append(f"{task}-{memory}")
    result = write_table(panel, args["--id"], rows if args["--table-only"] else None)  # after training: read again
    print(f"table: {os.path.join(PANEL_DIR, args['--id'], 'table.md')}", flush=True)
    if args["--curves"]:
        path = os.path.join(PANEL_DIR, args["--id"], "curves.png")
        try:
            drawn = panel_curves.draw_panel(panel, args["--id"], result["rows"], path)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"curves: {path} ({drawn} task{'s' if drawn != 1 else ''})", flush=True)
    print(json.dumps({key: result[key] for key in ("panel", "pairs", "with_results")} | {"failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
