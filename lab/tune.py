"""Hyperparameter search with Optuna: every trial trains a config with some keys sampled, over a few seeds, through
train.py itself, and is scored by a robust multi-seed score of its training curves.

Usage:
  python -m lab.tune [options] [--set=<key=value>]...
  python -m lab.tune (-h | --help)

Options:
  --config=<path>      Base YAML config of every trial (required).
  --search=<path>      Search file: the config keys to sample and their ranges or choices, as below (required).
  --study=<id>         Name of the study: results/tune/<id>/ holds its SQLite database and its report (required).
  --trials=<n>         Trials the study should hold; running the command again continues an interrupted study
                       up to this many [default: 20].
  --seeds=<k>          Seeds per trial, 0 .. k-1, the same for every trial [default: 2].
  --jobs=<n>           Trials at a time [default: 1].
  --threads=<n>        torch threads of each seed's train.py (default: the cores that the load leaves free when the
                       study starts, shared among its jobs x seeds trainings, at least 1 each: train.py's rule).
  --objective=<kind>   "auc": the mean of the per-update metric over the whole run (fast and stable both count);
                       "final": its mean over the last quarter of the updates [default: auc].
  --warmup=<fraction>  Share of the updates before the pruner may stop a trial; 1: no pruning; "final" starts at 1,
                       as its early curve does not tell the end (default: 0.25 with "auc", 1 with "final").
  --set=<key=value>    Override a config key in every trial, as in train.py (repeatable).
  --cpu                Train on the CPU even where CUDA is available.
  --force-continue     Continue a study whose resolved config (--config and --set with the defaults of the time),
                       device, --seeds, --objective or search file differ from those it was started with (refused
                       otherwise: its earlier scores were measured under those).
  -h --help            Show this help.

A search file maps config keys (dotted, as --set writes them) to a range or a list of choices:

  learning_rate_schedule.initial: {low: 1.0e-4, high: 1.0e-3, log: true}   # a float, sampled on a log scale
  transformer.num_blocks: {low: 1, high: 4}                                 # an integer (both ends integers)
  transformer.memory_gradients: {choices: [true, false]}

The metric of an update is the success rate of its finished episodes where the task reports one, else their mean
reward. A trial's score is the interquartile mean over its seeds of each seed's objective. A new study's first
trial is the base config as it is (where its values lie in the search space). A study records the settings it was
started with (the resolved base config: its --sets and every default filled in; the device; --seeds, --objective and
the search space); running its id again with others is refused, naming each difference, unless --force-continue is
given. TPE samples the keys; a median pruner stops a trial whose running score (the objective of the updates so far)
falls below the median of earlier trials at the same update. Values sampled again (TPE does, in a small space of
choices) are not trained again: the trial takes the earlier trial's score, or is pruned as it was. Trials skip the
periodic evaluations (eval_interval 0) unless --set says otherwise. Seed k of trial n trains as run
tune/<id>/trial-n/seed-k (models/ and summaries/ as for train.py).

While a trial trains, a line per update gives each seed's metric and the trial's running score; each seed's console
output goes to models/tune/<id>/trial-n/seed-k.log line by line.

Ctrl-C or SIGTERM stops a study within seconds: the running seeds are killed (their trials are trained again from the
start on the next invocation, which continues the study); a seed that crashes fails its trial at once.

At the end: results/tune/<id>/best.yaml (the base config with the best trial's values, a standalone config with
the base config's own updates and eval_interval, not the search's budget, which a comment names), trials.md (the
best trials), importance.png (each key's importance for the score, by Optuna's default evaluator; marked as a rough
guess below MIN_IMPORTANCE_TRIALS finished trials) and summary.json, whose content is also the last line printed.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import optuna
import torch
import yaml

from cli import ROOT, parse_args
from config import ConfigError, apply_overrides, flatten, parse_overrides, read_yaml, validate_config, with_saved_defaults
from evaluation import interquartile_mean
from lab.experiment import check_run_id, number
from lab.seeds import child_environment
from train import config_path, default_threads

TRAIN = os.path.join(ROOT, "train.py")
TUNE_DIR = os.path.join("results", "tune")
LINE = re.compile(r"^update\s+(\d+)/\d+\s")  # summaries.console_line
METRIC = re.compile(r"\s(reward|success)\s+(-?[\d.]+)")
STOP_SECONDS = 60  # how long a stopped seed may take to save before it is killed
TOP_TRIALS = 10  # rows of trials.md
# Fewer finished trials than this make the importances a rough guess: Optuna's default evaluator (fANOVA) fits a random
# forest to the trials' values and scores, and on a handful of points one lucky trial decides the ranking.
MIN_IMPORTANCE_TRIALS = 10
# Keys that set a trial's budget rather than what it learns: best.yaml keeps the base config's own (the trials train
# with the study's --set updates=..., and without the periodic evaluations, eval_interval 0).
BUDGET_KEYS = ("updates", "eval_interval")
STOPPING = threading.Event()  # set on Ctrl-C/SIGTERM: trials running in worker threads (--jobs > 1) stop their seeds
POLL_SECONDS = 0.2
# A seed's train.py runs in a process group of its own (a terminal's Ctrl-C reaches tune.py alone, which stops it), so
# a SIGKILL of tune.py would not reach it: this starts it in place of itself (execv keeps the pid) after asking Linux to
# SIGKILL it when the thread that started it ends (PR_SET_PDEATHSIG, prctl option 1), or at once where that thread
# ended already.
GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])"
)


class SearchError(ValueError):
    """The search file is missing, malformed or names a key the config does not take."""


class SettingsError(ValueError):
    """A study is continued with other settings than it was started with."""


def read_mapping(path: str, what: str, example: str) -> dict:
    """A YAML file that must hold a non-empty mapping (``example`` shows one in the error)."""
    raw = read_yaml(path, what)
    if not isinstance(raw, dict) or not raw:
        raise SearchError(f"{what} '{path}' must be a mapping, e.g. {example}")
    return raw


def load_search(path: str, base: dict) -> dict[str, dict]:
    """The search space of ``path``, checked: every spec is a range or a list of choices, and every value it can take
    (both ends of a range, each choice) gives a valid config on top of ``base`` (the raw config with --set)."""
    space = read_mapping(path, "search file", "'learning_rate_schedule.initial: {low: 1e-4, high: 1e-3}'")
    for key, spec in space.items():
        where = f"search file '{path}', key '{key}'"
        if not isinstance(spec, dict) or not spec:
            raise SearchError(f"{where}: give {{low: a, high: b}} (optionally log: true, step: s) or {{choices: [...]}}")
        unknown = sorted(set(spec) - {"low", "high", "log", "step", "choices"})
        if unknown:
            raise SearchError(f"{where}: unknown field '{unknown[0]}' (use low, high, log, step or choices)")
        if "choices" in spec:
            if set(spec) != {"choices"} or not isinstance(spec["choices"], list) or not spec["choices"]:
                raise SearchError(f"{where}: choices must be a non-empty list, alone, e.g. {{choices: [true, false]}}")
            values = spec["choices"]
        else:
            low, high = spec.get("low"), spec.get("high")
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high))
            if not numeric or not low < high:
                raise SearchError(f"{where}: a range needs numbers low < high, got low {low!r}, high {high!r}")
            if spec.get("log") and low <= 0:
                raise SearchError(f"{where}: a log range needs low > 0, got {low!r}")
            values = [low, high]
        for value in values:
            try:
                validate_config(apply_overrides(base, {key: value}))
            except ConfigError as error:
                raise SearchError(f"{where}: the value {value!r} does not give a valid config: {error}") from None
    return space


def sample(trial: optuna.Trial, space: dict[str, dict]) -> dict[str, object]:
    """The trial's value of every searched key."""
    values = {}
    for key, spec in space.items():
        if "choices" in spec:
            values[key] = trial.suggest_categorical(key, spec["choices"])
        elif all(isinstance(spec[end], int) for end in ("low", "high")):
            values[key] = trial.suggest_int(
                key, spec["low"], spec["high"], step=spec.get("step", 1), log=spec.get("log", False)
            )
        else:
            values[key] = trial.suggest_float(
                key, spec["low"], spec["high"], step=spec.get("step"), log=spec.get("log", False)
            )
    return values


