"""Train a PPO agent with an episodic Transformer-XL memory.

With torchrun (``torchrun --nproc_per_node=P train.py ...``) P processes train one policy, see distributed.py.

Usage:
  train.py [options] [--set=<key=value>]...
  train.py (-h | --help)

Options:
  --config=<path>       YAML config (keys: docs/configuration.md); not with --resume (default: configs/poc_memory_env.yaml).
  --run-id=<id>         Name of the run: summaries go to summaries/<id>/<time>/, the model to models/<id>.nn, checkpoints
                        to models/<id>/checkpoint.pt; while it trains, models/<id>.lock refuses every other train.py of
                        this id (and names the process training it) [default: run].
  --resume=<path>       Continue the run saved in this checkpoint: its config, run id, seed and summaries (--set still
                        applies, e.g. --set updates=400 to train longer).
  --overwrite           Start a new run even where models/<id>.nn or models/<id>/checkpoint.pt exists, replacing them;
                        without it train.py refuses to start over an earlier run's files. Not over a run that is
                        training (models/<id>.lock held).
  --cpu                 Use the CPU even where CUDA is available (CUDA is used where it is).
  --seed=<n>            Seed of the model, the action sampling, the minibatch order and the environments (episode k of
                        worker i is reset with a seed hashed from the seed, i and k) [default: 0].
  --memory-path=<path>  "fast" (K/V cache in rollouts, banded attention in training) or "plain" (the per-window
                        specification, which has no gradients into the memory: with it set
                        transformer.memory_gradients=false) (default: "fast", or the checkpoint's on resume).
  --set=<key=value>     Override a config key, repeatable, nested with dots, e.g. --set updates=10 and
                        transformer.memory_length=16; values are YAML, an empty value is the empty string.
  --track               Log the run to Weights & Biases as well (sets the config key track; needs pip install wandb):
                        the scalars, the resolved config, the git commit and the seed, under the run id; on resume it
                        continues the same W&B run; WANDB_MODE=offline keeps it on this machine.
  --threads=<n>         CPU threads of torch: where other trainings share the machine, give each its share of the cores
                        (default: OMP_NUM_THREADS, else one per core that the load average leaves free, at least 1,
                        looked at again between updates).
  -h --help             Show this help.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time

import torch

import distributed
from checkpoint import check_resume, load_file
from cli import ROOT, RunInUse, RunLock, parse_args, shipped_path
from config import (
    ConfigError,
    apply_overrides,
    load_config,
    parse_overrides,
    resumable,
    validate_config,
)
from distributed import SINGLE, Ranks, all_gather
from observations import ObservationError
from summaries import import_wandb
from trainer import PPOTrainer, TrainingStopped, check_memory_path
from worker import WorkerError, usable_cores

MIN_FREE_MB = 100  # refuse to start with less free disk space than this for models and summaries
DEFAULT_CONFIG = "configs/poc_memory_env.yaml"
MODELS_DIR, SUMMARIES_DIR = "models", "summaries"  # relative to the current folder, as PPOTrainer's defaults


def check_writable(folder: str) -> None:
    """Fail now, not after an hour of training, if ``folder`` cannot take files."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        raise OSError(f"cannot write to '{folder}/' ({error.strerror}): fix its permissions or run elsewhere") from None
    free_mb = shutil.disk_usage(folder).free / 2**20
    if free_mb < MIN_FREE_MB:
        raise OSError(f"only {free_mb:.0f} MB free for '{folder}/' (at least {MIN_FREE_MB} MB needed): free some disk space")


def check_new_run(run_id: str) -> None:
    """Refuse to start a new run over the files of an earlier run with the same id (ValueError naming the ways on)."""
    checkpoint_path = os.path.join(MODELS_DIR, run_id, "checkpoint.pt")
    found = [path for path in (os.path.join(MODELS_DIR, f"{run_id}.nn"), checkpoint_path) if os.path.exists(path)]
    if found:
        raise ValueError(
            f"run '{run_id}' exists already ({' and '.join(found)}): continue it with --resume={checkpoint_path}, "
            f"start it over with --overwrite (replaces its files), or choose another --run-id"
        )


