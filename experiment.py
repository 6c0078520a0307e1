"""Train one config with several seeds, evaluate every final model on the same unseen episodes, and aggregate them:
the IQM over the seeds with a 95% stratified-bootstrap confidence interval (rliable), per update and at the end.

Usage:
  experiment.py [options] [--set=<key=value>]...
  experiment.py (-h | --help)

Options:
  --config=<path>       YAML config of every seed's run (required).
  --seeds=<seeds>       The seeds (required): a range "0-4", a list "0,2,5", or both "0-2,7".
  --run-id=<id>         Name of the experiment (required): seed k trains as run <id>/seed-k, results go to results/<id>/.
  --set=<key=value>     Override a config key in every seed's run, as in train.py (repeatable).
  --jobs=<n>            Seeds trained at a time, each with max(1, cores // n) threads [default: 1].
  --eval-episodes=<n>   Unseen episodes each final model is evaluated on [default: 100].
  --threshold=<x>       Level of the metric for steps-to-threshold (default: 0.9 for success, none for reward).
  --cpu                 Train and evaluate on the CPU even where CUDA is available.
  -h --help             Show this help.

Seed k runs `python train.py --config=<path> --run-id=<id>/seed-k --seed=k --set=...` (models/<id>/seed-k.nn,
models/<id>/seed-k/checkpoint.pt, summaries/<id>/seed-k/<time>/). Running the same command again skips the finished
seeds and resumes the unfinished ones from their checkpoints.

Each finished and evaluated seed also leaves a small record, results/<id>/seed-k.json: its config, counters,
evaluation episodes and training curves. Commit it with the results: on a machine without models/ and summaries/
(a new clone, another session) the same command counts that seed as finished from its record and trains only the
seeds that have none, so a long experiment can be spread over several sessions.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from aggregation import falls_after_reaching, iqm_curve, steps_to_threshold, summarize_runs, summarize_steps
from checkpoint import load_file, load_model
from cli import ROOT, parse_args
from config import ConfigError, flatten, load_config, parse_overrides, validate_config, with_saved_defaults
from evaluation import evaluate, summarize
from plot import experiment_figure
from train import config_path

TRAIN = os.path.join(ROOT, "train.py")
MODELS_DIR, RESULTS_DIR = "models", "results"  # relative to the current folder, as train.py's models/
EVALUATION_SEED = 0  # every model plays the same unseen episodes, so the seeds are compared on equal terms
SUCCESS_THRESHOLD = 0.9  # default steps-to-threshold level of the success rate
SOLVED = 1.0  # success rate of an update in which the task counts as solved (for falls_after_solving)
PROGRESS_SECONDS = 60  # how often a running seed's last console line is repeated, so a long run is not silent
STOP_SECONDS = 120  # how long an interrupted seed may take to write its checkpoint before it is killed
POLL_SECONDS = 0.2


@dataclass
class Seed:
    """One seed's run: where its files are, what is to be done with it, and how it went."""

    seed: int
    run_id: str
    action: str = "new"  # new | resume | finished | failed
    status: str = ""  # trained | resumed | skipped | failed (what this invocation did)
    reason: str = ""  # why it failed
    stage: str = ""  # where it failed: plan, training or evaluation
    start_update: int = 0
    process: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    last_line: str = ""
    started: float = 0.0
    evaluation: list[dict[str, float]] = field(default_factory=list)
    checkpoint: dict | None = None  # the finished run's config, summary_dir, update and env_steps (or its record's)
    record: dict | None = None  # results/<id>/seed-k.json, once written or read

    @property
    def model_path(self) -> str:
        return os.path.join(MODELS_DIR, f"{self.run_id}.nn")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(MODELS_DIR, self.run_id, "checkpoint.pt")

    @property
    def record_path(self) -> str:
        return os.path.join(RESULTS_DIR, f"{self.run_id}.json")

    @property
    def log_path(self) -> str:
        return os.path.join(MODELS_DIR, self.run_id, "train.log")

    def fail(self, stage: str, reason: str) -> None:
        """Mark the seed as failed at ``stage`` ("plan", "training" or "evaluation") for ``reason``."""
        self.action, self.status, self.stage, self.reason = "failed", "failed", stage, reason


