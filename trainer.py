"""PPOTrainer: the run loop. Builds the parts, then per update: collect a rollout, optimise, report, checkpoint.

The parts, each in its own module: rollout.py collects the data, ppo.py is the loss and the epochs, checkpoint.py the
training state a checkpoint holds, summaries.py what is reported, evaluation.py the evaluation on unseen episodes.
Every early stop (Ctrl-C, SIGTERM, a failing environment, a non-finite loss, any other error) keeps the last completed
update on disk.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

import observations
from buffer import Buffer
from checkpoint import Progress, atomic_save, model_file, restore_training, snapshot_training
from config import Config, ConfigError, check_memory_path
from distributed import SINGLE, Ranks, all_gather, check_identical, wait_for_main
from environments import agents_per_env
from evaluation import evaluate, metric_means, record_episode
from model import ActorCriticModel, runnable_compute_dtype
from normalization import RewardScaler
from ppo import NonFiniteError, PPOLearner
from rollout import RolloutCollector, RolloutStats
from summaries import Summaries, Tracker, console_line, evaluation_line
from worker import WorkerError, Workers, environment_processes, usable_cores

__all__ = ["PPOTrainer", "TrainingStopped", "UpdateResult", "check_memory_path"]

# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_USER_ALLOCATOR = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "LD_PRELOAD")


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of returning it to the system (Linux with glibc; elsewhere,
    or where the environment already sets glibc's malloc parameters or preloads an allocator, nothing changes).

    glibc gives every block above its mmap threshold (at most 32 MB by default) its own pages and returns them when the
    block is freed, so each minibatch's images, activations and gradients (hundreds of MB at 32 x 512 Mortar Mayhem
    Grid) start on fresh pages, and touching them costs a page fault every 4 KiB: about half the time of a large
    elementwise copy on the development CPU. Served from the heap and kept there, the freed blocks are reused by the
    next minibatch; what the process has taken is held until it exits (docs/performance.md). Returns whether the
    parameters were set."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _USER_ALLOCATOR):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False


EVALUATION_SEED = 0  # every training-time evaluation plays the same unseen episodes, so its curve compares like with like


class UpdateResult(NamedTuple):
    """What ``PPOTrainer.train_update`` did, for the update's log."""

    episodes: dict[str, list[float]]  # the episodes that ended in the rollout (of all ranks): metric -> values
    stats: dict[str, float]  # the optimisation's statistics (ppo.py)
    seconds: dict[str, float]  # "rollout": collecting it; "optimize": the rest (observation statistics, ranks' check)

    @property
    def means(self) -> dict[str, float]:
        """The mean of each metric over the episodes that ended (empty if none did)."""
        return {key: float(np.mean(values)) for key, values in self.episodes.items()}


class TrainingStopped(RuntimeError):
    """Training stopped early; a checkpoint of the last completed update exists (unless it stopped before the first)."""


