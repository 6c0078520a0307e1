"""The one command for a machine with a GPU (``python -m lab.benchmark --gpu-check``): does everything work there, and how
fast is it? With ``--cpu`` the same checks run on the CPU, so that CI runs them and on a GPU only the device differs.
Without ``--cpu`` on a machine where CUDA is not available it stops before any check (``missing_cuda`` says why), since
the checks would pass on the CPU and say nothing about the GPU.

Checks, each true, false or "skipped" (it cannot run on this device) in the JSON last line, whose ``passed`` is true
only if every check that ran passed. All but ``poc_learns`` run the PoC with the transformer's shipped defaults
(``TRANSFORMER_DEFAULTS``: relative positions, memory_gradients, query_position, no positional_values):
- ``poc_learns``: the proof-of-memory task trained on the device reaches a training success of at least 0.9;
- ``fast_equals_plain``: on a rollout collected on the device, with memory_gradients off (the plain path has none), the
  fast and the plain memory path give the same logits and values, and both reproduce the rollout's values (PPO ratios
  start at 1); with memory_gradients on (fast path only), the training forward reproduces the rollout's
  log-probabilities and values;
- ``cpu_matches_device``: the same weights and minibatch give the same loss on the CPU and on the device (TF32 off);
  skipped with ``--cpu``, where it would compare the CPU with itself;
- ``bfloat16``: two updates with ``compute_dtype: bfloat16`` compute in bfloat16 and give finite losses; skipped on a
  CPU without bfloat16 matrix units, where the model computes in float32 instead (model.py);
- ``compile``: two updates of the training step with ``compile: true`` run compiled graphs, and no frame fell back to
  eager (a compile error or the recompile limit); the details count graphs, frames and recompiles;
- ``torchrun``: train.py through torchrun in a process group (NCCL on CUDA, gloo on the CPU) writes its model: two
  processes on a machine with two GPUs or more, else one (its collectives then run over one rank, through NCCL still).
Then a table: steps/s and peak GPU memory (peak resident memory on the CPU) of the Mortar Mayhem Grid config at each
size for TrXL and GRU, each row measured in a process of its own, so that its peak is its own.
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

from cli import ROOT, module_environment
from config import TRANSFORMER_SCHEMA, load_config
from model import BFLOAT16_UNITS, ActorCriticModel, runnable_compute_dtype
from ppo import forward_minibatch, ppo_loss
from trainer import PPOTrainer

POC = os.path.join(ROOT, "configs", "poc_memory_env.yaml")
TABLE_CONFIG = os.path.join(ROOT, "configs", "mortar_mayhem_grid.yaml")
POC_UPDATES = 15  # the shipped config's seeds reach success 0.9 after 4-5 updates (docs/results.md)
TOLERANCE = 1e-4
SMALL = {"n_workers": 4, "worker_steps": 32, "n_mini_batch": 2, "updates": 2, "eval_interval": 0}
# The PoC config switches off positions and memory gradients; what users train with is the schema's defaults of every
# key but the transformer's size, so the checks run those.
SIZES = ("num_blocks", "embed_dim", "num_heads", "memory_length")
TRANSFORMER_DEFAULTS = {f"transformer.{key}": spec[1] for key, spec in TRANSFORMER_SCHEMA.items() if key not in SIZES}
DEFAULTS = {**SMALL, **TRANSFORMER_DEFAULTS}
SKIPPED = "skipped"
ROW_SECONDS = 1800  # a table row on a slow machine; a hung child must not hang the check


def missing_cuda() -> str | None:
    """Why the checks cannot run on a GPU here, or None where CUDA is available: torch is a CPU-only build, or it is
    built with CUDA and finds no usable GPU (no driver, a driver too old for the build, no device visible)."""
    if torch.cuda.is_available():
        return None
    instead = "or add --cpu to run the checks on the CPU"
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (
            f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None), so no check would run on a GPU: "
            f"install the CUDA build of torch (a plain pip install of torch on Linux; docs/installation.md), {instead}"
        )
    try:  # torch's own reason, e.g. "Found no NVIDIA driver on your system" or "No CUDA GPUs are available"
        torch.cuda.init()
        reason = "torch.cuda.is_available() is false"
    except Exception as error:
        reason = str(error).strip().splitlines()[0]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "" if visible is None else f", CUDA_VISIBLE_DEVICES={visible!r}"
    built = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {torch.version.hip}"
    return (
        f"torch {torch.__version__} is built with {built}, but CUDA is not available "
        f"({reason}{shown}): check that nvidia-smi lists the GPU and that its driver is recent enough for that CUDA "
        f"version, and that CUDA_VISIBLE_DEVICES names the GPU, {instead}"
    )


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
    fast_trainer = trainer(device, folder, **{**DEFAULTS, "transformer.memory_gradients": False})
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
    worst["memory_gradients_rollout"] = memory_gradients_reproduce_the_rollout(device, folder)
    return max(worst.values()) < TOLERANCE, {key: float(f"{value:.2e}") for key, value in worst.items()}


def memory_gradients_reproduce_the_rollout(device: torch.device, folder: str) -> float:
    """With memory_gradients (the default; the plain path has none to compare with) the training forward recomputes a
    chunk's own memory tokens: with the rollout's weights it must give the rollout's log-probabilities and values. The
    largest difference over the valid steps of every minibatch."""
    run = trainer(device, folder, **DEFAULTS)
    worst = 0.0
    try:
        run.rollout()
        generator = torch.Generator().manual_seed(0)
        for minibatch in run.buffer.minibatches(run.config.n_mini_batch, run.config.sequence_length, generator):
            out = forward_minibatch(run.model, minibatch)  # with autograd, as in training
            valid = torch.ones_like(minibatch.values, dtype=torch.bool) if minibatch.valid is None else minibatch.valid
            log_probs = out.policy.log_prob(minibatch.actions).detach()
            worst = max(worst, (log_probs - minibatch.log_probs)[valid].abs().max().item())
            worst = max(worst, (out.value.detach() - minibatch.values)[valid].abs().max().item())
    finally:
        run.close()
    return worst


def cpu_matches(device: torch.device, folder: str) -> tuple[bool | str, dict]:
    if device.type == "cpu":
        return SKIPPED, {"reason": "the device is the CPU: nothing to compare it with"}
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    run = trainer(device, folder, **DEFAULTS)
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
    """Two of the trainer's own updates (``PPOTrainer.train_update``); passed if both losses are finite. The details
    name the dtype the model computed in."""
    run = trainer(device, folder, **{**DEFAULTS, **overrides})
    try:
        losses = []
        for _ in range(2):
            stats = run.train_update().stats
            losses.append(stats["policy_loss"] + stats["value_loss"])
    finally:
        run.close()
    return all(map(math.isfinite, losses)), {"losses": [round(x, 5) for x in losses], "compute_dtype": run.model.compute_dtype}


def bfloat16_updates(device: torch.device, folder: str) -> tuple[bool | str, dict]:
    """Two updates with ``compute_dtype: bfloat16``, true only if they computed in bfloat16 and their losses are finite;
    skipped on a CPU without bfloat16 matrix units, where the model would compute in float32 (model.py)."""
    if runnable_compute_dtype("bfloat16", device, say=False) != "bfloat16":
        reason = f"this CPU has no bfloat16 matrix unit (none of {', '.join(BFLOAT16_UNITS)}): the model computes in float32"
        return SKIPPED, {"reason": reason}
    finite, details = finite_updates(device, folder, compute_dtype="bfloat16")
    return finite and details["compute_dtype"] == "bfloat16", details


def compiled(device: torch.device, folder: str) -> tuple[bool, dict]:
    """Two real updates with ``compile: true``; counts what torch._dynamo did meanwhile: graphs, frames compiled and
    frames that fell back to eager (a compile error, or the recompile limit), and recompiles (compilations of a frame
    beyond its first)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import counters

    counters.clear()
    before = dict(convert_frame.FRAME_COMPILE_COUNTER)  # compilations per frame (private; torch 2.13 has no public count)
    finite, details = finite_updates(device, folder, compile=True)
    after = convert_frame.FRAME_COMPILE_COUNTER
    recompiles = sum(count - before.get(frame, 0) - (frame not in before) for frame, count in after.items())
    graphs, frames = int(counters["stats"]["unique_graphs"]), int(counters["frames"]["total"])
    eager = frames - int(counters["frames"]["ok"])
    details |= {"compiled_graphs": graphs, "frames": frames, "frames_eager": eager, "recompiles": recompiles,
                "recompile_limit": torch._dynamo.config.recompile_limit}  # fmt: skip
    return finite and graphs > 0 and eager == 0, details


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
    update after a warm-up one, as lab/benchmark.py measures a path (lab/measure.py), each in a child process, since a
    process's peak resident memory is the largest of its lifetime."""
    rows = []
    for workers, steps in sizes:
        for memory in ("trxl", "gru"):
            size = {"n_workers": workers, "worker_steps": steps, "n_mini_batch": 8, "sequence_length": 0}
            result = measure_row({**size, "memory": memory}, device)
            sps, peak = round(result["overall_sps"], 1), round(result.get("peak_cuda_mb", result["peak_rss_mb"]), 1)
            rows.append({"memory": memory, "workers": workers, "steps": steps, "sps": sps, "peak_mb": peak})
            print(f"  {memory:4s} {workers:3d} x {steps:4d}: {sps:9.1f} steps/s, peak {peak:8.1f} MB")
    return rows


