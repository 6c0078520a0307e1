"""Running the seeds of an experiment (lab/experiment.py): what each seed needs (a new run, a resume of its checkpoint, or
nothing: finished earlier), its train.py as a subprocess with its share of the cores, its progress lines, the stop of
all of them on an interrupt, and the evaluation of its final model on the experiment's unseen episodes.

Each finished and evaluated seed leaves a record, results/<id>/seed-k.json (its config, counters, evaluation episodes
and training curves), from which a later invocation without models/ and summaries/ counts it as finished.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from checkpoint import load_file, load_model
from cli import ROOT
from config import ConfigError, flatten, validate_config, with_saved_defaults
from evaluation import count_cut_episodes_as_failures, evaluate, metric_means

TRAIN = os.path.join(ROOT, "train.py")
MODELS_DIR, RESULTS_DIR = "models", "results"  # relative to the current folder, as train.py's models/
EVALUATION_SEED = 0  # every model plays the same unseen episodes, so the seeds are compared on equal terms
PROGRESS_SECONDS = 60  # how often a running seed's last console line is repeated, so a long run is not silent
STOP_SECONDS = 120  # how long an interrupted seed may take to write its checkpoint before it is killed
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Evaluation:
    """How an experiment evaluates its final models: how many unseen episodes, sampling actions (as in training)
    or taking the most likely one (``deterministic``, as SB3's evaluate_policy does by default)."""

    episodes: int
    deterministic: bool = False

    def matches(self, record: dict) -> bool:
        """Whether a seed record was evaluated this way (records written before the choice existed sampled)."""
        return (
            record["eval_episodes"] == self.episodes
            and record["evaluation_seed"] == EVALUATION_SEED
            and record.get("deterministic", False) == self.deterministic
        )

    def describe(self) -> str:
        return f"{self.episodes} unseen episodes" + (", most likely actions" if self.deterministic else "")


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


# Keys that change what a run writes, not what it learns (writing a checkpoint leaves the training as it was).
BOOKKEEPING = frozenset({"checkpoint_interval"})


def config_changes(saved: dict, wanted: dict) -> list[str]:
    """The keys (but ``updates``, which a resume may change, the bookkeeping keys, and the section of a memory neither
    config uses) in which a checkpoint's config differs from the experiment's, as "key saved -> wanted"."""
    try:
        saved = validate_config(with_saved_defaults(saved)).to_dict()  # defaults of keys added since, filled in
    except ConfigError:
        pass
    old, new = flatten(saved), flatten(wanted)
    # The section of a memory the run does not use changes nothing (e.g. a new transformer default for a GRU run).
    unused = [prefix for prefix, memories in (("transformer.", ("trxl",)), ("recurrence.", ("gru", "lstm")))
              if old.get("memory") not in memories and new.get("memory") not in memories]  # fmt: skip
    keys = sorted(key for key in (set(old) | set(new)) - {"updates", *BOOKKEEPING} if not key.startswith(tuple(unused)))
    return [f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]


SUCCESS_CURVE = "episode/success_mean"  # the training episodes' success rate per update, where the task reports one
# Curves a seed's record keeps: the episodes' and, to tell after the summaries are gone why a curve fell, the policy's
# step size (approximate KL per update, mean and largest over its minibatches), its entropy, and the gradient steps
# each update took (fewer than epochs x minibatches where target_kl ended it early).
RECORD_TAGS = (
    "episode/reward_mean", SUCCESS_CURVE, "episode/length_mean", "training/approx_kl",
    "training/approx_kl_max", "losses/entropy", "training/gradient_steps", "values/advantage_std",
)  # fmt: skip


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


def write_record(run: Seed, evaluation: Evaluation) -> None:
    """Write what the summary needs of a finished, just evaluated seed to results/<id>/seed-k.json (small, to
    commit), its curves read from its TensorBoard summaries."""
    summary_dir = run.checkpoint["summary_dir"]
    run.record = {
        "seed": run.seed,
        "config": run.checkpoint["config"],
        "summary_dir": summary_dir,
        "update": run.checkpoint["update"],
        "env_steps": run.checkpoint["env_steps"],
        "eval_episodes": evaluation.episodes,
        "evaluation_seed": EVALUATION_SEED,
        "deterministic": evaluation.deterministic,
        "evaluation": run.evaluation,
        "curves": {tag: [[step, value] for step, value in read_scalars(summary_dir, tag).items()] for tag in RECORD_TAGS},
        "seconds": training_seconds(run.checkpoint["config"], summary_dir),
    }
    os.makedirs(os.path.dirname(run.record_path), exist_ok=True)
    with open(run.record_path, "w") as file:
        json.dump(run.record, file)


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
    """Start a seed's train.py in its own process group: a Ctrl-C in the terminal reaches only lab/experiment.py, which
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


def settle(run: Seed, evaluation: Evaluation, device: torch.device, threads: int | None = None) -> None:
    """Evaluate a finished seed (or take its record's evaluation) and write its record, saying what it found.
    ``threads`` limits torch's threads meanwhile (while other seeds train)."""
    reused = reusable_evaluation(run, evaluation)  # its record is up to date
    if reused:
        print(f"seed {run.seed}: evaluation from {run.record_path}:", end="", flush=True)
        run.evaluation = run.record["evaluation"]
    else:
        print(f"seed {run.seed}: evaluating {evaluation.describe()} ...", end="", flush=True)
        previous = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            evaluate_seed(run, evaluation, device)
        finally:
            torch.set_num_threads(previous)
    if run.action != "failed":
        # Also in records written before cut episodes counted, or before a task whose every evaluation episode was cut
        # was known to report success.
        count_cut_episodes_as_failures(run.evaluation, reports_success(run))
        if not reused:
            write_record(run, evaluation)
    means = metric_means(run.evaluation) if run.evaluation else {}
    shown = "  ".join(f"{key} {means[key]:.3f}" for key in ("reward", "success") if key in means)
    print(f" failed: {run.reason}" if run.action == "failed" else f" {shown}", flush=True)


def run_seeds(
    runs: list[Seed],
    path: str,
    sets: list[str],
    updates: int,
    jobs: int,
    threads: int,
    cpu: bool,
    on_finished: Callable[[Seed], None] = lambda run: None,
) -> None:
    """Train the seeds that need it, ``jobs`` at a time with ``threads`` torch threads each, reporting each start and
    end (and every PROGRESS_SECONDS the last line of each running seed), and call ``on_finished`` with each seed that
    finishes (so that an interrupted experiment keeps the results of its finished seeds). On KeyboardInterrupt, stops
    the running children (they save their checkpoints) and re-raises; so does any other exception."""
    queue = [run for run in runs if run.action in ("new", "resume")]
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


def reports_success(run: Seed) -> bool:
    """Whether a finished seed's task reports success: an episode of its evaluation does, or, where every one was cut
    at the step limit, its training's success curve (from its record of this training, else its summaries) does."""
    if any("success" in result for result in run.evaluation):
        return True
    if run.record is not None and run.record["summary_dir"] == run.checkpoint["summary_dir"]:
        return bool(run.record["curves"].get(SUCCESS_CURVE))
    return bool(read_scalars(run.checkpoint["summary_dir"], SUCCESS_CURVE))


def reusable_evaluation(run: Seed, evaluation: Evaluation) -> bool:
    """Whether the seed's record holds the evaluation asked for, of the very model the seed's training ended with."""
    record = run.record
    return (
        record is not None
        and evaluation.matches(record)
        and record["summary_dir"] == run.checkpoint["summary_dir"]
        and record["update"] == run.checkpoint["update"]
    )


def evaluate_seed(run: Seed, evaluation: Evaluation, device: torch.device) -> None:
    """Evaluate a finished seed's final model as ``evaluation`` says (its checkpoint's weights where the
    model file is missing: a run killed between writing the two)."""
    record = run.record
    path = run.model_path if os.path.isfile(run.model_path) else run.checkpoint_path
    if not os.path.isfile(path):
        recorded = Evaluation(record["eval_episodes"], record.get("deterministic", False))
        flags = f"--eval-episodes {recorded.episodes}" + (" --deterministic" if recorded.deterministic else "")
        run.fail(
            "evaluation",
            f"its record {run.record_path} holds an evaluation on {recorded.describe()} and its model is gone: "
            f"use {flags}, or remove the record to train seed {run.seed} again",
        )
        return
    try:
        model, config = load_model(path, device)
        run.evaluation = evaluate(
            model, config, device, evaluation.episodes, seed=EVALUATION_SEED, deterministic=evaluation.deterministic
        )
    except Exception as error:  # one seed's broken file or environment must not lose the other seeds' results
        run.fail("evaluation", f"evaluating {path} failed: {type(error).__name__}: {error}")
