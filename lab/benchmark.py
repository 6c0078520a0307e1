"""Measure the fast and the plain memory path in one run (and other memories beside them): throughput, peak memory,
FLOPs and the share of peak.

Usage:
  python -m lab.benchmark [options] [--set=<key=value>]...
  python -m lab.benchmark (-h | --help)

Options:
  --config=<path>          YAML config [default: configs/mortar_mayhem_grid.yaml].
  --workers=<n>            n_workers (default: the config's).
  --steps=<n>              worker_steps (default: the config's).
  --updates=<n>            Measured updates per path, after one warm-up update [default: 2].
  --paths=<list>           Comma-separated memory paths to measure: "fast", "plain" or both [default: fast,plain].
  --memories=<list>        Also measure these memories (of "gru", "lstm", "none", "trxl") with the same config, e.g. gru,none.
  --long-episodes=<steps>  Instead: rollout steps of one unending episode per worker (no environment, no training:
                           the model and its memory on fixed random observations of the task's shape): steps/s and
                           peak RSS after 1000 and <steps> episode steps, for the configured memory and --memories; a
                           worker's memory should not grow with its episode.
  --sweep=<lengths>        Also measure fast-path rollout steps/s at these memory lengths, e.g. 32,64,128,256.
  --processes=<list>       Instead: train.py on 1..P processes through torchrun, e.g. 1,2,4 (same config, same
                           n_workers split over the processes, each with cores / P threads; each P must divide
                           n_workers, and on CUDA be at most the GPU count): steps/s overall and per process, scaling
                           efficiency against 1 process, peak RSS of the largest process.
  --gpu-check              Instead: the checks for a GPU machine (lab/gpu_check.py: learning, fast == plain, CPU vs
                           device, bfloat16, compile, torchrun) and a steps/s table; without --cpu it stops at once
                           (exit code 2) where CUDA is not available; with --cpu on the CPU.
  --check-sizes=<list>     Sizes (workers x steps) of --gpu-check's table [default: 8x128,32x512].
  --set=<key=value>        Override a config key (repeatable), as in train.py.
  --cpu                    Use the CPU even where CUDA is available.
  --child=<path>           (internal) measure one path in this process and print its JSON.
  --overrides=<json>       (internal) config overrides for --child [default: {}].
  -h --help                Show this help.

Each path runs in its own process, so its peak resident memory is its own. Each update is the trainer's own
(PPOTrainer.train_update). Times: rollout = collecting n_workers x worker_steps environment steps (model +
environments), train = the PPO epochs on them (and, with normalize_observations, the observation statistics' update),
overall = both. FLOPs are counted with torch's FlopCounterMode on one rollout step and one minibatch
(forward + backward); the share of peak compares the achieved model FLOP/s with a float32 matrix product
measured on this machine in the same run. A second line per path gives the dtype the products ran in, the model's
FLOPs per environment step counted from the config (lab/flops.py: what the model needs, where FlopCounterMode counts
what the kernels do and misses the CPU's fused attention and LSTM) and their share of that dtype's matrix-product
rate (bfloat16's measured too where the machine has bfloat16 units). The last line is one JSON object.

With --long-episodes every worker stays in one episode for the whole run, as in an Endless task (a random agent's
Endless episode would end early): the model acts on a fixed random observation of the task's shape per worker, and
its memory remembers every step. What a worker's memory holds (the TrXL ring of the last memory_length steps, a
recurrent state) does not grow with the episode, so neither should the time per step or the process's memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import observations
from cli import ROOT, module_environment, parse_args, shipped_path
from config import MEMORY_TYPES, ConfigError, check_memory_path, load_config, parse_overrides
from lab.gpu_check import missing_cuda, parse_sizes, run_checks
from lab.measure import measure, peak_rss_mb
from model import ActorCriticModel, runnable_compute_dtype
from worker import Workers


def long_episode(config_path: str, overrides: dict, steps: int, device: torch.device) -> dict:
    """Step every worker's memory through one episode of ``steps`` steps; steps/s over the 1000 steps before each mark
    (1000 and ``steps``) and the peak RSS at it, and the bytes a worker's memory state holds."""
    config = load_config(config_path, overrides)
    probe = Workers(config.environment, 1, 0, 0)  # the task's spaces
    obs_shape, action_dims = observations.shape_of(probe.observation_space), probe.action_spec
    probe.close()
    torch.manual_seed(0)
    compute_dtype = runnable_compute_dtype(config.compute_dtype, device)
    model = ActorCriticModel(config, obs_shape, action_dims, compute_dtype=compute_dtype).to(device).eval()
    n = config.n_workers
    state = model.memory.start(n, device)
    rng = np.random.default_rng(0)
    shapes = obs_shape if isinstance(obs_shape, dict) else {"": obs_shape}
    random = {key: rng.random((n, *shape), dtype=np.float32) for key, shape in shapes.items()}
    obs = model.prepare(random if isinstance(obs_shape, dict) else random[""])
    marks = sorted({min(1000, steps), steps})
    result = {"memory": config.memory, "workers": n, "episode_steps": steps, "marks": {}}
    window_start = time.perf_counter()
    with torch.no_grad(), model.fixed_weights():
        model.memory.sync(state)
        for step in range(1, steps + 1):
            model.act(obs, state, lambda policy: policy.sample())
            if step % 1000 == 0 or step in marks:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                now = time.perf_counter()
                window = 1000 if step % 1000 == 0 else step % 1000
                if step in marks:
                    result["marks"][str(step)] = {
                        "sps": n * window / (now - window_start),
                        "peak_rss_mb": peak_rss_mb(),
                    }
                window_start = now
    result["state_bytes_per_worker"] = sum(t.numel() * t.element_size() for t in state.state_dict().values()) / n
    return result


