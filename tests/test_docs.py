"""The README stays true to the code: every config key and flag documented, every mentioned file present."""

from __future__ import annotations

import os
import re

import pytest

from config import RECURRENCE_SCHEMA, SCHEMA, TRANSFORMER_SCHEMA
from environments import ENV_TYPES, FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def test_every_config_key_is_documented() -> None:
    for key in SCHEMA:
        assert f"`{key}`" in README, key
    for key in TRANSFORMER_SCHEMA:
        assert f"`transformer.{key}`" in README, key
    for key in RECURRENCE_SCHEMA:
        assert f"`recurrence.{key}`" in README, key
    for env_type in ENV_TYPES:
        assert f"`{env_type}`" in README, env_type
        for key in FAMILIES[env_type].schema:
            assert f"`{key}`" in README, f"{env_type}.{key}"


@pytest.mark.parametrize("script", ["train.py", "enjoy.py", "benchmark.py", "experiment.py", "plot.py"])
def test_every_flag_is_documented(script: str) -> None:
    text = open(os.path.join(ROOT, script)).read()
    usage = text.split('"""')[1]
    flags = set(re.findall(r"^\s+(--[a-z-]+)", usage, flags=re.MULTILINE)) - {"--help", "--child", "--overrides"}
    assert flags, "no flags found"
    for flag in flags:
        assert f"`{flag}" in README, f"{script} {flag}"


def test_every_mentioned_file_exists() -> None:
    docs = README + open(os.path.join(ROOT, "docs", "memory.md")).read()
    mentioned = set(re.findall(r"`((?:configs|docs|tests|environments)/[\w./-]+|[\w-]+\.(?:py|txt|yaml))`", docs))
    mentioned |= set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|gif|png))\)", docs))
    assert len(mentioned) > 10
    for path in mentioned:
        candidates = [os.path.join(ROOT, path), os.path.join(ROOT, "docs", path)]
        assert any(os.path.exists(c) for c in candidates), path
