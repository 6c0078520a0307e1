"""Bad input, faults and interruptions: a clear message, no process left behind, the work so far kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import gymnasium
import numpy as np
import pytest
import torch
import yaml
from conftest import small_config
from gymnasium import spaces

import ppo
import train
import trainer as trainer_module
from checkpoint import load_file
from config import ConfigError, parse_overrides, validate_config
from distributed import SINGLE
from model import PolicyOutput
from trainer import PPOTrainer, TrainingStopped, stop_message

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = {
    "environment": {"type": "PocMemoryEnv"},
    "n_workers": 2,
    "worker_steps": 8,
    "n_mini_batch": 1,
    "transformer": {"num_blocks": 1, "embed_dim": 8, "num_heads": 2, "memory_length": 4},
}


def with_change(path: str, value: object) -> dict:
    """GOOD with one (dotted) key set, or removed when value is ...; unknown keys are added."""
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    *parents, leaf = path.split(".")
    node = raw
    for parent in parents:
        node = node.setdefault(parent, {})
    if value is ...:
        node.pop(leaf)
    else:
        node[leaf] = value
    return raw


# (change, words the message must contain)
BAD_CONFIGS = [
    (("epochz", 3), ["epochz", "did you mean 'epochs'?", "Allowed keys"]),
    (("transformer.memory_lenght", 8), ["transformer.memory_lenght", "did you mean 'transformer.memory_length'?"]),
    (("learning_rate_schedule.inital", 1e-4), ["did you mean 'learning_rate_schedule.initial'?"]),
    (("zzz", 3), ["unknown key 'zzz': Allowed keys"]),
    (("environment", ...), ["environment", "missing"]),
    (("environment.type", ...), ["environment.type"]),
    (("gamma", "high"), ["gamma", "'high'", "float"]),
    (("n_workers", 0), ["n_workers", "0", "> 0"]),
    (("worker_steps", -8), ["worker_steps", "-8"]),
    (("updates", 2.5), ["updates", "2.5", "int"]),
    (("transformer.memory_length", 0), ["transformer.memory_length", "0"]),
    (("transformer.embed_dim", 9), ["embed_dim", "9", "num_heads"]),
    (("transformer.num_heads", 3), ["embed_dim", "num_heads", "3"]),
    (
        ("transformer", {**GOOD["transformer"], "num_heads": 1, "embed_dim": 7, "positional_encoding": "relative"}),
        ["even", "7"],
    ),
    (("transformer.layer_norm", "middle"), ["transformer.layer_norm", "middle", "pre"]),
    (("n_mini_batch", 3), ["n_mini_batch", "3", "divisible"]),
    (("sequence_length", 3), ["sequence_length", "3", "worker_steps"]),
    (("environment.type", "Procgen"), ["environment.type", "Procgen"]),
    (("environment", {"type": "MiniGrid", "name": "MiniGrid-Nope-v0"}), ["environment.name", "MiniGrid-Nope-v0"]),
    (("environment", {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"speed": 2}}), ["speed"]),
    (("transformer.memory_length", 64), ["memory_length", "64", "max_episode_steps", "32"]),
    (("learning_rate_schedule", {"initial": 1e-3}), ["learning_rate_schedule.final", "missing"]),
    (("beta_schedule", {"initial": 1e-3, "final": 0.0, "max_decay_steps": 0}), ["beta_schedule.max_decay_steps", "0"]),
    (("clip_range_schedule", 0.2), ["clip_range_schedule", "mapping"]),
]


def test_set_parses_yaml_values_and_an_empty_value_as_the_empty_string() -> None:
    items = ["updates=10", "transformer.positional_encoding=", "beta_schedule={initial: 0.01}", "memory_dtype=bfloat16"]
    assert parse_overrides(items) == {
        "updates": 10,
        "transformer.positional_encoding": "",
        "beta_schedule": {"initial": 0.01},
        "memory_dtype": "bfloat16",
    }
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["updates"])


@pytest.mark.parametrize("change,words", BAD_CONFIGS, ids=[f"{c[0]}={c[1]!r}"[:60] for c, _ in BAD_CONFIGS])
def test_config_errors_name_the_key_and_value(change: tuple, words: list[str]) -> None:
    validate_config(GOOD)  # the base is fine
    with pytest.raises(ConfigError) as error:
        validate_config(with_change(*change))
    for word in words:
        assert word in str(error.value), f"'{word}' missing from: {error.value}"


def run_train(tmp_path: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--cpu", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def write_config(tmp_path: str, raw: dict | str) -> str:
    path = os.path.join(tmp_path, "config.yaml")
    with open(path, "w") as file:
        file.write(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "content,words",
    [
        (with_change("transformer.embed_dim", 9), ["embed_dim", "9"]),
        ("gamma: [0.9\nupdates: 3", ["not valid YAML"]),
        (None, ["does not exist"]),
    ],
    ids=["bad value", "bad yaml", "missing file"],
)
def test_cli_config_errors_exit_fast_without_traceback(tmp_path: str, content: object, words: list[str]) -> None:
    path = write_config(tmp_path, content) if content is not None else os.path.join(tmp_path, "nope.yaml")
    start = time.time()
    result = run_train(tmp_path, f"--config={path}")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr
    assert time.time() - start < 60
    assert not os.path.exists(os.path.join(tmp_path, "summaries")), "nothing may start before the config is valid"


def leftover_processes(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (a unique run id)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if marker.encode() in file.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def failing_config(tmp_path: str, mode: str) -> str:
    raw = with_change("environment", {"type": "Failing", "fail_at_step": 30, "mode": mode})
    raw.update(n_processes=2, updates=50)
    return write_config(tmp_path, raw)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_failing_environment_stops_training_with_traceback_and_checkpoint(tmp_path: str, mode: str) -> None:
    marker = f"fail-{mode}-{os.getpid()}"
    result = run_train(tmp_path, f"--config={failing_config(tmp_path, mode)}", f"--run-id={marker}", timeout=60)
    assert result.returncode == 1
    assert "an environment worker failed" in result.stderr
    if mode == "raise":
        assert "deliberate failure at step 30" in result.stderr and "Traceback" in result.stderr  # the worker's own
    else:
        assert "exit code 3" in result.stderr
    checkpoint = load_file(os.path.join(tmp_path, "models", marker, "checkpoint.pt"))
    assert checkpoint["update"] >= 1  # each env fails at its 30th step: after the first 8-step rollouts
    assert f"--resume=models/{marker}/checkpoint.pt" in result.stderr
    time.sleep(0.5)
    assert leftover_processes(marker) == []


def wait_for_line(process: subprocess.Popen, text: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"'{text}' never appeared")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_writes_checkpoint_and_resume_continues(tmp_path: str, sig: int) -> None:
    marker = f"signal-{int(sig)}-{os.getpid()}"
    raw = dict(GOOD, updates=10_000, n_processes=1, checkpoint_interval=0)
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--cpu", f"--config={write_config(tmp_path, raw)}"]
    process = subprocess.Popen(
        [*command, f"--run-id={marker}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(process, "update    3/", 120)
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    path = os.path.join(tmp_path, "models", marker, "checkpoint.pt")
    saved = load_file(path)["update"]
    assert saved >= 3
    assert os.path.isfile(os.path.join(tmp_path, "models", f"{marker}.nn"))
    assert not os.path.exists(os.path.join(tmp_path, "models", f"{marker}.lock")), "the run's lock is released"
    time.sleep(0.5)
    assert leftover_processes(marker) == []
    result = run_train(tmp_path, f"--resume={path}", f"--set=updates={saved + 2}")
    assert result.returncode == 0, result.stderr
    assert f"update {saved + 2:4d}/{saved + 2}" in result.stdout
    assert load_file(path)["update"] == saved + 2


@pytest.mark.slow
def test_sigkill_leaves_a_usable_checkpoint(tmp_path: str) -> None:
    marker = f"sigkill-{os.getpid()}"
    raw = dict(GOOD, updates=10_000, checkpoint_interval=1)
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--cpu", f"--config={write_config(tmp_path, raw)}"]
    process = subprocess.Popen(
        [*command, f"--run-id={marker}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(process, "update    5/", 120)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    path = os.path.join(tmp_path, "models", marker, "checkpoint.pt")
    saved = load_file(path)["update"]
    result = run_train(tmp_path, f"--resume={path}", f"--set=updates={saved + 1}")
    assert result.returncode == 0, result.stderr
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.startswith(".tmp-")]


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_update(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = small_config(updates=5, eval_interval=0)
    trainer = PPOTrainer(config, "nan", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    original = ppo.ppo_loss

    def poisoned(out: PolicyOutput, *args: object) -> object:
        if trainer.update == 2:  # the third update
            out = out._replace(value=out.value * float("nan"))
        return original(out, *args)

    monkeypatch.setattr(ppo, "ppo_loss", poisoned)
    with pytest.raises(TrainingStopped) as error:
        trainer.run()
    assert "non-finite" in str(error.value) and "update 3" in str(error.value)
    checkpoint = load_file(os.path.join(tmp_path, "nan", "checkpoint.pt"))
    assert checkpoint["update"] == 2
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["enjoy", "resume"])
def test_missing_and_foreign_model_files(tmp_path: str, tool: str) -> None:
    foreign = os.path.join(tmp_path, "foreign.nn")
    torch.save({"weights": torch.zeros(3)}, foreign)
    text = os.path.join(tmp_path, "notes.txt")
    with open(text, "w") as file:
        file.write("not a model")
    for path, words in [
        (os.path.join(tmp_path, "missing.nn"), "does not exist"),
        (foreign, "not a model"),
        (text, "not a model"),
    ]:
        if tool == "enjoy":
            command = [sys.executable, os.path.join(ROOT, "enjoy.py"), f"--model={path}", "--no-render", "--cpu"]
            result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        else:
            result = run_train(tmp_path, f"--resume={path}")
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_resume_with_a_mismatched_environment(tmp_path: str) -> None:
    result = run_train(tmp_path, f"--config={write_config(tmp_path, dict(GOOD, updates=1))}", "--run-id=shape")
    assert result.returncode == 0, result.stderr
    path = os.path.join(tmp_path, "models", "shape", "checkpoint.pt")
    result = run_train(tmp_path, f"--resume={path}", "--set=environment={type: CartPole}")
    assert result.returncode == 2
    assert "observations (3,)" in result.stderr and "(4,)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_memory_gradients_with_plain_path_fails_at_start(tmp_path: str) -> None:
    path = write_config(tmp_path, GOOD)
    result = run_train(tmp_path, f"--config={path}", "--memory-path=plain", "--set=transformer.memory_gradients=true")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "memory_gradients" in result.stderr and "--memory-path fast" in result.stderr
    assert not os.path.exists(os.path.join(tmp_path, "summaries")), "nothing may start before the config is valid"


@pytest.mark.slow
def test_unwritable_models_folder_fails_at_start(tmp_path: str) -> None:
    with open(os.path.join(tmp_path, "models"), "w") as file:  # a file where the folder should be (root ignores chmod)
        file.write("in the way")
    result = run_train(tmp_path, f"--config={write_config(tmp_path, GOOD)}")
    assert result.returncode == 2
    assert "cannot write to 'models/'" in result.stderr and "Traceback" not in result.stderr


def current_rss_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_memory_stays_flat_over_many_updates(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = small_config(updates=20, eval_interval=5, checkpoint_interval=3, n_workers=8, worker_steps=32, sequence_length=16)
    trainer = PPOTrainer(config, "rss", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    rss = {}
    original = trainer.log

    def log(*args: object) -> str:
        rss[trainer.update + 1] = current_rss_mb()
        return original(*args)

    monkeypatch.setattr(trainer, "log", log)
    trainer.run()
    growth = rss[20] - rss[2]
    print(f"RSS after update 2: {rss[2]:.1f} MB, after update 20: {rss[20]:.1f} MB")
    assert growth < 15, f"RSS grew by {growth:.1f} MB from update 2 to 20: {rss}"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["evaluation", "optimisation"])
def test_any_error_after_an_update_keeps_a_checkpoint(tmp_path: str, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    config = small_config(updates=4, eval_interval=1)
    trainer = PPOTrainer(config, "bug", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    if where == "evaluation":
        original = trainer.evaluate

        def evaluate() -> dict[str, float]:
            if trainer.update == 2:
                raise RuntimeError("the evaluation environment broke")
            return original()

        monkeypatch.setattr(trainer, "evaluate", evaluate)
    else:
        original = trainer.learner.optimize

        def optimize(*args: object) -> dict[str, float]:
            if trainer.update == 2:
                raise MemoryError("out of memory in the optimisation")
            return original(*args)

        monkeypatch.setattr(trainer.learner, "optimize", optimize)
    with pytest.raises(TrainingStopped) as error:
        trainer.run()
    message = str(error.value)
    assert "unexpected error" in message and "Traceback" in message  # a bug: where it happened is shown
    assert "--resume=" in message
    checkpoint = load_file(os.path.join(tmp_path, "bug", "checkpoint.pt"))
    assert checkpoint["update"] == 2
    assert os.path.isfile(os.path.join(tmp_path, "bug.nn"))


@pytest.mark.slow
def test_training_evaluations_play_the_same_episodes(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    seeds = []
    original = trainer_module.evaluate

    def evaluate(*args: object, seed: int = 0, **kwargs: object) -> list[dict[str, float]]:
        seeds.append(seed)
        return original(*args, seed=seed, **kwargs)

    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    config = small_config(updates=3, eval_interval=1, eval_episodes=2)
    PPOTrainer(config, "same", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path)).run()
    assert len(seeds) == 3 and len(set(seeds)) == 1, seeds  # one fixed set of episodes: the curve compares like with like
    assert capsys.readouterr().out.count("evaluating 2 unseen episodes") == 3  # nothing runs silently


def test_eval_video_needs_an_environment_that_renders() -> None:
    with pytest.raises(ConfigError, match="video_interval"):
        small_config(environment={"type": "Failing"}, video_interval=1)
    assert small_config(video_interval=1).video_interval


@pytest.mark.slow
def test_stopping_in_the_final_evaluation_says_so(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import PPOTrainer, TrainingStopped

    def interrupted(self: PPOTrainer) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(PPOTrainer, "evaluate", interrupted)
    config = small_config(updates=1, eval_interval=1)
    trainer = PPOTrainer(config, "one", torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    with pytest.raises(TrainingStopped) as error:
        trainer.run()
    message = str(error.value)
    assert "after the last update (1), during the final evaluation or saving" in message
    assert "(after update 1)" in message and "update 2" not in message


class WrongShapeEnv(gymnasium.Env):
    """Declares (3,) observations but returns (2,) ones from step ``from_step`` of each episode on (0: the reset's):
    an environment whose bug shows before training starts (0) or in the first rollout (1)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, from_step: int = 1) -> None:
        self.from_step, self.t = from_step, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._observation(), 0.0, False, False, {}

    def _observation(self) -> np.ndarray:
        return np.zeros(2 if self.t >= self.from_step else 3, dtype=np.float32)