def run_group(command: list[str], **options: object) -> subprocess.CompletedProcess:
    """Run ``command`` in a process group of its own and return its output; if the benchmark is stopped meanwhile
    (Ctrl-C, SIGTERM from ``timeout``), the whole group is killed before the benchmark ends, so that no measuring child
    (nor its torchrun processes) keeps computing."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, **options)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_child(args: dict, path: str, overrides: dict) -> dict:
    """Measure one path in a fresh process and return its result."""
    command = [sys.executable, "-m", "lab.benchmark", f"--child={path}", f"--config={args['--config']}"]
    command += [f"--updates={args['--updates']}"] + (["--cpu"] if args["--cpu"] else [])
    command.append(f"--overrides={json.dumps(overrides)}")
    result = run_group(command, env=module_environment())
    if result.returncode != 0:
        raise RuntimeError(f"measuring the {path} path failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def long_episodes(args: dict, config: object, overrides: dict, memories: list[str], steps: int, device: torch.device) -> int:
    """The --long-episodes mode: one child process per memory; a line per memory and mark, then one JSON line."""
    if steps < 1:
        print(f"error: --long-episodes must be at least 1, got {steps}", file=sys.stderr)
        return 2
    print(f"long episodes on {args['--config']} ({device}): {config.n_workers} workers, one episode of {steps} steps each",
          flush=True)  # fmt: skip
    summary = {"config": args["--config"], "workers": config.n_workers, "episode_steps": steps, "memories": {}}
    for memory in dict.fromkeys([config.memory, *memories]):
        r = run_child(args, f"long:{steps}", {**overrides, "memory": memory})
        summary["memories"][memory] = r
        for mark, values in r["marks"].items():
            print(f"{memory:>6}: after {int(mark):6d} episode steps  {values['sps']:8.1f} steps/s  "
                  f"peak RSS {values['peak_rss_mb']:7.0f} MB  (state {r['state_bytes_per_worker'] / 1024:.0f} KiB per worker)",
                  flush=True)  # fmt: skip
    print(json.dumps(summary))
    return 0


def train_processes(config_path: str, overrides: dict, processes: int, updates: int, cpu: bool) -> dict:
    """Runs train.py on ``processes`` processes (torchrun for more than one) for a warm-up update and ``updates``
    measured ones, in a temporary folder; returns its steps/s (the mean over the measured updates' console lines) and
    the peak RSS of the largest process."""
    threads = max(1, (os.cpu_count() or 1) // processes)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    train = os.path.join(ROOT, "train.py")
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    sets = {**overrides, "updates": updates + 1, "eval_interval": 0, "checkpoint_interval": 0}
    command = [*launcher, train, f"--config={os.path.abspath(config_path)}", "--run-id=benchmark"]
    command += [f"--set={key}={json.dumps(value)}" for key, value in sets.items()] + (["--cpu"] if cpu else [])
    # A fresh parent per count, so that its children's peak (the largest of them, in KiB) is this count's alone.
    parent = (
        "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
        "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)"
    )
    with tempfile.TemporaryDirectory() as folder:
        result = run_group([sys.executable, "-c", parent, *command], cwd=folder, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"training on {processes} process(es) failed:\n{result.stderr[-4000:]}")
    rates = [float(line.split("sps")[1].split()[0]) for line in result.stdout.splitlines() if line.startswith("update ")]
    peak = int(result.stderr.split("peak_rss_kib")[-1].split()[0])
    return {
        "processes": processes,
        "threads_per_process": threads,
        "overall_sps": float(np.mean(rates[1:])),
        "per_process_sps": float(np.mean(rates[1:])) / processes,
        "peak_rss_mb": peak / 1024,
    }


def scaling(args: dict, config: object, overrides: dict, counts: list[int]) -> int:
    """The --processes mode: a line per process count, then one JSON line."""
    if not counts or min(counts) < 1 or any(config.n_workers % count for count in counts):
        print(
            f"error: --processes '{args['--processes']}' must list counts >= 1 that divide n_workers ({config.n_workers})",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and not args["--cpu"] else 0
    if gpus and max(counts) > gpus:
        print(
            f"error: --processes '{args['--processes']}' asks for {max(counts)} processes, but NCCL needs a GPU per "
            f"process and this machine shows {gpus}: list counts up to {gpus}, or add --cpu",
            file=sys.stderr,
        )
        return 2
    updates = int(args["--updates"])
    print(f"scaling {args['--config']}: {config.n_workers} workers x {config.worker_steps} steps on 1..P processes, "
          f"{updates} measured updates each, {os.cpu_count()} cores", flush=True)  # fmt: skip
    rows = [train_processes(args["--config"], overrides, count, updates, args["--cpu"]) for count in counts]
    base = next((row["overall_sps"] for row in rows if row["processes"] == 1), None)
    for row in rows:
        row["efficiency"] = row["overall_sps"] / (row["processes"] * base) if base else float("nan")
        print(f"{row['processes']:3d} process(es) x {row['threads_per_process']} thread(s): "
              f"overall {row['overall_sps']:8.1f} steps/s  per process {row['per_process_sps']:8.1f}  "
              f"efficiency {100 * row['efficiency']:5.1f}%  peak RSS {row['peak_rss_mb']:7.0f} MB", flush=True)  # fmt: skip
    print(json.dumps({"config": args["--config"], "workers": config.n_workers, "steps": config.worker_steps,
                      "cores": os.cpu_count(), "processes": rows}))  # fmt: skip
    return 0


# Beside the figures above, each path's: the dtype its products ran in, the float32 and bfloat16 (null where the
# machine has no bfloat16 units) matrix-product rates, the model's MFLOP per environment step counted from the config
# (lab/flops.py) for the rollout, the training and both, and the share of the ran dtype's rate they reach; and whether
# the trainer kept freed memory for reuse (trainer.keep_freed_memory).
ANALYTIC_KEYS = (
    "compute_dtype", "matmul_gflops", "matmul_bf16_gflops", "model_mflop_per_step", "share_of_dtype_matmul",
    "keeps_freed_memory",
)  # fmt: skip


def print_row(name: str, r: dict) -> None:
    """One console line of a measured path or memory."""
    print(f"{name:>6}: rollout {r['rollout_sps']:8.1f} steps/s  train {r['train_sps']:8.1f} steps/s  "
          f"overall {r['overall_sps']:8.1f} steps/s  peak RSS {r['peak_rss_mb']:7.0f} MB  "
          f"{r['mflop_per_step']:8.1f} MFLOP/step  {100 * r['peak_fraction']:5.1f}% of {r['matmul_gflops']:.0f} GFLOP/s",
          flush=True)  # fmt: skip
    dtype, share = r["compute_dtype"], r["share_of_dtype_matmul"]
    line = f"        {dtype}: {r['model_mflop_per_step']['total']:.1f} model MFLOP/step (counted from the config)"
    if share["total"] is not None:
        rate = r["matmul_bf16_gflops"] if dtype == "bfloat16" else r["matmul_gflops"]
        line += (f", {100 * share['total']:.1f}% of the {rate:.0f} GFLOP/s of {dtype} products (rollout "
                 f"{100 * share['rollout']:.1f}%, train {100 * share['train']:.1f}%)")  # fmt: skip
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    if not args["--child"]:  # SIGTERM stops the benchmark as Ctrl-C does, through run_group's cleanup
        signal.signal(signal.SIGTERM, _raise_interrupt)
    device = torch.device("cuda" if torch.cuda.is_available() and not args["--cpu"] else "cpu")
    if args["--child"]:
        overrides = json.loads(args["--overrides"])
        if args["--child"].startswith("long:"):
            steps = int(args["--child"].split(":")[1])
            print(json.dumps(long_episode(args["--config"], overrides, steps, device)))
            return 0
        print(json.dumps(measure(args["--config"], overrides, args["--child"], int(args["--updates"]), device)))
        return 0
    if args["--gpu-check"]:
        missing = None if args["--cpu"] else missing_cuda()
        if missing:  # the checks would run on the CPU and pass, saying nothing about the GPU
            print(f"error: --gpu-check without --cpu needs CUDA: {missing}", file=sys.stderr)
            return 2
        try:
            sizes = parse_sizes(args["--check-sizes"])
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        summary = run_checks(device, sizes)
        print(json.dumps(summary))
        return 0 if summary["passed"] else 1
    overrides = parse_overrides(args["--set"])
    if args["--workers"]:
        overrides["n_workers"] = int(args["--workers"])
    if args["--steps"]:
        overrides["worker_steps"] = int(args["--steps"])
    try:
        args["--config"] = shipped_path(args["--config"])  # the children get it as found here
        config = load_config(args["--config"], overrides)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    if args["--processes"]:
        try:
            counts = [int(count) for count in args["--processes"].split(",") if count]
        except ValueError:
            counts = []
        return scaling(args, config, overrides, counts)
    paths = [path for path in args["--paths"].split(",") if path]
    if "plain" in paths and config.memory == "trxl" and config.transformer.memory_gradients:
        # The plain path, the specification, has no gradients into the memory: compare both paths without them.
        print("note: transformer.memory_gradients set to false for every path (the plain path does not implement it)")
        overrides["transformer.memory_gradients"] = False
        config = load_config(args["--config"], overrides)
    try:
        for path in paths:
            check_memory_path(path, config, flag="--paths")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    memories = [memory for memory in (args["--memories"] or "").split(",") if memory]
    unknown = [memory for memory in memories if memory not in MEMORY_TYPES]
    if unknown:
        print(f"error: --memories '{unknown[0]}' is unknown: use some of {', '.join(MEMORY_TYPES)}", file=sys.stderr)
        return 2
    if args["--long-episodes"]:
        return long_episodes(args, config, overrides, memories, int(args["--long-episodes"]), device)
    described = f"memory {config.memory}"
    if config.memory == "trxl":
        described += f", memory_length {config.transformer.memory_length}"
    print(
        f"benchmark {args['--config']} on {device}: {config.n_workers} workers x {config.worker_steps} steps, "
        f"{described}, {args['--updates']} measured updates per path",
        flush=True,
    )
    results = {}
    for path in paths:
        results[path] = run_child(args, path, overrides)
        print_row(path, results[path])
    for memory in memories:
        results[memory] = run_child(args, "fast", {**overrides, "memory": memory})
        print_row(memory, results[memory])
    if args["--sweep"]:
        print("fast-path rollout steps/s by memory_length:")
        for length in [int(x) for x in args["--sweep"].split(",")]:
            sweep = {**overrides, "transformer.memory_length": length}
            r = run_child({**args, "--updates": "1"}, "fast", sweep)
            results.setdefault("sweep", {})[length] = r["rollout_sps"]
            print(f"  memory_length {length:4d}: rollout {r['rollout_sps']:8.1f} steps/s", flush=True)
    summary = {"config": args["--config"], "workers": config.n_workers, "steps": config.worker_steps,
               "memory": config.memory, "memory_length": config.transformer.memory_length}  # fmt: skip
    keys = ("rollout_sps", "train_sps", "overall_sps", "peak_rss_mb", "mflop_per_step", "peak_fraction")
    for name in paths + memories:
        summary[name] = {key: round(results[name][key], 4) for key in keys}
        summary[name].update({key: results[name][key] for key in ANALYTIC_KEYS})
        if "peak_cuda_mb" in results[name]:
            summary[name]["peak_cuda_mb"] = round(results[name]["peak_cuda_mb"], 1)
    if "fast" in results and "plain" in results:
        summary["speedup"] = round(results["fast"]["overall_sps"] / results["plain"]["overall_sps"], 2)
    if "sweep" in results:
        summary["sweep_rollout_sps"] = {str(k): round(v, 1) for k, v in results["sweep"].items()}
    print(json.dumps(summary))
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
