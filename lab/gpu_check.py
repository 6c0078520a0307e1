"""The one command for a machine with a GPU (``python -m lab.benchmark --gpu-check``): does everything work there, and how
fast is it? With ``--cpu`` the same checks run on the CPU, so that CI runs them and on a GPU only the device differs.

Checks, each true or false in the JSON last line:
- ``poc_learns``: the proof-of-memory task trained on the device reaches a training success of at least 0.9;
- ``fast_equals_plain``: on a rollout collected on the device, the fast and the plain memory path give the same
  logits and values, and both reproduce the rollout's values (PPO ratios start at 1);
- ``cpu_matches_device``: the same weights and minibatch give the same loss on the CPU and on the device (TF32 off);
- ``bfloat16``: two updates with ``compute_dtype: bfloat16`` give finite losses;
- ``compile``: two updates with ``compile: true`` run compiled graphs (not a silent fallback to eager);
- ``torchrun``: train.py through torchrun in a process group (NCCL on CUDA, gloo on the CPU) writes its model: two
  processes on a machine with two GPUs or more, else one (its collectives then run over one rank, through NCCL still).
Then a table: steps/s and peak GPU memory (peak resident memory on the CPU) of the Mortar Mayhem Grid config at each
size for TrXL and GRU.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

from cli import ROOT
from config import load_config
from lab.measure import measure
from model import ActorCriticModel
from ppo import forward_minibatch, ppo_loss
from trainer import PPOTrainer

POC = os.path.join(ROOT, "configs", "poc_memory_env.yaml")
TABLE_CONFIG = os.path.join(ROOT, "configs", "mortar_mayhem_grid.yaml")
POC_UPDATES = 15  # the shipped config's seeds reach success 0.9 after 4-5 updates (docs/results.md)
TOLERANCE = 1e-4
SMALL = {"n_workers": 4, "worker_steps": 32, "n_mini_batch": 2, "updates": 2, "eval_interval": 0}


def trainer(device: torch.device, folder: str, path: str = "fast", **overrides: object) -> PPOTrainer:
    """A PoC trainer on ``device`` writing into ``folder``."""
    config = load_config(POC, {"eval_interval": 0, "checkpoint_interval": 0, **overrides})
    return PPOTrainer(config, "gpu-check", device, 0, path, models_dir=folder, summaries_dir=folder)


def to_device(value: object, device: torch.device) -> object:
    """Tensors, and NamedTuples or dicts of them (a minibatch and its memory context), moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(item, device) for item in value))
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


def poc_learns(device: torch.device, folder: str) -> tuple[bool, dict]:
    run = trainer(device, folder, updates=POC_UPDATES)
    start = time.perf_counter()
    means = run.run(log_every=10**9)
    success = float(means.get("success", 0.0))
    return success >= 0.9, {
        "success": round(success, 3),
        "updates": POC_UPDATES,
        "seconds": round(time.perf_counter() - start, 1),
    }


def paths_agree(device: torch.device, folder: str) -> tuple[bool, dict]:
    fast_trainer = trainer(device, folder, **SMALL)
    try:
        fast_trainer.rollout()
        fast = fast_trainer.model
        config = fast_trainer.config
        plain = ActorCriticModel(config, fast.observation_shape, fast.actions, "plain").to(device)
        plain.load_state_dict(fast.state_dict())
        worst = {"paths": 0.0, "rollout": 0.0}
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for minibatch in fast_trainer.buffer.minibatches(config.n_mini_batch, config.sequence_length, generator):
                a, b = forward_minibatch(fast, minibatch), forward_minibatch(plain, minibatch)
                logits = [(x - y).abs().max().item() for x, y in zip(a.policy.logits, b.policy.logits, strict=True)]
                worst["paths"] = max(worst["paths"], *logits, (a.value - b.value).abs().max().item())
                worst["rollout"] = max(worst["rollout"], (a.value - minibatch.values).abs().max().item())
    finally:
        fast_trainer.close()
    return max(worst.values()) < TOLERANCE, {key: float(f"{value:.2e}") for key, value in worst.items()}


def cpu_matches(device: torch.device, folder: str) -> tuple[bool, dict]:
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    run = trainer(device, folder, **SMALL)
    try:
        run.rollout()
        minibatch = next(iter(run.buffer.minibatches(run.config.n_mini_batch, run.config.sequence_length, torch.Generator())))
        losses = []
        for target in (device, torch.device("cpu")):
            model = run.model.to(target)
            with torch.no_grad():
                batch = to_device(minibatch, target)
                loss, _ = ppo_loss(forward_minibatch(model, batch), batch, 0.2, 1e-3, 0.25, run.config.normalize_advantages)
            losses.append(loss.item())
    finally:
        run.close()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    difference = abs(losses[0] - losses[1])
    return difference < TOLERANCE, {
        "loss_device": round(losses[0], 6),
        "loss_cpu": round(losses[1], 6),
        "difference": difference,
    }