def measure_row(overrides: dict, device: torch.device) -> dict:
    """lab/measure.py's result for one row, measured by ``python -m lab.benchmark --child=fast`` (killed with this
    process's interrupt, as subprocess.run does)."""
    command = [sys.executable, "-m", "lab.benchmark", "--child=fast", f"--config={TABLE_CONFIG}", "--updates=1"]
    command += [f"--overrides={json.dumps(overrides)}"] + (["--cpu"] if device.type == "cpu" else [])
    result = subprocess.run(command, capture_output=True, text=True, timeout=ROW_SECONDS, env=module_environment())
    if result.returncode != 0:
        raise RuntimeError(
            f"measuring {json.dumps(overrides)} failed (exit code {result.returncode}):\n{result.stderr[-4000:]}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


CHECKS = {
    "poc_learns": poc_learns,
    "fast_equals_plain": paths_agree,
    "cpu_matches_device": cpu_matches,
    "bfloat16": bfloat16_updates,
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
        shown = SKIPPED if checks[check] == SKIPPED else "ok" if checks[check] else "FAILED"
        print(f"  {check:20s} {shown}  {json.dumps(details[check])}", flush=True)
    print(f"steps/s and peak memory, {os.path.relpath(TABLE_CONFIG, ROOT)}:", flush=True)
    rows = table(device, sizes)
    return {
        "device": name,
        "torch": torch.__version__,
        "checks": checks,
        "passed": all(result is True for result in checks.values() if result != SKIPPED),
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