def parse_seeds(text: str) -> list[int]:
    """Seeds from "0-4" (a range, both ends included), "0,2,5" (a list) or a mix ("0-2,7"); ValueError if malformed."""
    seeds: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            numbers = range(int(first), int(last) + 1) if dash else [int(first)]
        except ValueError:
            raise ValueError(f"--seeds '{text}': write a range like 0-4 or a list like 0,2,5 (seeds >= 0)") from None
        if dash and int(last) < int(first):
            raise ValueError(f"--seeds '{text}': the range {part.strip()} is empty (write low-high)")
        seeds.extend(numbers)
    duplicates = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if duplicates:
        raise ValueError(f"--seeds '{text}' names seed {duplicates[0]} more than once")
    return seeds


def number(args: dict, flag: str, kind: type, minimum: float | None = None) -> int | float:
    """The value of ``flag`` as ``kind`` (int or float), at least ``minimum``; ValueError naming the flag otherwise."""
    try:
        value = kind(args[flag])
    except ValueError:
        raise ValueError(f"{flag} must be {'an integer' if kind is int else 'a number'}, got '{args[flag]}'") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{flag} must be at least {minimum}, got {value}")
    return value


def check_run_id(run_id: str) -> None:
    """A run id is a relative name that stays below models/, summaries/ and results/."""
    parts = os.path.normpath(run_id).split(os.sep) if run_id else []
    if not parts or os.path.isabs(run_id) or ".." in parts or parts == ["."]:
        raise ValueError(f"--run-id '{run_id}': give a relative name such as poc-5seeds (it becomes results/<id>/)")


def config_changes(saved: dict, wanted: dict) -> list[str]:
    """The keys (but ``updates``, which a resume may change, and the section of a memory neither config uses) in which
    a checkpoint's config differs from the experiment's, as "key saved -> wanted"."""
    try:
        saved = validate_config(with_saved_defaults(saved)).to_dict()  # defaults of keys added since, filled in
    except ConfigError:
        pass
    old, new = flatten(saved), flatten(wanted)
    # The section of a memory the run does not use changes nothing (e.g. a new transformer default for a GRU run).
    unused = [prefix for prefix, memories in (("transformer.", ("trxl",)), ("recurrence.", ("gru", "lstm")))
              if old.get("memory") not in memories and new.get("memory") not in memories]  # fmt: skip
    keys = sorted(key for key in (set(old) | set(new)) - {"updates"} if not key.startswith(tuple(unused)))
    return [f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]


RECORD_TAGS = ("episode/reward_mean", "episode/success_mean", "episode/length_mean")  # curves a seed's record keeps


def read_record(run: Seed) -> dict | None:
    """The seed's record results/<id>/seed-k.json, or None where there is none."""
    if not os.path.isfile(run.record_path):
        return None
    try:
        with open(run.record_path) as file:
            record = json.load(file)
        if not all(key in record for key in ("config", "summary_dir", "update", "env_steps", "evaluation", "curves")):
            raise ValueError("keys are missing")
    except (OSError, ValueError) as error:
        raise ValueError(f"{run.record_path} cannot be read ({error}): remove it to train seed {run.seed} again") from None
    return record


def write_record(run: Seed, episodes: int) -> None:
    """Write what the summary needs of a finished, just evaluated seed to results/<id>/seed-k.json (small, to
    commit), its curves read from its TensorBoard summaries."""
    summary_dir = run.checkpoint["summary_dir"]
    run.record = {
        "seed": run.seed,
        "config": run.checkpoint["config"],
        "summary_dir": summary_dir,
        "update": run.checkpoint["update"],
        "env_steps": run.checkpoint["env_steps"],
        "eval_episodes": episodes,
        "evaluation_seed": EVALUATION_SEED,
        "evaluation": run.evaluation,
        "curves": {tag: [[step, value] for step, value in read_scalars(summary_dir, tag).items()] for tag in RECORD_TAGS},
        "seconds": training_seconds(run.checkpoint["config"], summary_dir),
    }
    os.makedirs(os.path.dirname(run.record_path), exist_ok=True)
    with open(run.record_path, "w") as file:
        json.dump(run.record, file)


