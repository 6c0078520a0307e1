"""lab/benchmark.py --gpu-check with --cpu standing in for the device: every check that can run on the CPU runs and passes
here, so that on a GPU only the device differs; a failing or crashing check fails the whole check, one that cannot run
is "skipped", never true."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
import torch

import model
from cli import module_environment
from lab import benchmark, gpu_check


@pytest.mark.slow
def test_gpu_check_passes_on_the_cpu(tmp_path: str) -> None:
    command = [sys.executable, "-m", "lab.benchmark", "--gpu-check", "--cpu", "--check-sizes=2x16"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=module_environment())
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert summary["device"] == "cpu" and summary["passed"]
    assert set(summary["checks"]) == set(gpu_check.CHECKS)
    assert summary["checks"].pop("cpu_matches_device") == "skipped"  # the CPU compared with itself proves nothing
    if model.cpu_bfloat16_units():  # true only where bfloat16 really ran
        assert summary["checks"].pop("bfloat16") is True and summary["details"]["bfloat16"]["compute_dtype"] == "bfloat16"
    else:
        assert summary["checks"].pop("bfloat16") == "skipped"
    assert all(value is True for value in summary["checks"].values()), summary["checks"]
    compile = summary["details"]["compile"]
    assert compile["compiled_graphs"] > 0 and compile["frames_eager"] == 0  # compiled, not a silent fallback to eager
    assert compile["recompiles"] >= 0 and compile["frames"] > 0
    assert summary["details"]["fast_equals_plain"]["memory_gradients_rollout"] < gpu_check.TOLERANCE
    assert summary["details"]["torchrun"]["backend"] == "gloo"
    assert [(row["memory"], row["workers"], row["steps"]) for row in summary["table"]] == [("trxl", 2, 16), ("gru", 2, 16)]
    assert all(row["sps"] > 0 and row["peak_mb"] > 0 for row in summary["table"])
    assert os.listdir(tmp_path) == [], "the check leaves nothing behind"


def test_a_failing_or_crashing_check_fails_the_gpu_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(device: torch.device, folder: str) -> tuple[bool, dict]:
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(
        gpu_check, "CHECKS", {"fine": lambda d, f: (True, {}), "wrong": lambda d, f: (False, {}), "crash": crash}
    )
    summary = gpu_check.run_checks(torch.device("cpu"), [])
    assert summary["checks"] == {"fine": True, "wrong": False, "crash": False} and not summary["passed"]
    assert "no kernel image" in summary["details"]["crash"]["error"]


@pytest.mark.parametrize("text", ["8x", "8x128x2", "0x16", "big", ""])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--check-sizes"):
        gpu_check.parse_sizes(text)


def test_a_skipped_check_is_neither_true_nor_counted(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_check.cpu_matches(torch.device("cpu"), str(tmp_path))[0] == "skipped"
    monkeypatch.setattr(gpu_check, "CHECKS", {"fine": lambda d, f: (True, {}), "skip": gpu_check.cpu_matches})
    summary = gpu_check.run_checks(torch.device("cpu"), [])
    assert summary["checks"] == {"fine": True, "skip": "skipped"} and summary["passed"]
    monkeypatch.setattr(gpu_check, "CHECKS", {"wrong": lambda d, f: (False, {}), "skip": gpu_check.cpu_matches})
    assert not gpu_check.run_checks(torch.device("cpu"), [])["passed"]


def test_the_checks_run_the_transformers_defaults() -> None:
    """Not the PoC config's own transformer, which has no positions and no memory gradients."""
    config = gpu_check.load_config(gpu_check.POC, gpu_check.DEFAULTS).transformer
    assert config.memory_gradients and config.query_position and not config.positional_values
    assert config.positional_encoding == "relative"