class PPOTrainer:
    """Trains one config: ``PPOTrainer(...).run()``.

    After every update (and before the first) the trainer takes a snapshot of the training state (checkpoint.py). It
    is written to ``models/<run-id>/checkpoint.pt`` every ``checkpoint_interval`` updates, at the end, and whenever
    training stops early, so a stop never loses more than the update in progress. With several processes the snapshot
    is taken (gathered from all of them) only every ``checkpoint_interval`` updates and at the end, so an early stop
    keeps the last of those.
    """

    def __init__(
        self,
        config: Config,
        run_id: str,
        device: torch.device,
        seed: int = 0,
        memory_path: str = "fast",
        models_dir: str = "models",
        summaries_dir: str = "summaries",
        checkpoint: dict | None = None,
        ranks: Ranks = SINGLE,
    ) -> None:
        """Build workers, model, learner, buffer and memory; with ``checkpoint``, continue that run exactly. With
        ``ranks`` of several processes (distributed.py) this process trains its share of the ``n_workers`` lanes and
        rank 0 alone writes files; on the CPU the process keeps the memory it frees (``keep_freed_memory``)."""
        check_memory_path(memory_path, config)
        check_ranks(config, ranks)
        self.keeps_freed_memory = device.type == "cpu" and keep_freed_memory()
        self.config = config
        self.device = device
        self.ranks = ranks
        self.model_path = os.path.join(models_dir, f"{run_id}.nn")
        self.checkpoint_path = os.path.join(models_dir, run_id, "checkpoint.pt")
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)

        lanes = ranks.lanes(config.n_workers)
        n = len(lanes)  # this process's workers
        cores = max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # this rank's share of the machine
        environments = n // agents_per_env(config.environment)
        n_processes = environment_processes(config.n_processes, environments, device.type, cores, ranks.world)
        self.workers = Workers(config.environment, n, n_processes, seed, first_lane=lanes.start)
        obs_shape = observations.shape_of(self.workers.observation_space)
        actions = self.workers.action_spec
        try:
            self.model = make_model(config, obs_shape, actions, memory_path, device, ranks.main)
        except ValueError as error:  # e.g. an option the model does not implement for these observations
            self.workers.close()
            raise ConfigError(f"the model cannot be built for this environment: {error}") from None
        if config.compile:
            self.model.compile_modules()
        self.learner = PPOLearner(self.model, config, generator, ranks)
        trace = self.model.memory.trace(n, config.worker_steps, device)
        self.buffer = Buffer(
            n, config.worker_steps, obs_shape, self.model.storage_dtype, actions.width, trace, device,
            torch.float32 if actions.continuous else torch.long,
        )  # fmt: skip
        scaler = RewardScaler(n, config.gamma, config.normalize_clip, device) if config.normalize_rewards else None
        self.collector = RolloutCollector(
            self.model, self.workers, self.buffer, config.gamma, config.lamda, device, ranks.rows(config.n_workers),
            scaler, ranks,
        )  # fmt: skip
        if checkpoint is not None:
            checkpoint = shard_of(checkpoint, ranks, self.workers.agents, config.n_workers)
        if checkpoint is None:
            summary_dir = os.path.join(summaries_dir, run_id, time.strftime("%Y%m%d-%H%M%S"))
            self.progress = Progress(run_id, seed, memory_path, summary_dir)
            self.collector.start(self.workers.reset())
            self.collector.start_observation_statistics(seed, config.normalize_one_hot)
        else:
            self.progress = restore_training(
                checkpoint, self.model, self.learner.optimizer, generator, self.collector.state, trace, scaler
            )
            self.collector.resume(checkpoint["workers"])
        self.summary_dir = self.progress.summary_dir
        self.summaries = None
        if ranks.main:  # rank 0 alone reports: to TensorBoard and, with track, to Weights & Biases
            self.summaries = Summaries(self.summary_dir, start_tracking(config, self.progress, self.workers))
            self.summaries.write_config(config.to_dict(), " ".join(sys.argv), {"compute_dtype": self.model.compute_dtype})
        check_identical(self.model, ranks)
        self.snapshot: dict | None = None

    @property
    def update(self) -> int:
        """Completed updates."""
        return self.progress.update

    @property
    def env_steps(self) -> int:
        """Environment steps of all workers so far."""
        return self.progress.env_steps

    def snapshot_state(self) -> dict | None:
        """The training state now, copied (checkpoint.snapshot_training); with several processes every rank's
        environment and memory state, gathered on rank 0 (None on the other ranks)."""
        return snapshot_training(
            self.progress, self.config, self.model, self.learner.optimizer, self.learner.generator,
            self.workers.state(), self.collector.state, self.buffer.trace, self.ranks, self.collector.reward_scaler,
        )  # fmt: skip

    def rollout(self) -> RolloutStats:
        """Collect one rollout into the buffer; with several processes, the finished episodes of all of them."""
        stats = self.collector.collect()
        self.progress.env_steps += self.config.n_workers * self.config.worker_steps
        return RolloutStats(merge_episodes(all_gather(stats.episodes, self.ranks))) if self.ranks.distributed else stats

    def train_update(self) -> UpdateResult:
        """One update's work, for run and the lab alike: rollout, optimisation, observation statistics, the ranks' check."""
        start = time.perf_counter()
        rollout = self.rollout()
        middle = finished(self.device)  # the rollout's last kernels (returns, advantages) count as rollout time
        stats = self.learner.optimize(self.buffer, self.update)
        self.collector.update_observation_statistics()
        check_identical(self.model, self.ranks)
        return UpdateResult(rollout.episodes, stats, {"rollout": middle - start, "optimize": finished(self.device) - middle})

    def log(self, done: UpdateResult) -> str:
        """Write the summaries of the update in progress; returns its console line."""
        sps = self.config.n_workers * self.config.worker_steps / sum(done.seconds.values())
        if self.summaries is not None:
            self.summaries.update(self.progress.env_steps, done.episodes, done.stats, sps, done.seconds)
        return console_line(self.update + 1, self.config.updates, self.progress.env_steps, sps, done.means, done.stats)

    def evaluate(self) -> dict[str, float] | None:
        """Rank 0: evaluate on the fixed set of unseen episodes, log under ``evaluation/`` and print the means, which
        it returns (None on the other ranks, which wait for it: ``distributed.wait_for_main``)."""
        means = None
        if self.ranks.main:
            print(f"  evaluating {self.config.eval_episodes} unseen episodes ...", end="", flush=True)
            results = evaluate(self.model, self.config, self.device, self.config.eval_episodes, seed=EVALUATION_SEED)
            means = metric_means(results)
            self.summaries.evaluation(self.progress.env_steps, means)
            if video_due(self.config, self.update):
                frames = record_episode(self.model, self.config, self.device, EVALUATION_SEED)
                self.summaries.video("evaluation/episode", frames, self.progress.env_steps)
            print(" " + evaluation_line(means))
        wait_for_main(self.ranks)
        return means

    def run(self, log_every: int = 1, before_update: Callable[[], None] | None = None) -> dict[str, float]:
        """Train until ``updates``, calling ``before_update`` before each; returns the last episode means.

        Stops early with ``TrainingStopped`` on SIGINT/SIGTERM or any error, after writing the snapshot of the last
        completed update as checkpoint and model file.
        """
        config = self.config
        last_means: dict[str, float] = {}
        start, start_update = time.time(), self.update
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, _raise_interrupt)
        try:
            self.snapshot = self.snapshot_state()
            while self.update < config.updates:
                if before_update is not None:
                    before_update()
                done = self.train_update()
                line = self.log(done)
                self.progress.update += 1
                due = bool(config.checkpoint_interval) and self.update % config.checkpoint_interval == 0
                if not self.ranks.distributed or due or self.update == config.updates:
                    # Several processes gather their states only for a checkpoint: gloo keeps state for every new
                    # tensor it moves, so gathering them after every update made rank 0 grow with each update.
                    self.snapshot = self.snapshot_state()
                if due:
                    save_snapshot(self.snapshot, self.checkpoint_path, self.model_path)
                last_means = done.means or last_means
                if self.ranks.main and config.compile and self.update == start_update + 1:
                    print(f"  the first update took {sum(done.seconds.values()):.0f}s, torch.compile's compilation included")
                if self.ranks.main and (self.update % log_every == 0 or self.update == config.updates):
                    elapsed = time.time() - start
                    left = elapsed / (self.update - start_update) * (config.updates - self.update)
                    print(f"{line}  [{elapsed:5.0f}s, ~{left:.0f}s left]", flush=True)
                if config.eval_interval and (self.update % config.eval_interval == 0 or self.update == config.updates):
                    self.evaluate()
            save_snapshot(self.snapshot, self.checkpoint_path, self.model_path)
            if self.ranks.main:
                self.summaries.hparams(config.to_dict(), last_means, self.progress.env_steps, self.model.compute_dtype)
        except (KeyboardInterrupt, Exception) as error:
            self._stop(error)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()
        return last_means

    def _stop(self, error: BaseException) -> None:
        """Keep the last completed update on disk, then raise TrainingStopped explaining why and how to go on. A run
        that completed no update writes nothing, so that nothing refuses the same command once the cause is fixed."""
        done = 0 if self.snapshot is None else self.snapshot["update"]
        if done:
            save_snapshot(self.snapshot, self.checkpoint_path, self.model_path)
        message = stop_message(error, self.ranks, self.update, self.config.updates)
        raise TrainingStopped(f"{message}\n{how_to_go_on(done, self.ranks, self.checkpoint_path)}") from error

    def close(self) -> None:
        """Stop the workers and flush the summaries."""
        self.workers.close()
        if self.summaries is not None:
            self.summaries.close()