def training_seconds(config: dict, summary_dir: str) -> float | None:
    """Seconds the run spent in rollouts and optimisation, summed over its updates from their logged steps per second
    (exact across resumes; evaluations and pauses between sessions excluded); None without the summaries."""
    rates = read_scalars(summary_dir, "training/sps")
    if not rates:
        return None
    return round(sum(config["n_workers"] * config["worker_steps"] / rate for rate in rates.values() if rate > 0), 3)


def plan(run: Seed, config: dict) -> None:
    """Decide from the files on disk whether ``run`` is new, to be resumed, finished, or cannot go on."""
    try:
        run.record = read_record(run)
    except ValueError as error:
        run.fail("plan", str(error))
        return
    if run.record is not None and not os.path.exists(run.checkpoint_path):
        check_finished(run, run.record, run.record_path, config)
        return
    if not os.path.exists(run.checkpoint_path):
        if os.path.exists(run.model_path):
            run.fail("plan", f"{run.model_path} exists without its checkpoint: remove it or choose another --run-id")
        return
    try:
        checkpoint = load_file(run.checkpoint_path)
    except (OSError, ValueError) as error:
        run.fail("plan", str(error))
        return
    check_finished(run, checkpoint, run.checkpoint_path, config)


def check_finished(run: Seed, saved: dict, path: str, config: dict) -> None:
    """Decide from a checkpoint or record ``saved`` (read from ``path``) whether ``run`` is finished, to be resumed (a
    checkpoint only), or cannot go on (another config, or more updates than the experiment's)."""
    what = "record" if path == run.record_path else "checkpoint"
    changes = config_changes(saved["config"], config)
    if changes:
        run.fail(
            "plan",
            f"its {what} {path} was trained with another config ({'; '.join(changes)}): "
            "run the experiment with the same config and --set, or choose another --run-id",
        )
        return
    run.start_update = saved["update"]
    if saved["update"] > config["updates"]:
        run.fail("plan", f"its {what} holds update {saved['update']}, beyond updates = {config['updates']}")
    elif saved["update"] == config["updates"]:
        run.action, run.checkpoint = "finished", saved
    elif what == "record":
        run.fail(
            "plan",
            f"its record {path} holds update {saved['update']} of {config['updates']}, and its checkpoint "
            f"{run.checkpoint_path} is gone: remove the record to train seed {run.seed} again",
        )
    else:
        run.action = "resume"


def command(run: Seed, path: str, sets: list[str], updates: int, cpu: bool) -> list[str]:
    """The train.py command of a seed: a new run with the experiment's config and overrides, or the resume of its
    checkpoint (which holds the config with the overrides applied; train.py refuses --config with --resume)."""
    if run.action == "resume":
        arguments = [f"--resume={run.checkpoint_path}", f"--set=updates={updates}"]
    else:
        arguments = [f"--config={path}", f"--run-id={run.run_id}", f"--seed={run.seed}", *[f"--set={s}" for s in sets]]
    return [sys.executable, TRAIN, *arguments, *(["--cpu"] if cpu else [])]


def child_environment(threads: int) -> dict[str, str]:
    """The environment of a train.py child: ``threads`` threads for torch and the math libraries (torch reads
    OMP_NUM_THREADS when it starts), unbuffered output so its progress lines arrive as they are printed."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


def cpu_cores() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def say(run: Seed, text: str) -> None:
    """A progress line about one seed, printed at once."""
    print(f"seed {run.seed}: {text}", flush=True)


def read_output(run: Seed) -> None:
    """Copy a child's console output to its log file and keep its last line (a thread per child)."""
    try:
        os.makedirs(os.path.dirname(run.log_path), exist_ok=True)
        log = open(run.log_path, "a")
    except OSError as error:  # the output must still be read, or the child blocks on a full pipe
        print(f"note: seed {run.seed}: no log file ({error})", file=sys.stderr)
        log = None
    try:
        for line in run.process.stdout:
            if log is not None:
                log.write(line)
                log.flush()
            if line.strip():
                run.last_line = line.strip()
    finally:
        if log is not None:
            log.close()