def test_a_frame_run_eagerly_fails_the_compile_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the recompile limit dynamo runs a frame eagerly, silently; graphs compiled before do not hide it."""

    def updates(device: torch.device, folder: str, **overrides: object) -> tuple[bool, dict]:
        double = torch.compile(lambda x: x * 2, backend="eager")
        for dtype in (torch.float32, torch.float64, torch.int64):  # a new dtype recompiles
            double(torch.ones(3, dtype=dtype))
        return True, {}

    monkeypatch.setattr(gpu_check, "finite_updates", updates)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    passed, details = gpu_check.compiled(torch.device("cpu"), "")
    assert details["compiled_graphs"] >= 1 and details["frames_eager"] >= 1 and not passed


@pytest.mark.slow
def test_a_table_rows_peak_memory_is_its_own() -> None:
    """Each row is measured in a process of its own: this process's larger peak does not show in it."""
    ballast = bytearray(1536 * 2**20)  # 1.5 GiB, touched
    ballast[::4096] = b"x" * len(ballast[::4096])
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = gpu_check.measure_row({"n_workers": 1, "worker_steps": 8, "n_mini_batch": 1, "memory": "gru"}, torch.device("cpu"))
    assert 0 < row["peak_rss_mb"] < own - 1024, (row["peak_rss_mb"], own)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the check would run on the GPU")
def test_without_cuda_the_gpu_check_stops_at_once_unless_told_cpu(tmp_path: str) -> None:
    """A GPU machine with a CPU-only torch or a broken driver must not pass the check on the CPU."""
    command = [sys.executable, "-m", "lab.benchmark", "--gpu-check", "--check-sizes=2x16"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=module_environment())
    assert result.returncode == 2 and time.perf_counter() - start < 30, (result.returncode, result.stdout[-2000:])
    assert "poc_learns" not in result.stdout and "passed" not in result.stdout  # no check ran
    why = "CPU-only build (torch.version.cuda is None)" if torch.version.cuda is None else "CUDA is not available"
    assert why in result.stderr and "add --cpu" in result.stderr, result.stderr


def test_a_cuda_build_without_a_usable_gpu_names_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def no_driver() -> None:
        raise RuntimeError("Found no NVIDIA driver on your system.")

    def checks(device: torch.device, sizes: list) -> dict:
        raise AssertionError(f"the checks ran on {device}")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "init", no_driver)
    monkeypatch.setattr(benchmark, "run_checks", checks)
    assert benchmark.main(["--gpu-check"]) == 2
    error = capsys.readouterr().err
    assert "built with CUDA 12.8, but CUDA is not available (Found no NVIDIA driver" in error, error
    assert "driver is recent enough" in error and "add --cpu" in error


def test_bfloat16_is_skipped_on_a_cpu_without_bfloat16_units(monkeypatch: pytest.MonkeyPatch, tmp_path: str) -> None:
    """There the model computes in float32: two finite float32 updates must not read as a bfloat16 that works."""
    monkeypatch.setattr(model, "cpu_bfloat16_units", lambda: [])  # what runnable_compute_dtype asks
    monkeypatch.setattr(gpu_check, "CHECKS", {"bfloat16": gpu_check.CHECKS["bfloat16"]})
    summary = gpu_check.run_checks(torch.device("cpu"), [])
    assert summary["checks"] == {"bfloat16": "skipped"} and summary["passed"], summary
    assert "computes in float32" in summary["details"]["bfloat16"]["reason"]


def test_the_gpu_checks_updates_move_the_observation_statistics(monkeypatch: pytest.MonkeyPatch, tmp_path: str) -> None:
    """The check's updates are the trainer's own: with normalize_observations each takes its rollout into the
    statistics, as PPOTrainer.run's do."""
    trainers, counts = [], []

    def kept(*args: object, **overrides: object) -> object:
        trainers.append(make(*args, **overrides))
        counts.append(trainers[-1].model.normalizer.parts[0].statistics.count.item())  # before any update
        return trainers[-1]

    make = gpu_check.trainer
    monkeypatch.setattr(gpu_check, "trainer", kept)
    passed, _ = gpu_check.finite_updates(torch.device("cpu"), str(tmp_path), normalize_observations=True)
    added = trainers[0].model.normalizer.parts[0].statistics.count.item() - counts[0]
    assert passed and added == 2 * gpu_check.SMALL["n_workers"] * gpu_check.SMALL["worker_steps"]  # both rollouts
