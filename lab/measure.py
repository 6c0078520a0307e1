"""Measuring one memory path's training in this process: environment steps per second of the rollout and of the
PPO epochs, peak memory, model FLOPs per environment step and their share of the machine's peak (a float32 matrix
product measured in the same run), and the share of the matrix-product rate of the dtype that ran (float32, or
bfloat16 where the machine has bfloat16 units) that the model's FLOPs counted from the config (lab/flops.py)
reach. ``python -m lab.benchmark`` runs it in a child process per path or memory, and
``python -m lab.benchmark --gpu-check`` (lab/gpu_check.py) for its steps/s table.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from config import load_config
from lab.flops import model_flops, share_of_rate
from model import bfloat16_is_fast
from ppo import forward_minibatch
from trainer import PPOTrainer


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB. On Linux the high-water mark of its own address space (VmHWM), which a
    new program starts afresh; getrusage's ru_maxrss, the fallback elsewhere, keeps the peak of the parent a child was
    forked from, so a child of a large process would report the parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_peak_gflops(device: torch.device, size: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Matrix-product GFLOP/s of this machine in ``dtype`` (best of ``repeats``)."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def count_flops(trainer: PPOTrainer) -> float:
    """Model MFLOP per environment step: one rollout forward per step, plus epochs x (forward + backward) per sample."""
    config = trainer.config
    model, collector = trainer.model, trainer.collector
    state = model.memory.start(config.n_workers, trainer.device)  # a scratch memory: the run's own stays as it is
    state.load_state_dict(collector.state.state_dict())
    model.memory.sync(state)  # the K/V cache is made once per rollout, not per step
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.act(collector.obs, state, lambda policy: policy.sample())
    rollout = counter.get_total_flops() / config.n_workers
    minibatches = trainer.buffer.minibatches(
        config.n_mini_batch, config.sequence_length, torch.Generator(), config.minibatch_sampling
    )
    minibatch = next(minibatches)
    with FlopCounterMode(display=False) as counter:
        out = forward_minibatch(model, minibatch)
        (out.value.sum() + out.policy.log_prob(minibatch.actions).sum()).backward()
    model.zero_grad(set_to_none=True)
    # Rows of single steps are padded: the padding's work is part of the cost of the minibatch's real steps.
    samples = minibatch.obs.shape[0] * minibatch.obs.shape[1] if minibatch.valid is None else int(minibatch.valid.sum())
    train = counter.get_total_flops() / samples * config.epochs
    return (rollout + train) / 1e6


def measure(config_path: str, overrides: dict, path: str, updates: int, device: torch.device) -> dict:
    """Time ``updates`` updates of one memory path (after one warm-up update) in this process, each the trainer's own
    (``PPOTrainer.train_update``: rollout, optimisation, observation statistics)."""
    config = load_config(config_path, {**overrides, "eval_interval": 0})
    folder = tempfile.mkdtemp(prefix="benchmark-")  # the run's model and summaries, removed afterwards
    trainer = PPOTrainer(config, "benchmark", device, 0, path, models_dir=folder, summaries_dir=folder)
    try:
        trainer.train_update()
        mflop = count_flops(trainer)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rollout_s = train_s = 0.0
        for _ in range(updates):
            seconds = trainer.train_update().seconds
            rollout_s += seconds["rollout"]
            train_s += seconds["optimize"]
    finally:
        trainer.close()
        shutil.rmtree(folder, ignore_errors=True)
    steps = updates * config.n_workers * config.worker_steps
    overall = steps / (rollout_s + train_s)
    peak = matmul_peak_gflops(device)
    peak_bf16 = matmul_peak_gflops(device, dtype=torch.bfloat16) if bfloat16_is_fast(device) else None
    flops = model_flops(config, trainer.model.observation_shape, trainer.model.actions)
    rate = peak_bf16 if trainer.model.compute_dtype == "bfloat16" else peak  # the products' dtype: what ran
    rates = {"rollout": steps / rollout_s, "train": steps / train_s, "total": overall}
    result = {
        "rollout_sps": rates["rollout"],
        "train_sps": rates["train"],
        "overall_sps": overall,
        "peak_rss_mb": peak_rss_mb(),
        "mflop_per_step": mflop,
        "peak_fraction": mflop * 1e6 * overall / (peak * 1e9),
        "matmul_gflops": peak,
        "compute_dtype": trainer.model.compute_dtype,
        "keeps_freed_memory": trainer.keeps_freed_memory,
        "matmul_bf16_gflops": peak_bf16,
        "model_mflop_per_step": {phase: flops[phase] / 1e6 for phase in ("rollout", "train", "total")},
        "share_of_dtype_matmul": {phase: share_of_rate(flops[phase], sps, rate) for phase, sps in rates.items()},
        "memory_length": config.transformer.memory_length,
        "workers": config.n_workers,
        "steps": config.worker_steps,
    }
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return result