def start(run: Seed, arguments: list[str], threads: int) -> None:
    """Start a seed's train.py in its own process group: a Ctrl-C in the terminal reaches only experiment.py, which
    passes one SIGINT on (a second one could cut a checkpoint short)."""
    run.started = time.time()
    run.process = subprocess.Popen(
        arguments, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        env=child_environment(threads), process_group=0,
    )  # fmt: skip
    run.reader = threading.Thread(target=read_output, args=(run,), daemon=True)
    run.reader.start()
    what = f"resumed from update {run.start_update}" if run.action == "resume" else "started"
    say(run, f"{what} ({threads} thread{'s' if threads > 1 else ''}, log {run.log_path})")


def finish(run: Seed, updates: int) -> None:
    """Record how a child ended; a run that exits 0 but whose checkpoint is not at ``updates`` failed too."""
    run.reader.join(timeout=10)
    code, seconds = run.process.returncode, time.time() - run.started
    if code == 0:
        try:
            run.checkpoint = load_file(run.checkpoint_path)
        except (OSError, ValueError) as error:
            run.fail("training", f"train.py exited 0, but {error}")
        else:
            if run.checkpoint["update"] == updates:
                run.status = "resumed" if run.action == "resume" else "trained"
                run.action = "finished"
                say(run, f"finished in {seconds:.0f}s: {run.last_line}")
                return
            run.fail("training", f"train.py exited 0 with the checkpoint at update {run.checkpoint['update']}/{updates}")
    else:
        run.fail("training", f"train.py exited with code {code}: {run.last_line} (full output: {run.log_path})")
    say(run, f"failed: {run.reason}")


def settle(run: Seed, episodes: int, device: torch.device, threads: int | None = None) -> None:
    """Evaluate a finished seed (or take its record's evaluation) and write its record, saying what it found.
    ``threads`` limits torch's threads meanwhile (while other seeds train)."""
    if reusable_evaluation(run, episodes):  # its record is up to date
        print(f"seed {run.seed}: evaluation from {run.record_path}:", end="", flush=True)
        run.evaluation = run.record["evaluation"]
    else:
        print(f"seed {run.seed}: evaluating {episodes} unseen episodes ...", end="", flush=True)
        previous = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            evaluate_seed(run, episodes, device)
        finally:
            torch.set_num_threads(previous)
        if run.action != "failed":
            write_record(run, episodes)
    shown = "  ".join(
        f"{key} {np.mean([result[key] for result in run.evaluation]):.3f}"
        for key in ("reward", "success")
        if run.evaluation and key in run.evaluation[0]
    )
    print(f" failed: {run.reason}" if run.action == "failed" else f" {shown}", flush=True)


