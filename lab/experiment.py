"""Train one config with several seeds, evaluate every final model on the same unseen episodes, and aggregate them:
the IQM over the seeds with a 95% stratified-bootstrap confidence interval (rliable), per update and at the end.

Usage:
  python -m lab.experiment [options] [--set=<key=value>]...
  python -m lab.experiment (-h | --help)

Options:
  --config=<path>       YAML config of every seed's run (required).
  --seeds=<seeds>       The seeds: a range "0-4", a list "0,2,5", or both "0-2,7" (required).
  --run-id=<id>         Name of the experiment: seed k trains as run <id>/seed-k (models/<id>/seed-k.nn,
                        models/<id>/seed-k/checkpoint.pt with the run's console output in train.log beside it,
                        summaries/<id>/seed-k/<time>/), results go to results/<id>/ (required).
  --set=<key=value>     Override a config key in every seed's run, as in train.py (repeatable).
  --jobs=<n>            Seeds trained at a time [default: 1].
  --threads=<n>         torch threads of each seed's train.py (OMP_NUM_THREADS), so that the seeds do not oversubscribe
                        the CPU (default: the cores that the load leaves free when the experiment starts, shared among
                        its jobs, at least 1 each: train.py's rule).
  --eval-episodes=<n>   Unseen episodes each final model is evaluated on: the same episodes for every seed
                        (evaluation seed 0) [default: 100].
  --deterministic       Evaluate the final models with their most likely actions instead of sampling them (SB3's
                        evaluate_policy default); recorded as "deterministic" in the records and the summary, and a
                        record evaluated the other way is evaluated again.
  --threshold=<x>       Level of the metric for steps-to-threshold; none for reward unless given (default: 0.9 for
                        success).
  --cpu                 Train and evaluate on the CPU even where CUDA is available.
  -h --help             Show this help.

Seed k runs `python train.py --config=<path> --run-id=<id>/seed-k --seed=k --set=...` (models/<id>/seed-k.nn,
models/<id>/seed-k/checkpoint.pt, summaries/<id>/seed-k/<time>/). Running the same command again skips the finished
seeds and resumes the unfinished ones from their checkpoints.

Each finished and evaluated seed also leaves a small record, results/<id>/seed-k.json: its config, counters,
evaluation episodes and training curves. Commit it with the results: on a machine without models/ and summaries/
(a new clone, another session) the same command counts that seed as finished from its record and trains only the
seeds that have none, so a long experiment can be spread over several sessions.

results/<id>/summary.json aggregates the seeds named in --seeds only. Seeds run one at a time (one command per core)
each write a summary of their own seed; the command with every seed then summarises them all without training
again. A summary that leaves out records in its folder names them (the summary's "other_recorded_seeds").
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys

import torch

from cli import parse_args
from config import ConfigError, load_config, parse_overrides
from evaluation import count_cut_episodes_as_failures
from lab.experiment_report import SUCCESS_THRESHOLD, aggregate, experiment_figure, print_report
from lab.seeds import EVALUATION_SEED, RESULTS_DIR, Evaluation, Seed, plan, run_seeds, say, settle
from train import config_path, default_threads


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


def evaluation_metric(runs: list[Seed]) -> str:
    """The metric of the finished ``runs``: "success" where the task reports it (a seed's evaluation does; ``settle``
    gave success 0 to the cut episodes of each seed whose training or evaluation showed it), else "reward". With
    success, every seed's episodes cut at the evaluation's step limit count as failures, also those of a seed whose
    evaluation and training ended no episode by themselves (one such seed must not turn the experiment to reward)."""
    if not any("success" in result for run in runs for result in run.evaluation):
        return "reward"
    for run in runs:
        count_cut_episodes_as_failures(run.evaluation, success=True)
    return "success"


def other_recorded_seeds(results_dir: str, seeds: list[int]) -> list[int]:
    """The seeds whose records (seed-k.json) lie in ``results_dir`` but are not among ``seeds``: a summary over
    ``seeds`` leaves them out."""
    found = []
    for name in os.listdir(results_dir) if os.path.isdir(results_dir) else []:
        match = re.fullmatch(r"seed-(\d+)\.json", name)
        if match and int(match.group(1)) not in seeds:
            found.append(int(match.group(1)))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.experiment`` with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(__doc__, argv)
    # Required flags are checked here rather than in the usage pattern, so that a missing one is named.
    missing = [flag for flag in ("--config", "--seeds", "--run-id") if args[flag] is None]
    if missing:
        print(
            f"error: {', '.join(missing)} missing: python -m lab.experiment --config=<path> --seeds=0-4 --run-id=<id> "
            "(--help explains every flag)",
            file=sys.stderr,
        )
        return 2
    try:
        seeds = parse_seeds(args["--seeds"])
        check_run_id(args["--run-id"])
        jobs = number(args, "--jobs", int, 1)
        threads = None if args["--threads"] is None else number(args, "--threads", int, 1)
        evaluation = Evaluation(number(args, "--eval-episodes", int, 1), bool(args["--deterministic"]))
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
    if threads is None:  # shared among the seeds that train at once
        threads = default_threads(max(1, min(jobs, sum(run.action in ("new", "resume") for run in runs))))

    # SIGINT explicitly too: a process started in the background of a script inherits SIGINT ignored, and Python then
    # leaves it ignored, so that `kill -INT` would not stop the experiment.
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
        for run in [run for run in runs if run.action == "finished"]:  # finished earlier
            settle(run, evaluation, device)
        run_seeds(
            runs, path, sets, config.updates, jobs, threads, bool(args["--cpu"]),
            lambda run: settle(run, evaluation, device, threads=1),
        )  # fmt: skip
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
    metric = evaluation_metric(finished)
    if threshold is None and metric == "success":
        threshold = SUCCESS_THRESHOLD
    results_dir = os.path.join(RESULTS_DIR, experiment_id)
    summary = {
        "run_id": experiment_id,
        "config": args["--config"],
        "overrides": sets,
        "seeds": seeds,
        "finished_seeds": [run.seed for run in finished],
        "other_recorded_seeds": other_recorded_seeds(results_dir, seeds),  # records there that this summary leaves out
        "metric": metric,
        "eval_episodes": evaluation.episodes,
        "evaluation_seed": EVALUATION_SEED,
        "deterministic": evaluation.deterministic,
        **aggregate(finished, metric, threshold),
        "failures": failures,
        "plot": os.path.join(results_dir, "curves.png"),
        "command": shlex.join(["python", "-m", "lab.experiment", *argv]),
    }
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "summary.json"), "w") as file:
        json.dump(summary, file, indent=1)
    experiment_figure(summary, summary["plot"])
    print_report(runs, summary)
    if summary["other_recorded_seeds"]:
        others = summary["other_recorded_seeds"]
        what = f"record of seed {others[0]}" if len(others) == 1 else f"records of seeds {', '.join(map(str, others))}"
        print(
            f"note: {results_dir} also holds the {what}, which this summary leaves out (it covers "
            f"--seeds={args['--seeds']}); name every seed in --seeds to summarise them together (finished seeds are "
            "not trained again)"
        )
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
