"""benchmark.py stops its measuring children when it is stopped itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_sigterm_stops_the_measuring_child(tmp_path: str) -> None:
    command = [sys.executable, os.path.join(ROOT, "benchmark.py"), "--config=configs/poc_memory_env.yaml", "--paths=fast"]
    command += ["--updates=100000", "--cpu"]
    benchmark = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