def run_seeds(
    runs: list[Seed],
    path: str,
    sets: list[str],
    updates: int,
    jobs: int,
    cpu: bool,
    on_finished: Callable[[Seed], None] = lambda run: None,
) -> None:
    """Train the seeds that need it, ``jobs`` at a time, reporting each start and end (and every PROGRESS_SECONDS the
    last line of each running seed), and call ``on_finished`` with each seed that finishes (so that an interrupted
    experiment keeps the results of its finished seeds). On KeyboardInterrupt, stops the running children (they save
    their checkpoints) and re-raises; so does any other exception."""
    queue = [run for run in runs if run.action in ("new", "resume")]
    threads = max(1, cpu_cores() // jobs)
    running: list[Seed] = []
    last_report = time.time()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                run = queue.pop(0)
                start(run, command(run, path, sets, updates, cpu), threads)
                running.append(run)
            time.sleep(POLL_SECONDS)
            for run in [run for run in running if run.process.poll() is not None]:
                running.remove(run)
                finish(run, updates)
                if run.action == "finished":
                    on_finished(run)
            if running and time.time() - last_report >= PROGRESS_SECONDS:
                last_report = time.time()
                for run in running:
                    say(run, f"running for {time.time() - run.started:.0f}s: {run.last_line or '(no output yet)'}")
    except BaseException:  # Ctrl-C, SIGTERM, or an error in on_finished: no child is left running
        stop(running)
        raise


def stop(running: list[Seed]) -> None:
    """Send each running child one SIGINT (train.py saves a checkpoint and exits), wait, and kill any that hangs."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the children half-stopped
    try:
        for run in running:
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGINT)
        deadline = time.time() + STOP_SECONDS
        for run in running:
            try:
                run.process.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait()
            run.reader.join(timeout=10)
            try:
                kept = f"its checkpoint holds update {load_file(run.checkpoint_path)['update']}"
            except (OSError, ValueError):
                kept = "no checkpoint was written"
            say(run, f"stopped (exit code {run.process.returncode}): {kept}")
    finally:
        signal.signal(signal.SIGINT, previous)


def reusable_evaluation(run: Seed, episodes: int) -> bool:
    """Whether the seed's record holds the evaluation asked for, of the very model the seed's training ended with."""
    record = run.record
    return (
        record is not None
        and record["eval_episodes"] == episodes
        and record["evaluation_seed"] == EVALUATION_SEED
        and record["summary_dir"] == run.checkpoint["summary_dir"]
        and record["update"] == run.checkpoint["update"]
    )


def evaluate_seed(run: Seed, episodes: int, device: torch.device) -> None:
    """Evaluate a finished seed's final model on ``episodes`` unseen episodes (its checkpoint's weights where the
    model file is missing: a run killed between writing the two)."""
    record = run.record
    path = run.model_path if os.path.isfile(run.model_path) else run.checkpoint_path
    if not os.path.isfile(path):
        run.fail(
            "evaluation",
            f"its record {run.record_path} holds {record['eval_episodes']} evaluation episodes and its model is gone: "
            f"use --eval-episodes {record['eval_episodes']}, or remove the record to train seed {run.seed} again",
        )
        return
    try:
        model, config = load_model(path, device)
        run.evaluation = evaluate(model, config, device, episodes, seed=EVALUATION_SEED)
    except Exception as error:  # one seed's broken file or environment must not lose the other seeds' results
        run.fail("evaluation", f"evaluating {path} failed: {type(error).__name__}: {error}")


def read_scalars(summary_dir: str, tag: str) -> dict[int, float]:
    """Step -> value of a scalar ``tag`` in the TensorBoard event files of ``summary_dir``. A resumed run writes a new
    event file into the same folder and may repeat steps logged after its last checkpoint: the latest value wins."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    latest: dict[int, tuple[float, float]] = {}
    for file in sorted(glob.glob(os.path.join(summary_dir, "events.out.tfevents.*"))):
        for event in EventFileLoader(file).Load():
            for value in event.summary.value:
                if value.tag != tag:
                    continue
                number = value.simple_value if value.HasField("simple_value") else tensor_util.make_ndarray(value.tensor)
                if event.step not in latest or event.wall_time >= latest[event.step][0]:
                    latest[event.step] = (event.wall_time, float(number))
    return {step: number for step, (_, number) in sorted(latest.items())}


def curves(runs: list[Seed], metric: str) -> tuple[list[int], np.ndarray]:
    """The per-update curves of the runs on the union of their steps: (steps, values (runs, steps)), NaN where a run
    logged nothing (no episode ended in that update)."""
    tag = f"episode/{metric}_mean"
    scalars = []
    for run in runs:
        scalars.append({step: value for step, value in run.record["curves"].get(tag, [])})
        if not scalars[-1]:
            print(f"note: seed {run.seed} has no '{tag}' in {run.record_path}", file=sys.stderr)
    steps = sorted({step for series in scalars for step in series})
    values = np.array([[series.get(step, np.nan) for step in steps] for series in scalars], dtype=np.float64)
    return steps, values.reshape(len(runs), len(steps))


def to_json(values: np.ndarray | list) -> list:
    """Floats for JSON, NaN as null (JSON has no NaN)."""
    return [None if value is None or np.isnan(value) else float(value) for value in np.asarray(values, dtype=np.float64)]