def config_path(path: str | None) -> str:
    """The config file to read: ``path`` (default DEFAULT_CONFIG), a shipped configs/... path found from any folder."""
    path = shipped_path(path or DEFAULT_CONFIG)
    if not os.path.isfile(path) and not os.path.isabs(path):
        raise ConfigError(
            f"config file '{path}' does not exist in {os.getcwd()}: relative paths are read from the current folder; "
            f"run from the repository root ({ROOT}) or pass the file's full path"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    """Run train.py with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit code.

    Started by torchrun (as one of several processes, or alone), it joins their process group first, leaves it at the end and
    ends the process with the exit code (``distributed.leave``) instead of returning.
    """
    if not distributed.launched():
        with contextlib.ExitStack() as held:
            return train(argv, SINGLE, held)
    args = parse_args(__doc__, argv)
    device_type = "cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu"
    try:
        ranks = distributed.start(device_type)
    except distributed.LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        distributed.leave(2)
    try:
        if not ranks.main:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - rank 0 reports progress; errors still reach stderr
        with contextlib.ExitStack() as held:
            code = train(argv, ranks, held)
    finally:
        distributed.stop()
    distributed.leave(code)  # everything is saved and closed: skip the shutdown that sometimes aborts (see leave)


LOAD_CHECK_SECONDS = 30  # how often a training whose threads follow the load looks at it again (between updates)


def load_average() -> float:
    """The 1-minute load average (0 where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def default_threads(trainings: int = 1, load: float | None = None, most: int | None = None) -> int:
    """torch's CPU threads of each of ``trainings`` trainings started side by side (lab.tune's seeds, lab.experiment's
    jobs) where neither --threads nor OMP_NUM_THREADS says: the cores that the load of other processes leaves free,
    shared among them, at least 1 each and at most ``most`` (default: torch's own count). ``load`` is that load
    (default: the 1-minute load average, which before the trainings start is the others'). Threads of trainings that
    share cores spin while they wait for each other: three proof-of-memory trainings side by side on 2 cores took over
    30 s per update with 2 threads each and 2.6 s with 1 (docs/troubleshooting.md)."""
    free = usable_cores() - round(load_average() if load is None else load)
    return max(1, min(most or torch.get_num_threads(), free // trainings))


class LoadThreads:
    """torch's threads of a training that chose them by the load, decided again between updates every
    LOAD_CHECK_SECONDS: a training started alone takes the free cores, leaves them to trainings started beside it
    later (it gives up the cores their load takes), and takes them back, up to its first choice, once they end. The
    load it weighs is the others': the load average less this process's own CPU use since it last looked, so that its
    own threads do not count against it. The whole process shares one choice: torch takes it on the main thread, the
    one that trains."""

    def __init__(self) -> None:
        self.most = self.threads = default_threads()
        torch.set_num_threads(self.threads)
        self.looked, self.cpu = time.monotonic(), time.process_time()

    def look(self) -> None:
        """Decide again if LOAD_CHECK_SECONDS passed since the last look, and say so where the choice changes."""
        now = time.monotonic()
        if now - self.looked < LOAD_CHECK_SECONDS:
            return
        cpu = time.process_time()  # every thread of this process
        others = max(0.0, load_average() - (cpu - self.cpu) / (now - self.looked))
        self.looked, self.cpu = now, cpu
        threads = default_threads(load=others, most=self.most)
        if threads != self.threads:
            print(f"  threads {self.threads} -> {threads}: other processes keep {others:.1f} of {usable_cores()} cores busy",
                  flush=True)  # fmt: skip
            self.threads = threads
            torch.set_num_threads(threads)


def hold_run(run_id: str, argv: list[str] | None, ranks: Ranks, held: contextlib.ExitStack) -> None:
    """Lock ``run_id`` for this command (``cli.RunLock``, held by rank 0 for every rank) until ``held`` closes, and
    meanwhile take SIGTERM as Ctrl-C, so that every way out of train.py releases the lock.

    Raises:
        RunInUse: On every rank, where another process is training the run.
    """
    refusal = None
    if ranks.main:
        lock = RunLock(MODELS_DIR, run_id, shlex.join(["python", "train.py", *(sys.argv[1:] if argv is None else argv)]))
        try:
            note = lock.acquire()
        except RunInUse as error:
            refusal = str(error)
        else:
            held.callback(lock.release)
            if note:
                print(note, flush=True)
    if ranks.distributed:  # the other ranks learn rank 0's answer, or they would go on and wait for it
        refusal = all_gather(refusal, ranks)[0]
    if refusal is not None:
        raise RunInUse(refusal)
    held.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, signal.default_int_handler))


def train(argv: list[str] | None, ranks: Ranks, held: contextlib.ExitStack) -> int:
    """train.py's work in this process, one of ``ranks``; returns the exit code. What it holds until the end (the
    run's lock) goes on ``held``, which the caller closes on every way out."""
    args = parse_args(__doc__, argv)
    try:
        seed = int(args["--seed"])
    except ValueError:
        print(f"error: --seed must be an integer, got '{args['--seed']}'", file=sys.stderr)
        return 2
    load_threads = None
    if args["--threads"] is not None:
        if not args["--threads"].isdigit() or int(args["--threads"]) < 1:
            print(f"error: --threads must be a whole number >= 1, got '{args['--threads']}'", file=sys.stderr)
            return 2
        torch.set_num_threads(int(args["--threads"]))
        why = "--threads"
    elif "OMP_NUM_THREADS" not in os.environ:
        load_threads = LoadThreads()
        why = "one per core the load leaves free, looked at again between updates"
    else:
        why = "OMP_NUM_THREADS"
    threads = f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''} ({why})"
    resume = args["--resume"]
    if resume and args["--config"] is not None:
        print(
            f"error: --config does not go with --resume: a resumed run keeps the config saved in {resume}; "
            "--set still applies on resume (e.g. --set updates=400 to train longer)",
            file=sys.stderr,
        )
        return 2
    if resume and args["--overwrite"]:
        print("error: --overwrite starts a new run over an old one's files; it does not go with --resume", file=sys.stderr)
        return 2
    checkpoint, run_id = None, args["--run-id"]
    try:
        overrides = parse_overrides(args["--set"])
        if args["--track"]:
            overrides["track"] = True
        if resume:
            checkpoint = load_file(resume)
            if checkpoint.get("kind") != "checkpoint":
                raise ValueError(f"'{resume}' is a model file, not a checkpoint: use models/<run-id>/checkpoint.pt")
            config = validate_config(apply_overrides(resumable(checkpoint["config"]), overrides))
            check_resume(checkpoint, config.to_dict())
            run_id, seed = checkpoint["run_id"], checkpoint["seed"]
            memory_path = args["--memory-path"] or checkpoint.get("memory_path", "fast")
            source = f"checkpoint {resume} (update {checkpoint['update']})"
        else:
            path = config_path(args["--config"])
            config = load_config(path, overrides)
            memory_path = args["--memory-path"] or "fast"
            source = path
        check_memory_path(memory_path, config)
        if config.track:
            import_wandb()  # where it is missing, say so before anything starts
        if checkpoint is not None and checkpoint["update"] >= config.updates:
            print(
                f"nothing to do: {resume} holds update {checkpoint['update']} and the run has updates = {config.updates}. "
                f"To train longer: python train.py --resume={resume} --set updates=N (N > {checkpoint['update']})"
            )
            return 0
        check_writable(MODELS_DIR)  # where the run's lock goes
        hold_run(run_id, argv, ranks, held)
        if checkpoint is None and not args["--overwrite"]:
            check_new_run(run_id)
        check_writable(SUMMARIES_DIR)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RunInUse) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if torch.cuda.is_available() and not args["--cpu"]:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    processes = ""
    if ranks.distributed:
        plural, workers = "es" if ranks.world > 1 else "", config.n_workers // ranks.world
        processes = f" on {ranks.world} process{plural} ({workers} workers each, {distributed.backend()})"
    print(f"training {run_id} on {device.type}{processes} from {source}, memory path {memory_path}, {threads}", flush=True)
    try:
        trainer = PPOTrainer(config, run_id, device, seed, memory_path, checkpoint=checkpoint, ranks=ranks)
    except (WorkerError, ObservationError) as error:
        print(f"error: the environment failed to start: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted while training was starting", file=sys.stderr)
        return 130
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as error:
        if checkpoint is None:
            raise
        print(f"error: the checkpoint does not fit this environment or config: {error}", file=sys.stderr)
        return 2
    print(f"summaries: {trainer.summary_dir} (tensorboard --logdir {SUMMARIES_DIR})", flush=True)
    try:
        trainer.run(before_update=None if load_threads is None else load_threads.look)
    except TrainingStopped as error:
        print(error, file=sys.stderr)
        print(f"summaries: {trainer.summary_dir}", file=sys.stderr)
        return 130 if isinstance(error.__cause__, KeyboardInterrupt) else 1
    print(f"saved {trainer.model_path} and {trainer.checkpoint_path}; summaries in {trainer.summary_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
