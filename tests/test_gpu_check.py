"""lab/benchmark.py --gpu-check with --cpu standing in for the device: every check runs and passes here, so that on a GPU
only the device differs; a failing or crashing check fails the whole check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from cli import module_environment
from lab import gpu_check


@pytest.mark.slow
def test_gpu_check_passes_on_the_cpu(tmp_path: str) -> None:
    command = [sys.executable, "-m", "lab.benchmark", "--gpu-check", "--cpu", "--check-sizes=2x16"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=module_environment())
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert summary["device"] == "cpu" and summary["passed"]
    assert set(summary["checks"]) == set(gpu_check.CHECKS) and all(summary["checks"].values())
    assert summary["details"]["compile"]["compiled_graphs"] > 0  # compiled, not a silent fallback to eager
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