def aggregate(runs: list[Seed], metric: str, threshold: float | None) -> dict:
    """The results of the finished ``runs``: per seed, the final value (mean of ``metric`` over its evaluation
    episodes) and steps to ``threshold``; over the seeds, the final IQM, mean and 95% interval of the IQM, the
    per-update curves with their IQM and band, and the steps-to-threshold aggregate."""
    finals = [float(np.mean([result[metric] for result in run.evaluation])) for run in runs]
    steps, values = curves(runs, metric)
    center, low, high = iqm_curve(values) if steps else (np.zeros(0), np.zeros(0), np.zeros(0))
    reached = steps_to_threshold(steps, values, threshold) if threshold is not None else [None] * len(runs)
    to_threshold: dict = {"threshold": threshold}
    if threshold is not None:
        to_threshold.update(summarize_steps(reached), per_seed=reached)
    falls = None
    if metric == "success" and threshold is not None:
        # Did a seed that solved the task (an update in which every training episode succeeded) lose it again?
        if steps:
            falls = falls_after_reaching(values, SOLVED, threshold)
            falls["per_seed"] = {str(run.seed): entry for run, entry in zip(runs, falls.pop("per_run"), strict=True)}
    return {
        "final": {**summarize_runs(finals), "per_seed": finals},
        "final_interval": "95% percentile bootstrap of the IQM over the seeds, resampling the seeds",
        "per_seed": [
            {
                "seed": run.seed,
                "status": run.status,
                "final": final,
                "steps_to_threshold": step,
                "model": run.model_path,
                "summary_dir": run.checkpoint["summary_dir"],
                "updates": run.checkpoint["update"],
                "env_steps": run.checkpoint["env_steps"],
                "evaluation": summarize(run.evaluation),
            }
            for run, final, step in zip(runs, finals, reached, strict=True)
        ],
        "curves": {
            "tag": f"episode/{metric}_mean",
            "steps": steps,
            "per_seed": {str(run.seed): to_json(row) for run, row in zip(runs, values, strict=True)},
            "iqm": to_json(center),
            "ci_low": to_json(low),
            "ci_high": to_json(high),
        },
        "steps_to_threshold": to_threshold,
        "falls_after_solving": falls,
    }


def print_report(runs: list[Seed], summary: dict) -> None:
    """The table of the seeds (what was done, counters, final value, steps to the threshold), then the aggregates."""
    metric, threshold, final = summary["metric"], summary["steps_to_threshold"]["threshold"], summary["final"]
    reach = f"steps to {threshold:g}" if threshold is not None else ""
    header = f"{metric} ({summary['eval_episodes']} ep.)"
    print(f"{'seed':>6}  {'status':<8}{'updates':>9}{'env steps':>12}{header:>22}{reach:>16}")
    results = {entry["seed"]: entry for entry in summary["per_seed"]}
    for run in runs:
        if run.seed not in results:
            print(f"{run.seed:>6}  {'failed':<8}  {run.stage}: {run.reason}")
            continue
        entry = results[run.seed]
        step = entry["steps_to_threshold"]
        shown = ("-" if step is None else str(step)) if threshold is not None else ""
        print(
            f"{run.seed:>6}  {entry['status']:<8}{entry['updates']:>9}{entry['env_steps']:>12}{entry['final']:>22.3f}"
            f"{shown:>16}"
        )
    seeds = len(summary["per_seed"])
    print(
        f"{metric} over {seeds} seed{'s' if seeds > 1 else ''}: IQM {final['iqm']:.3f}, mean {final['mean']:.3f}, "
        f"95% CI of the IQM [{final['ci_low']:.3f}, {final['ci_high']:.3f}]"
    )
    if threshold is not None:
        to_threshold = summary["steps_to_threshold"]
        median = "-" if to_threshold["median"] is None else f"{to_threshold['median']:.0f}"
        print(f"steps to {metric} {threshold:g}: {to_threshold['reached']} of {to_threshold['runs']} seeds, median {median}")
    falls = summary["falls_after_solving"]
    if falls is not None and falls["runs_reached"] == 0:
        print(f"no seed reached {metric} {falls['reach']:.2f} in training, so none could fall back")
    elif falls is not None:
        print(
            f"after first reaching {metric} {falls['reach']:.2f} in training: {falls['runs_below']} of "
            f"{falls['runs_reached']} seeds fell below {falls['floor']:g} ({falls['updates_below']} updates in all)"
        )
    failures = summary["failures"]
    if failures:
        print(f"{len(failures)} seed{'s' if len(failures) > 1 else ''} failed: {', '.join(str(f['seed']) for f in failures)}")