def start_tracking(config: Config, progress: Progress, workers: Workers) -> Tracker | None:
    """The run's W&B run where ``track`` asks for one; where it cannot start, the workers stop and its ConfigError
    says why."""
    if not config.track:
        return None
    try:
        return Tracker(config.wandb_project, config.wandb_entity, progress.run_id, progress.seed, progress.summary_dir)
    except ConfigError:
        workers.close()
        raise


def video_due(config: Config, update: int) -> bool:
    """Whether the evaluation after update ``update`` records a video: every ``video_interval``-th evaluation (the
    updates that are multiples of eval_interval x video_interval) and the last, so a run ends with a video of its
    final agent. Counted by updates, a resumed run keeps the rhythm."""
    every = config.eval_interval * config.video_interval
    return bool(every) and (update % every == 0 or update == config.updates)


def make_model(
    config: Config, obs_shape: observations.Shape, actions: object, memory_path: str, device: torch.device, say: bool
) -> ActorCriticModel:
    """The run's model on ``device``, computing in the dtype that runs there: bfloat16 falls back to float32 on a CPU
    without bfloat16 units (model.py), which ``say`` prints."""
    compute_dtype = runnable_compute_dtype(config.compute_dtype, device, say)
    return ActorCriticModel(config, obs_shape, actions, memory_path, compute_dtype).to(device)