def base_values(base: dict, space: dict[str, dict]) -> dict[str, object] | None:
    """The base config's own value of every searched key (defaults included), or None where one lies outside the
    search space (not among a key's choices, or beyond its range)."""
    config = validate_config(base).to_dict()
    values = {}
    for key, spec in space.items():
        value = config
        for part in key.split("."):
            value = value[part]
        if "choices" in spec:
            inside = value in spec["choices"]
        else:
            integers = all(isinstance(spec[end], int) for end in ("low", "high"))
            number = isinstance(value, int if integers else int | float) and not isinstance(value, bool)
            inside = number and spec["low"] <= value <= spec["high"]
        if not inside:
            return None
        values[key] = value
    return values


def parse_line(line: str) -> tuple[int, float | None] | None:
    """(update, metric) of a train.py console line: the success rate, else the mean reward, None where no episode
    ended; None for other lines."""
    match = LINE.match(line.strip())
    if not match:
        return None
    metrics = dict(METRIC.findall(line))
    metric = metrics.get("success", metrics.get("reward"))
    return int(match.group(1)), None if metric is None else float(metric)


def score(curve: list[float], objective: str) -> float:
    """A seed's objective from its per-update metric: the whole curve's mean (auc) or its last quarter's (final)."""
    values = curve if objective == "auc" else curve[len(curve) - max(1, len(curve) // 4) :]
    return float(np.mean(values)) if values else float("nan")


class SeedRun:
    """One seed of a trial: a train.py child whose console lines give the per-update metric."""

    def __init__(self, arguments: list[str], threads: int, log_path: str) -> None:
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        if sys.platform == "linux":
            arguments = [sys.executable, "-c", GUARD, str(os.getpid()), *arguments]
        self.curve: list[float] = []  # the metric of updates 1 .. len(curve) (the last known value where none ended)
        self.tail = ""
        self.log_path = log_path
        self.process = subprocess.Popen(
            arguments, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env=child_environment(threads), process_group=0,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()  # a long trial's log is read while it trains
                if line.strip():
                    self.tail = line.strip()
                parsed = parse_line(line)
                if parsed is not None:
                    metric = parsed[1] if parsed[1] is not None else (self.curve[-1] if self.curve else 0.0)
                    self.curve.append(metric)

    def stop(self) -> None:
        """Ask the child to stop (it saves its checkpoint); kill it if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(timeout=10)

    def kill(self) -> None:
        """Kill the child and its environment workers at once: a stopped study retrains its trial from the start, so
        the child's checkpoint is of no use, and a scheduler's SIGKILL follows its SIGTERM within seconds."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass
        self.process.wait()
        self.reader.join(timeout=10)

    def crashed(self) -> bool:
        """Whether the child ended with an error (its siblings then need not train on)."""
        return self.process.poll() not in (None, 0)


class Study:
    """A study's files, settings and objective."""

    def __init__(self, args: dict, base: dict, space: dict[str, dict], path: str, raw: dict | None = None) -> None:
        """``base``: the config of every trial (the file with --set and the search's budget); ``raw``: the file's own
        mapping, whose budget (BUDGET_KEYS) best.yaml keeps (default: ``base``)."""
        self.id = args["--study"]
        self.folder = os.path.join(TUNE_DIR, self.id)
        self.path, self.base, self.space = path, base, space
        self.raw = base if raw is None else raw
        self.sets = list(args["--set"])
        self.seeds = number(args, "--seeds", int, 1)
        self.jobs = number(args, "--jobs", int, 1)
        self.trials = number(args, "--trials", int, 1)
        self.objective = args["--objective"]
        if self.objective not in ("auc", "final"):
            raise ValueError(f"--objective must be auc or final, got '{self.objective}'")
        if args["--warmup"] is None:  # "final" is decided at the end: a slow starter must not be pruned
            self.warmup = 0.25 if self.objective == "auc" else 1.0
        else:
            self.warmup = number(args, "--warmup", float, 0)
        self.cpu = bool(args["--cpu"])
        self.device = "cuda" if torch.cuda.is_available() and not self.cpu else "cpu"  # as train.py chooses
        self.updates = validate_config(base).updates
        if args["--threads"] is None:
            self.threads = default_threads(self.jobs * self.seeds)
        else:
            self.threads = number(args, "--threads", int, 1)

    def command(self, trial: int, seed: int, values: dict[str, object]) -> list[str]:
        sets = [f"--set={key}={json.dumps(value)}" for key, value in values.items()]
        return [
            sys.executable, TRAIN, f"--config={self.path}", f"--run-id=tune/{self.id}/trial-{trial}/seed-{seed}",
            f"--seed={seed}", "--overwrite", *[f"--set={s}" for s in self.sets], *sets, *(["--cpu"] if self.cpu else []),
        ]  # fmt: skip

    def __call__(self, trial: optuna.Trial) -> float:
        """Train the trial's seeds side by side, report the running score after each update all of them finished, and
        return the IQM over the seeds of their objective."""
        values = sample(trial, self.space)
        try:
            validate_config(apply_overrides(self.base, values))
        except ConfigError as error:  # a combination of values the config refuses (e.g. embed_dim vs num_heads)
            trial.set_user_attr("error", str(error))
            raise optuna.TrialPruned(f"config error: {error}") from None
        earlier = scored_before(trial)
        if earlier is not None:  # TPE samples a small discrete space again: its seeds would train the same curves
            trial.set_user_attr("repeat_of", earlier.number)
            if earlier.state == optuna.trial.TrialState.PRUNED:
                raise optuna.TrialPruned(f"the values of trial {earlier.number}, pruned then: not trained again")
            trial.set_user_attr("per_seed", earlier.user_attrs.get("per_seed", []))
            print(f"trial {trial.number}: {earlier.value:.4f}, the values of trial {earlier.number}: not trained again",
                  flush=True)  # fmt: skip
            return earlier.value
        if STOPPING.is_set():  # interrupted while this trial was being sampled: start nothing
            trial.set_user_attr("interrupted", True)
            raise KeyboardInterrupt
        trial.set_user_attr("owner", owner())
        logs = os.path.join("models", "tune", self.id, f"trial-{trial.number}")
        runs = [
            SeedRun(self.command(trial.number, k, values), self.threads, os.path.join(logs, f"seed-{k}.log"))
            for k in range(self.seeds)
        ]
        print(f"trial {trial.number}: started {self.seeds} seeds: {json.dumps(values)}", flush=True)
        started, reported = time.time(), 0
        try:
            while any(run.reader.is_alive() for run in runs) or min(len(run.curve) for run in runs) > reported:
                time.sleep(POLL_SECONDS)
                if STOPPING.is_set():  # the main thread was interrupted while this trial ran in a worker thread
                    raise KeyboardInterrupt
                crashed = [k for k, run in enumerate(runs) if run.crashed()]
                if crashed:  # the trial fails now, not when its other seeds have trained to the end
                    raise RuntimeError(failure(crashed[0], runs[crashed[0]]))
                done = min(len(run.curve) for run in runs)
                if done > reported:
                    for update in range(reported + 1, done + 1):  # several where the seeds ran ahead of this loop
                        self.progress(trial, runs, update)
                    reported = done
                    if done < self.updates and trial.should_prune():
                        raise optuna.TrialPruned(f"pruned at update {done}")
        except BaseException as error:
            stop = SeedRun.stop if isinstance(error, optuna.TrialPruned) else SeedRun.kill  # a pruned trial's seeds save
            for run in runs:
                stop(run)
            if isinstance(error, optuna.TrialPruned):
                print(f"trial {trial.number}: {error}", flush=True)
            elif isinstance(error, KeyboardInterrupt):
                trial.set_user_attr("interrupted", True)
            raise
        for run in runs:
            run.process.wait()
            run.reader.join(timeout=10)
        failed = [(k, run) for k, run in enumerate(runs) if run.process.returncode != 0 or len(run.curve) < self.updates]
        if failed:
            raise RuntimeError(failure(*failed[0]))
        per_seed = [score(run.curve, self.objective) for run in runs]
        trial.set_user_attr("per_seed", per_seed)
        trial.set_user_attr("seconds", round(time.time() - started))
        value = interquartile_mean(per_seed)
        print(f"trial {trial.number}: {value:.4f} (seeds {', '.join(f'{v:.3f}' for v in per_seed)})", flush=True)
        return value

    def progress(self, trial: optuna.Trial, runs: list[SeedRun], update: int) -> None:
        """Report the running score after ``update`` (which every seed finished) to the pruner, and print it with each
        seed's metric."""
        running = interquartile_mean([score(run.curve[:update], self.objective) for run in runs])
        seeds = ", ".join(f"{run.curve[update - 1]:.3f}" for run in runs)
        print(f"trial {trial.number}: update {update}/{self.updates}: seeds {seeds}, running score {running:.4f}", flush=True)
        trial.report(running, update)


# What a study records since 2026-12-07 besides the raw config: those recorded before lack them, and take the current.
RECORDED_SINCE = ("resolved", "device")


def recorded_settings(settings: Study) -> dict:
    """What makes a study's scores comparable, as JSON (the form they are stored in): the resolved base config (the
    file with its --sets and every default of this version filled in: a default that changes between two invocations
    changes the trials as much as a --set), the device the seeds train on, the seeds, the objective and the search
    space; also the file's path, its --sets and the raw config, which the messages name."""
    recorded = {"config": settings.path, "sets": settings.sets, "base": settings.base,
                "resolved": validate_config(settings.base).to_dict(), "device": settings.device, "seeds": settings.seeds,
                "objective": settings.objective, "search": settings.space}  # fmt: skip
    return json.loads(json.dumps(recorded))


def settings_differences(then: dict, now: dict) -> list[str]:
    """Each way the settings ``now`` differ from those a study was started with (``then``), as a line for an error.
    The config's path alone does not count: the same config moved gives the same trials. Settings recorded before
    the resolved config was are compared by their raw config."""
    differences = []
    if "resolved" in then:
        old_config, new_config = completed(then["resolved"]), now["resolved"]
    else:
        old_config, new_config = then["base"], now["base"]
    for what, old, new in (("config key", flatten(old_config), flatten(new_config)),
                           ("search key", then["search"], now["search"])):  # fmt: skip
        for key in sorted(set(old) | set(new)):
            if old.get(key, "absent") != new.get(key, "absent"):
                differences.append(f"{what} '{key}': {old.get(key, 'absent')!r} then, {new.get(key, 'absent')!r} now")
    if differences and (then["config"], then["sets"]) != (now["config"], now["sets"]):
        differences.insert(
            0, f"config '{then['config']}' with --set {then['sets']} then, '{now['config']}' with --set {now['sets']} now"
        )
    if "device" in then and then["device"] != now["device"]:
        differences.append(f"device: {then['device']!r} then, {now['device']!r} now (--cpu, or a machine without CUDA)")
    for flag in ("seeds", "objective"):
        if then[flag] != now[flag]:
            differences.append(f"--{flag}: {then[flag]!r} then, {now[flag]!r} now")
    return differences


def completed(resolved: dict) -> dict:
    """A config resolved by an earlier version, with the keys added since: those whose default changed what a run
    does (config.SAVED_DEFAULTS) as the runs before them did, the others at their default, which does not."""
    try:
        return validate_config(with_saved_defaults(resolved)).to_dict()
    except ConfigError:  # a key since removed or renamed: compared as it was, it shows as a difference
        return resolved


def check_settings(study: optuna.Study, settings: Study, force: bool) -> None:
    """Record a new study's settings; refuse to continue a study under other settings (``SettingsError``) unless
    ``force``, which records the new settings and when they changed. A study from before settings were recorded
    takes the current ones; one from before the resolved config and the device were (RECORDED_SINCE) is checked by
    what it recorded, and takes the current ones of the rest."""
    now = recorded_settings(settings)
    then = study.user_attrs.get("settings")
    if then is None:
        if study.get_trials(deepcopy=False):
            print(f"study {settings.id} holds no record of its settings (started before they were recorded): "
                  "recording the current ones", flush=True)  # fmt: skip
        study.set_user_attr("settings", now)
        return
    differences = settings_differences(then, now)
    if not differences:
        missing = [key for key in RECORDED_SINCE if key not in then]
        if missing:
            print(f"study {settings.id} recorded no {' and no '.join(missing)} (started before they were recorded): "
                  "recording the current ones", flush=True)  # fmt: skip
            study.set_user_attr("settings", now)
        return
    if not force:
        raise SettingsError(
            f"study '{settings.id}' was started with other settings, and its {len(study.get_trials(deepcopy=False))} "
            "trials were scored under them:\n  " + "\n  ".join(differences) + "\nrun the study's own settings to "
            "continue it, give these a new study (--study=<new id>), or add --force-continue to continue it anyway "
            "(its earlier scores then mix with the new ones)"
        )
    forced = study.user_attrs.get("forced_continue", [])
    forced.append({"after_trials": len(study.get_trials(deepcopy=False)), "differences": differences})
    study.set_user_attr("forced_continue", forced)
    study.set_user_attr("settings", now)
    print(f"study {settings.id} continues under other settings (--force-continue): " + "; ".join(differences), flush=True)


def failure(k: int, run: SeedRun) -> str:
    """Why seed ``k`` failed, for the trial's error: its exit code and last line, and where its log is."""
    run.reader.join(timeout=10)  # its last lines
    return f"seed {k} failed (exit code {run.process.returncode}): {run.tail} (log {run.log_path})"


def owner() -> dict:
    """The process running a trial, so that another tune.py on the same study can tell a live trial from one left
    running by a killed process."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def owner_alive(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the process that runs ``trial`` lives (another tune.py on this study); a trial of another machine
    counts as alive, since its process cannot be checked from here."""
    running = trial.user_attrs.get("owner")
    if running is None or running["pid"] == os.getpid():
        return False
    if running["host"] != socket.gethostname():
        return True
    try:
        os.kill(running["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid
        return True
    return True


def scored_before(trial: optuna.Trial) -> optuna.trial.FrozenTrial | None:
    """The first finished or pruned trial of the study with the same values as ``trial`` (never itself a repeat), or
    None. Every trial trains the same seeds, so on the CPU the same values train the same curves, bit for bit."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for other in trial.study.get_trials(deepcopy=False, states=states):
        if other.number < trial.number and other.params == trial.params:
            return other
    return None


def requeue_unfinished(study: optuna.Study) -> int:
    """Trials left running by a killed process, or interrupted, are failed and their values queued again (once), the
    base config's still marked as such. Trials that another live tune.py runs are left to it."""
    count = 0
    for trial in study.get_trials(deepcopy=False):
        running = trial.state == optuna.trial.TrialState.RUNNING and not owner_alive(trial)
        interrupted = trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs.get("interrupted")
        if (running or interrupted) and not study.user_attrs.get(f"requeued-{trial.number}"):
            if running:
                study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            study.enqueue_trial(
                trial.params, user_attrs={"base": True} if trial.user_attrs.get("base") else None, skip_if_exists=False
            )
            study.set_user_attr(f"requeued-{trial.number}", True)
            count += 1
    return count


def one_ask_at_a_time(study: optuna.Study) -> None:
    """Serialise ``study.ask`` within this process. Optuna takes a queued trial (the base config's, or one queued
    again) by reading it as waiting and then marking it running; on SQLite, which has no row locks, two threads of
    ``--jobs`` > 1 can both read it waiting and both run it: seen as the base config's trial 0 started twice, its seeds
    training into the same folders, and one trial fewer in the study. ``study.optimize`` asks through the instance's
    attribute, so wrapping it here covers its worker threads."""
    ask, lock = study.ask, threading.Lock()

    def locked_ask(*args: object, **kwargs: object) -> optuna.Trial:
        with lock:
            return ask(*args, **kwargs)

    study.ask = locked_ask


def mark_interrupted(study: optuna.Study) -> None:
    """This process's trials still running after an interrupt (a worker thread that had not reached its handler), failed
    and marked interrupted, so that the next invocation queues them again without waiting for them to look dead."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.user_attrs.get("owner") == owner():
            study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)


def counted(study: optuna.Study) -> int:
    """Trials that count towards --trials: finished or pruned."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def report(study: optuna.Study, settings: Study) -> dict:
    """Write best.yaml, trials.md, importance.png and summary.json; returns the summary."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    states = {state.name.lower(): 0 for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                                                   optuna.trial.TrialState.FAIL)}  # fmt: skip
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name.lower() in states:
            states[trial.state.name.lower()] += 1
    summary = {"study": settings.id, "config": settings.path, "sets": settings.sets, "objective": settings.objective,
               "seeds": settings.seeds, "trials": states, "best": None,
               "forced_continue": study.user_attrs.get("forced_continue", [])}  # fmt: skip
    if not complete:
        return summary
    best = max(complete, key=lambda trial: trial.value)
    best_path = os.path.join(settings.folder, "best.yaml")
    config = best_config(settings, best.params)
    with open(best_path, "w") as file:
        file.write(
            f"# Best trial ({best.number}) of study {settings.id}: score {best.value:.4f} ({settings.objective}, IQM over "
            f"{settings.seeds} seeds), from {settings.path} with {', '.join(settings.sets) or 'no --set'}.\n"
            f"# Searched: {', '.join(settings.space)}. Report: {settings.folder}/trials.md\n"
            f"# {budget_note(settings, config)}\n"
        )
        for change in study.user_attrs.get("forced_continue", []):
            file.write(f"# Continued under other settings (--force-continue) after {change['after_trials']} trials, "
                       f"scored before under: {'; '.join(change['differences'])}\n")  # fmt: skip
        yaml.safe_dump(config, file, sort_keys=False)
    firsts = {}  # each set of values once, as first scored (studies before 2026-12-03 trained repeats again)
    for trial in complete:
        firsts.setdefault(json.dumps(trial.params, sort_keys=True), trial)
    distinct = list(firsts.values())
    rows = sorted(distinct, key=lambda trial: trial.value, reverse=True)[:TOP_TRIALS]
    repeats = len(complete) - len(distinct)
    lines = [
        f"# Study {settings.id}: the best {len(rows)} of {len(distinct)} finished trials"
        + (f" ({repeats} more trials repeated values scored before)" if repeats else ""),
        "",
        f"Objective: {settings.objective} of the per-update metric, IQM over seeds 0-{settings.seeds - 1}. Trials: {states}.",
        "",
        "| trial | score | per seed | minutes | " + " | ".join(settings.space) + " |",
        "|---" * (4 + len(settings.space)) + "|",
    ]
    for trial in rows:
        per_seed = ", ".join(f"{v:.3f}" for v in trial.user_attrs.get("per_seed", []))
        params = " | ".join(shown(trial.params.get(key, "")) for key in settings.space)
        number = f"{trial.number} (base config)" if trial.user_attrs.get("base") else str(trial.number)
        lines.append(
            f"| {number} | {trial.value:.4f} | {per_seed} | {trial.user_attrs.get('seconds', 0) / 60:.1f} | {params} |"
        )
    importances = importance_figure(study, os.path.join(settings.folder, "importance.png"))
    summary["importance_warning"] = importance_warning(len(distinct)) if importances is not None else None
    if summary["importance_warning"]:
        lines += ["", f"Importance (importance.png, summary.json): {summary['importance_warning']}."]
        print(f"warning: importance: {summary['importance_warning']}", flush=True)
    with open(os.path.join(settings.folder, "trials.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    summary["best"] = {"trial": best.number, "score": best.value, "params": best.params, "config": best_path}
    base = [trial for trial in study.get_trials(deepcopy=False) if trial.user_attrs.get("base")]
    summary["base"] = {"trial": base[0].number, "state": base[0].state.name.lower(), "score": base[0].value} if base else None
    summary["importance"] = importances
    return summary


def best_config(settings: Study, params: dict[str, object]) -> dict:
    """The config to train with the values ``params`` of a trial: the base config with its --sets and ``params``,
    but with the config file's own budget (each of BUDGET_KEYS as the file says, or its default), not the search's."""
    config = copy.deepcopy(settings.base)
    for key in BUDGET_KEYS:
        if key in settings.raw:
            config[key] = settings.raw[key]
        else:
            config.pop(key, None)
    return apply_overrides(config, params)


def budget_note(settings: Study, config: dict) -> str:
    """A line for best.yaml: the budget the trials trained with, and the one ``config`` keeps."""
    trials, kept = validate_config(settings.base).to_dict(), validate_config(config).to_dict()
    return (
        f"The trials trained with {', '.join(f'{key} {trials[key]}' for key in BUDGET_KEYS)} (the search's budget); this "
        f"config keeps {settings.path}'s own: {', '.join(f'{key} {kept[key]}' for key in BUDGET_KEYS)}."
    )


def importance_warning(trials: int) -> str | None:
    """What to say of importances computed from ``trials`` finished trials (distinct values): None from
    MIN_IMPORTANCE_TRIALS on."""
    if trials >= MIN_IMPORTANCE_TRIALS:
        return None
    return (
        f"from {trials} finished trial{'s' if trials != 1 else ''} only (fewer than {MIN_IMPORTANCE_TRIALS}): a rough "
        "guess, which more trials may overturn"
    )


def shown(value: object) -> str:
    """A parameter value for a table: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def importance_figure(study: optuna.Study, path: str) -> dict[str, float] | None:
    """Importance of each searched key for the score (Optuna's default evaluator), as a bar chart; None (and no figure)
    while too few trials finished to tell."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "importances will be equal" with few trials: the figure says as much
            importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return None
    if not importances or any(math.isnan(v) for v in importances.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(importances)[::-1]
    figure, axes = plt.subplots(figsize=(6, 0.4 * len(names) + 1.2))
    axes.barh(names, [importances[name] for name in names])
    axes.set_xlabel("importance for the score")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return {name: round(float(value), 4) for name, value in importances.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.tune`` with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = parse_args(__doc__, argv)
    STOPPING.clear()  # an earlier main() of this process that was interrupted left it set
    missing = [flag for flag in ("--config", "--search", "--study") if args[flag] is None]
    if missing:
        print(
            f"error: {', '.join(missing)} missing: python -m lab.tune --config=<path> --search=<path> --study=<id>",
            file=sys.stderr,
        )
        return 2
    try:
        check_run_id(args["--study"])
        path = config_path(args["--config"])
        raw = read_mapping(path, "config file", "'updates: 100' (see configs/)")
        base = apply_overrides(raw, parse_overrides(list(args["--set"])))
        if "eval_interval" not in parse_overrides(list(args["--set"])):
            base["eval_interval"] = 0
        validate_config(base)
        space = load_search(args["--search"], base)
        settings = Study(args, base, space, path, raw)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # SearchError included
        print(f"error: {error}", file=sys.stderr)
        return 2
    os.makedirs(settings.folder, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=settings.id,
        storage=f"sqlite:///{os.path.join(settings.folder, 'study.db')}",
        load_if_exists=True,
        direction="maximize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=int(settings.warmup * settings.updates)),
    )
    try:
        check_settings(study, settings, bool(args["--force-continue"]))
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Seeded by the trials so far: a continued study draws new values, not the first invocation's again.
    study.sampler = optuna.samplers.TPESampler(seed=len(study.get_trials(deepcopy=False)))
    if not study.get_trials(deepcopy=False):  # a new study: its first trial is the config as it is
        values = base_values(base, space)
        if values is None:
            print("the base config's values lie outside the search space: no trial of the config as it is", flush=True)
        else:
            study.enqueue_trial(values, user_attrs={"base": True})
    requeued = requeue_unfinished(study)
    one_ask_at_a_time(study)
    remaining = settings.trials - counted(study)
    print(
        f"study {settings.id}: {counted(study)} of {settings.trials} trials done"
        f"{f', {requeued} interrupted trial(s) queued again' if requeued else ''}; {max(0, remaining)} to run, "
        f"{settings.jobs} at a time, {settings.seeds} seeds each ({settings.threads} thread(s) per seed)",
        flush=True,
    )
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if remaining > 0:
            study.optimize(settings, n_trials=remaining, n_jobs=settings.jobs, catch=(RuntimeError,))
    except KeyboardInterrupt:
        STOPPING.set()
        mark_interrupted(study)
        print("interrupted: run the same command again to continue the study", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = report(study, settings)
    with open(os.path.join(settings.folder, "summary.json"), "w") as file:
        json.dump(summary, file, indent=1)
    if summary["best"] is None:
        print("no trial finished: see the trials' logs under models/tune/", file=sys.stderr)
    print(json.dumps(summary))
    return 0 if summary["best"] is not None else 1


def _raise_interrupt(signum: int, frame: object) -> None:
    """Ctrl-C and SIGTERM: the trials in worker threads (--jobs > 1) see STOPPING at once, not after study.optimize
    returns, which waits for them."""
    STOPPING.set()
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