def main(argv: list[str] | None = None) -> int:
    """Run experiment.py with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(__doc__, argv)
    # Required flags are checked here rather than in the usage pattern, so that a missing one is named.
    missing = [flag for flag in ("--config", "--seeds", "--run-id") if args[flag] is None]
    if missing:
        print(
            f"error: {', '.join(missing)} missing: python experiment.py --config=<path> --seeds=0-4 --run-id=<id> "
            "(--help explains every flag)",
            file=sys.stderr,
        )
        return 2
    try:
        seeds = parse_seeds(args["--seeds"])
        check_run_id(args["--run-id"])
        jobs = number(args, "--jobs", int, 1)
        episodes = number(args, "--eval-episodes", int, 1)
        threshold = number(args, "--threshold", float) if args["--threshold"] is not None else None
        sets = list(args["--set"])
        path = config_path(args["--config"])
        config = load_config(path, parse_overrides(sets))
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    experiment_id = args["--run-id"]
    runs = [Seed(seed, f"{experiment_id}/seed-{seed}") for seed in seeds]
    wanted = config.to_dict()
    for run in runs:
        plan(run, wanted)
        if run.action == "finished":
            run.status = "skipped"
            source = run.checkpoint_path if os.path.exists(run.checkpoint_path) else run.record_path
            say(run, f"skipped: finished earlier (update {run.start_update}/{config.updates}, {source})")
        elif run.action == "failed":
            say(run, f"cannot run: {run.reason}")

    # SIGINT explicitly too: a process started in the background of a script inherits SIGINT ignored, and Python then
    # leaves it ignored, so that `kill -INT` would not stop the experiment.
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
        for run in [run for run in runs if run.action == "finished"]:  # finished earlier
            settle(run, episodes, device)
        run_seeds(
            runs, path, sets, config.updates, jobs, bool(args["--cpu"]), lambda run: settle(run, episodes, device, threads=1)
        )
    except KeyboardInterrupt:
        print(
            "interrupted: the running seeds kept their checkpoints; run the same command again to continue "
            "(finished seeds are skipped, unfinished ones resumed)",
            file=sys.stderr,
        )
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    finished = [run for run in runs if run.action == "finished"]
    failures = [{"seed": run.seed, "stage": run.stage, "reason": run.reason} for run in runs if run.action == "failed"]
    if not finished:
        print(f"error: no seed finished ({len(failures)} failed); nothing to aggregate", file=sys.stderr)
        return 1
    metric = "success" if all("success" in run.evaluation[0] for run in finished) else "reward"
    if threshold is None and metric == "success":
        threshold = SUCCESS_THRESHOLD
    results_dir = os.path.join(RESULTS_DIR, experiment_id)
    summary = {
        "run_id": experiment_id,
        "config": args["--config"],
        "overrides": sets,
        "seeds": seeds,
        "finished_seeds": [run.seed for run in finished],
        "metric": metric,
        "eval_episodes": episodes,
        "evaluation_seed": EVALUATION_SEED,
        **aggregate(finished, metric, threshold),
        "failures": failures,
        "plot": os.path.join(results_dir, "curves.png"),
        "command": shlex.join(["python", "experiment.py", *argv]),
    }
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "summary.json"), "w") as file:
        json.dump(summary, file, indent=1)
    experiment_figure(summary, summary["plot"])
    print_report(runs, summary)
    print(f"wrote {os.path.join(results_dir, 'summary.json')} and {summary['plot']}")
    line = {"config": summary["config"], "seeds": len(finished), "metric": metric, "final": summary["final"]}
    line.update(steps_to_threshold=summary["steps_to_threshold"], failures=[f["seed"] for f in failures], plot=summary["plot"])
    print(json.dumps(line))
    return 1 if failures else 0


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM stop the experiment through the same path as Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