def finite_updates(device: torch.device, folder: str, **overrides: object) -> tuple[bool, dict]:
    run = trainer(device, folder, **SMALL, **overrides)
    try:
        losses = []
        for _ in range(2):
            run.rollout()
            stats = run.learner.optimize(run.buffer, run.update)
            losses.append(stats["policy_loss"] + stats["value_loss"])
    finally:
        run.close()
    return all(map(math.isfinite, losses)), {"losses": [round(x, 5) for x in losses]}


def compiled(device: torch.device, folder: str) -> tuple[bool, dict]:
    from torch._dynamo.utils import counters

    counters.clear()
    finite, details = finite_updates(device, folder, compile=True)
    graphs = int(counters["stats"]["unique_graphs"])
    return finite and graphs > 0, {**details, "compiled_graphs": graphs}


def torchrun(device: torch.device, folder: str) -> tuple[bool, dict]:
    processes = 2 if device.type == "cuda" and torch.cuda.device_count() >= 2 else 1
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        os.path.join(ROOT, "train.py"),
    ]
    command += [f"--config={POC}", "--run-id=torchrun", *[f"--set={key}={value}" for key, value in SMALL.items()]]
    command += ["--cpu"] if device.type == "cpu" else []
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    written = os.path.isfile(os.path.join(folder, "models", "torchrun.nn"))
    # train.py names the process group it trained in: "on P process(es) (N workers each, BACKEND)"
    group = re.search(r" on (\d+) process(?:es)? \(\d+ workers each, (\w+)\)", result.stdout)
    joined = (int(group[1]), group[2]) if group else (0, None)
    expected = (processes, "nccl" if device.type == "cuda" else "gloo")
    return result.returncode == 0 and written and joined == expected, {
        "processes": joined[0],
        "backend": joined[1],
        "exit_code": result.returncode,
        "tail": result.stderr[-300:],
    }


def table(device: torch.device, sizes: list[tuple[int, int]]) -> list[dict]:
    """Steps/s and peak memory of the Mortar Mayhem Grid config for TrXL and GRU at each (workers, steps) size: one
    update after a warm-up one, as lab/benchmark.py measures a path (lab/measure.py)."""
    rows = []
    for workers, steps in sizes:
        for memory in ("trxl", "gru"):
            size = {"n_workers": workers, "worker_steps": steps, "n_mini_batch": 8, "sequence_length": 0}
            result = measure(TABLE_CONFIG, {**size, "memory": memory}, "fast", 1, device)
            sps, peak = round(result["overall_sps"], 1), round(result.get("peak_cuda_mb", result["peak_rss_mb"]), 1)
            rows.append({"memory": memory, "workers": workers, "steps": steps, "sps": sps, "peak_mb": peak})
            print(f"  {memory:4s} {workers:3d} x {steps:4d}: {sps:9.1f} steps/s, peak {peak:8.1f} MB")
    return rows


CHECKS = {
    "poc_learns": poc_learns,
    "fast_equals_plain": paths_agree,
    "cpu_matches_device": cpu_matches,
    "bfloat16": lambda device, folder: finite_updates(device, folder, compute_dtype="bfloat16"),
    "compile": compiled,
    "torchrun": torchrun,
}


def run_checks(device: torch.device, sizes: list[tuple[int, int]]) -> dict:
    """Run every check and the table; prints a line per check and returns the summary (the JSON last line)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu check on {name} (torch {torch.__version__})", flush=True)
    started = time.perf_counter()
    checks, details = {}, {}
    for check, function in CHECKS.items():
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
            try:
                checks[check], details[check] = function(device, folder)
            except Exception as error:  # a check that crashes fails; the others still run
                checks[check], details[check] = False, {"error": f"{type(error).__name__}: {error}"}
        print(f"  {check:20s} {'ok' if checks[check] else 'FAILED'}  {json.dumps(details[check])}", flush=True)
    print(f"steps/s and peak memory, {os.path.relpath(TABLE_CONFIG, ROOT)}:", flush=True)
    rows = table(device, sizes)
    return {
        "device": name,
        "torch": torch.__version__,
        "checks": checks,
        "passed": all(checks.values()),
        "details": details,
        "table": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """ "8x128,32x512" -> [(8, 128), (32, 512)]; ValueError naming the flag otherwise."""
    try:
        sizes = [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        sizes = []
    if not sizes or any(len(size) != 2 or min(size) < 1 for size in sizes):
        raise ValueError(f"--check-sizes '{text}': write workers x steps pairs, e.g. 8x128,32x512")
    return sizes
