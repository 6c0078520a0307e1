"""The house stays small and each concern stays in one place (issue 31): no class over 200 lines, and the memory's
per-step protocol (step, choose, commit) written once, in ActorCriticModel.act, which the rollout, evaluation,
lab/benchmark.py and the tests call."""

from __future__ import annotations

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_CLASS_LINES = 200


def project_modules(with_tests: bool = False) -> list[str]:
    folders = ["", "environments", "memories", "lab", *(["tests"] if with_tests else [])]
    return sorted(path for folder in folders for path in glob.glob(os.path.join(ROOT, folder, "*.py")))


def test_no_class_is_longer_than_200_lines() -> None:
    long = []
    for path in project_modules():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long.append(f"{os.path.relpath(path, ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, f"split these classes: {long}"


def test_the_per_step_memory_protocol_is_written_once() -> None:
    # A memory's commit is called by ActorCriticModel.act alone (a memory may call its own methods).
    callers = []
    for path in project_modules(with_tests=True):
        name = os.path.relpath(path, ROOT)
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "commit":
                callers.append(f"{name}:{node.lineno}")
    assert [caller.split(":")[0] for caller in callers] == ["model.py"], callers