if "WrongShape-v0" not in gymnasium.registry:  # this module is imported again by the id "test_reliability:WrongShape-v0"
    gymnasium.register(id="WrongShape-v0", entry_point=WrongShapeEnv, max_episode_steps=8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "from_step,words",
    [
        (1, "training stopped: an observation does not fit its space during update 1 of 2"),
        (0, "the environment failed to start"),
    ],
)
def test_a_run_stopped_before_its_first_update_says_so_once_and_the_same_command_runs_again(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, from_step: int, words: str
) -> None:
    monkeypatch.chdir(tmp_path)
    broken = {"type": "Gymnasium", "id": "test_reliability:WrongShape-v0", "kwargs": {"from_step": from_step}}
    path = write_config(tmp_path, dict(with_change("environment", broken), updates=2))
    argv = [f"--config={path}", "--run-id=early", "--cpu"]
    for _ in range(2):  # and again: nothing the first attempt left refuses the same command
        assert train.main(argv) == 1
        error = capsys.readouterr().err
        assert words in error and "(3,)" in error and "(2,)" in error, error
        assert "Traceback" not in error and "--resume" not in error and "exists already" not in error
        assert os.listdir("models") == [], "no checkpoint, model file or lock"
    write_config(tmp_path, dict(GOOD, updates=1))  # the environment fixed
    assert train.main(argv) == 0, capsys.readouterr().err
    assert load_file(os.path.join("models", "early", "checkpoint.pt"))["update"] == 1


def test_an_error_with_a_complete_message_stops_without_a_traceback() -> None:
    error = ConfigError("'x' must be > 0, got -1: set x to a positive number")
    expected = f"training stopped: the config does not fit during update 1 of 2: {error}"
    assert stop_message(error, SINGLE, 0, 2) == expected
