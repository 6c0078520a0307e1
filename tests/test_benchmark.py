"""lab/benchmark.py stops its measuring children when it is stopped itself; lab/measure.py measures the trainer's own
updates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from cli import ROOT, module_environment
from lab import measure
from trainer import PPOTrainer


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_stops_the_measuring_child(tmp_path: str) -> None:
    command = [sys.executable, "-m", "lab.benchmark", "--config=configs/poc_memory_env.yaml", "--paths=fast"]
    command += ["--updates=100000", "--cpu"]
    benchmark = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=module_environment()
    )
    deadline, children = time.time() + 120, []
    while not children and time.time() < deadline and benchmark.poll() is None:
        time.sleep(0.5)
        children = children_of(benchmark.pid)
    assert children, "the benchmark started no child"
    time.sleep(3)  # the child is measuring now
    benchmark.send_signal(signal.SIGTERM)  # as `timeout` stops a command
    benchmark.wait(timeout=60)
    deadline = time.time() + 10
    while any(alive(child) for child in children) and time.time() < deadline:
        time.sleep(0.2)
    leftover = [child for child in children if alive(child)]
    for child in leftover:
        os.kill(child, signal.SIGKILL)
    assert not leftover, "a measuring child kept running after the benchmark was stopped"


def test_scaling_asks_for_no_more_processes_than_gpus(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # NCCL takes one GPU per process: on a one-GPU machine --processes 1,2 stops before training, and names the fix.
    from lab import benchmark

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code = benchmark.main(["--config=configs/poc_memory_env.yaml", "--processes=1,2"])
    assert code == 2
    error = capsys.readouterr().err
    assert "asks for 2 processes" in error and "list counts up to 1, or add --cpu" in error


def test_measured_updates_move_the_observation_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure.py times the trainer's own updates: with normalize_observations each takes its rollout into the
    statistics, as PPOTrainer.run's do, so the measured update is the one training runs."""
    trainers, counts = [], []

    class Kept(PPOTrainer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            trainers.append(self)
            counts.append(self.model.normalizer.parts[0].statistics.count.item())  # before any update

    monkeypatch.setattr(measure, "PPOTrainer", Kept)
    small = {"n_workers": 2, "worker_steps": 16, "n_mini_batch": 1, "normalize_observations": True}
    measure.measure(os.path.join(ROOT, "configs", "poc_memory_env.yaml"), small, "fast", 1, torch.device("cpu"))
    added = trainers[0].model.normalizer.parts[0].statistics.count.item() - counts[0]
    assert added == 2 * 2 * 16  # the warm-up update's rollout and the measured one's, every worker's step