def finished(device: torch.device) -> float:
    """``time.perf_counter()`` once the kernels queued on a CUDA ``device`` have run, so that a time includes them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def save_snapshot(snapshot: dict | None, checkpoint_path: str, model_path: str) -> None:
    """Write a snapshot as the run's checkpoint and as its model file (what enjoy.py takes), each atomically (rank 0
    only: the others hold None). Every checkpoint comes with its model file, so a run killed at any moment (a rank
    stuck in a CUDA synchronisation under NCCL included) leaves both of its last checkpoint."""
    if snapshot is not None:
        atomic_save(snapshot, checkpoint_path)
        atomic_save(model_file(snapshot), model_path)


def merge_episodes(parts: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """The finished episodes of several processes (metric name -> values) as one."""
    episodes: dict[str, list[float]] = {}
    for part in parts:
        for key, values in part.items():
            episodes.setdefault(key, []).extend(values)
    return episodes


def stop_message(error: BaseException, ranks: Ranks, update: int, updates: int) -> str:
    """Why and when training stopped (``update`` updates completed): an expected stop with its error's message (a
    ConfigError's or an ObservationError's is complete: where, what and the fix), anything else with its traceback."""
    known = {
        KeyboardInterrupt: "interrupted",
        WorkerError: "an environment worker failed",
        NonFiniteError: "a non-finite loss or gradient",
        ConfigError: "the config does not fit",
        observations.ObservationError: "an observation does not fit its space",
    }
    reason = known.get(type(error), f"an unexpected error ({type(error).__name__})")
    where = f" on rank {ranks.rank} of {ranks.world}" if ranks.distributed else ""
    if update < updates:
        during = f"during update {update + 1} of {updates}"
    else:  # every update is done: the final evaluation or the writing of the files was stopped
        during = f"after the last update ({updates}), during the final evaluation or saving"
    message = f"training stopped{where}: {reason} {during}"
    if type(error) not in known:
        # Not one of the expected ways to stop: show where it happened.
        message += f"\n{''.join(traceback.format_exception(error)).rstrip()}"
    elif not isinstance(error, KeyboardInterrupt):
        message += f": {error}"
    return message


def how_to_go_on(done: int, ranks: Ranks, checkpoint_path: str) -> str:
    """The last line of a stop's message: what it kept and how to go on, ``done`` being the update of the snapshot it
    wrote. Where no update completed nothing was written, and no --resume is offered: the same command runs again."""
    if not ranks.main:
        return "kept what rank 0 wrote (its message says how to go on)"
    if not done:
        return "no update completed, so no checkpoint was written: run the same command again once the cause is fixed"
    return f"kept {checkpoint_path} (after update {done}); continue with: python train.py --resume={checkpoint_path}"


def check_ranks(config: Config, ranks: Ranks) -> None:
    """Raises ConfigError unless every process gets the same number of whole environments' lanes."""
    if not ranks.distributed:
        return
    agents = agents_per_env(config.environment)
    if config.n_workers % (ranks.world * agents):
        raise ConfigError(
            f"'n_workers' ({config.n_workers}) must split evenly over the {ranks.world} processes"
            + (f", in whole environments of {agents} agents" if agents > 1 else "")
            + f": use a multiple of {ranks.world * agents}, or another --nproc_per_node"
        )


def shard_of(checkpoint: dict, ranks: Ranks, agents: int, n_workers: int) -> dict:
    """The checkpoint as this rank restores it: its environments' states and its memory's, checked for the world size.
    A plain run's checkpoint holds one process's state as it is; a process group's (torchrun, even of one process)
    holds a shard per rank, and one process of either kind resumes the other's.

    Raises:
        ValueError: If the checkpoint was written by another number of processes.
    """
    saved = checkpoint.get("world_size", 1)
    if saved != ranks.world:
        raise ValueError(
            f"the checkpoint was written by {saved} process(es) and this run has {ranks.world}: each holds its own "
            f"workers' memory, so resume with --nproc_per_node={saved} (or {saved} processes in all)"
        )
    if "world_size" not in checkpoint:  # a plain run's: one process, so this run too has one
        return checkpoint
    lanes = ranks.lanes(n_workers)
    environments = slice(lanes.start // agents, lanes.stop // agents)
    shard = {
        **checkpoint,
        "workers": checkpoint["workers"][environments],
        "memory": checkpoint["memory"][ranks.rank],
        "trace": checkpoint["trace"][ranks.rank],
    }
    if "rewards" in checkpoint:  # the statistics are every rank's; the running returns are this rank's workers'
        shard["rewards"] = {**checkpoint["rewards"], "returns": checkpoint["rewards"]["returns"][ranks.rank]}
    own = (checkpoint.get("cuda_rng") or [None] * ranks.world)[ranks.rank]
    if own is not None:  # the generator of this rank's GPU, not rank 0's view of every device
        shard["rng"] = {**checkpoint["rng"], "cuda_device": own}
    return shard


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM both stop training through the same path as Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")
