"""Tests of worker.py: equivalence of in-process and subprocess stepping, same-step autoreset, failure reporting."""

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import contextlib  # noqa: E402
import multiprocessing  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from environments import create_env  # noqa: E402
from worker import StepResult, WorkerError, Workers  # noqa: E402

POC = {"type": "PocMemoryEnv"}
POC_GLOB = {"type": "PocMemoryEnv", "glob": True, "freeze": False}
MORTAR_2 = {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": [2]}}


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fails the test with TimeoutError instead of hanging when the block runs longer than seconds."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def rollout(config: dict, n_envs: int, n_processes: int, n_steps: int, seed: int = 0) -> tuple[np.ndarray, list[StepResult]]:
    """Resets and steps Workers with random actions drawn from a fixed generator.

    Returns:
        The reset observations (N, *obs_shape) and the StepResult of every step.
    """
    rng = np.random.default_rng(42)
    with time_limit(60), Workers(config, n_envs, n_processes, seed=seed) as workers:
        first = workers.reset()
        results = []
        for _ in range(n_steps):
            actions = np.stack([rng.integers(0, n, size=n_envs) for n in workers.action_dims], axis=1)
            results.append(workers.step(actions))
    return first, results


def assert_same_results(expected: list[StepResult], actual: list[StepResult]) -> None:
    """Asserts that two rollouts agree field by field."""
    assert len(expected) == len(actual)
    for a, b in zip(expected, actual, strict=True):
        for field in ("obs", "rewards", "terminated", "truncated"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        assert a.final_obs.keys() == b.final_obs.keys()
        assert all(np.array_equal(a.final_obs[i], b.final_obs[i]) for i in a.final_obs)
        assert a.episodes == b.episodes


@pytest.mark.parametrize("config, n_envs, n_steps", [(POC_GLOB, 5, 200), (MORTAR_2, 3, 80)], ids=["poc", "mortar"])
def test_in_process_and_subprocesses_agree(config: dict, n_envs: int, n_steps: int) -> None:
    first, expected = rollout(config, n_envs, 0, n_steps)
    assert sum(len(result.episodes) for result in expected) > n_envs  # autoresets happened
    for n_processes in (2, n_envs):
        other_first, actual = rollout(config, n_envs, n_processes, n_steps)
        assert np.array_equal(first, other_first)
        assert_same_results(expected, actual)


def test_first_reset_seeds_env_i_with_seed_plus_i() -> None:
    with Workers(POC_GLOB, 4, 2, seed=10) as workers:
        obs = workers.reset()
        assert obs.shape == (4, 3) and obs.dtype == np.float32
    for i in range(4):
        assert np.array_equal(obs[i], create_env(POC_GLOB).reset(seed=10 + i)[0])


@pytest.mark.parametrize("n_processes", [0, 2])
def test_same_step_autoreset_after_truncation(n_processes: int) -> None:
    with Workers(POC, 4, n_processes, seed=0) as workers:
        workers.reset()
        for t in range(32):
            result = workers.step(np.full((4, 1), t % 2))  # oscillates in place until the 32-step limit
            if t < 31:
                assert not result.truncated.any() and not result.final_obs and not result.episodes
    assert result.truncated.all() and not result.terminated.any()
    assert sorted(result.final_obs) == [0, 1, 2, 3]
    for i in range(4):
        assert list(result.final_obs[i][[0, 2]]) == [0.0, 0.0]  # last obs of the old episode: goals hidden
        assert sorted(result.obs[i][[0, 2]]) == [-1.0, 1.0]  # first obs of the new episode: goals shown
    assert [episode["length"] for episode in result.episodes] == [32.0] * 4
    assert result.rewards.dtype == np.float32 and result.terminated.dtype == bool


@pytest.mark.parametrize("n_processes", [0, 1])
def test_same_step_autoreset_after_termination(n_processes: int) -> None:
    with Workers({"type": "Failing", "fail_at_step": 1000}, 2, n_processes, seed=0) as workers:
        workers.reset()
        results = [workers.step(np.zeros((2, 1), dtype=np.int64)) for _ in range(8)]
    last = results[-1]
    assert last.terminated.all()
    assert np.all(last.obs == 0.0)  # Failing's first observation
    assert all(np.all(last.final_obs[i] == 1.0) for i in range(2))  # its observation at t = 8
    assert last.episodes == [{"reward": 8.0, "length": 8.0}] * 2
    assert not any(result.terminated.any() for result in results[:-1])


@pytest.mark.parametrize("n_processes", [0, 1])
def test_reset_params_persist_through_autoreset(n_processes: int) -> None:
    _, results = rollout(MORTAR_2, 2, n_processes, 400)
    lengths = [episode["length"] for result in results for episode in result.episodes]
    assert len(lengths) >= 10
    # With memory-gym's default of 10 commands, showing the commands alone takes 40 steps.
    assert max(lengths) < 40
    completed = {episode["commands_completed"] for result in results for episode in result.episodes}
    assert completed <= {0.0, 0.5, 1.0}


def test_multidiscrete_action_dims() -> None:
    config = {"type": "MemoryGym", "name": "SearingSpotlights-v0"}
    with Workers(config, 2, 1, seed=0) as workers:
        assert workers.action_dims == [3, 3]
        workers.reset()
        assert workers.step(np.ones((2, 2), dtype=np.int64)).obs.shape == (2, 3, 84, 84)


def live_child_pids() -> set[int]:
    """Returns the pids of this process's children that are still running."""
    return {process.pid for process in multiprocessing.active_children()}


@pytest.mark.parametrize("n_processes", [0, 2])
def test_env_exception_reaches_main_process_with_traceback(n_processes: int) -> None:
    workers = Workers({"type": "Failing", "fail_at_step": 3}, 4, n_processes, seed=0)
    pids = live_child_pids()
    assert len(pids) == n_processes
    workers.reset()
    workers.step(np.zeros((4, 1), dtype=np.int64))
    workers.step(np.zeros((4, 1), dtype=np.int64))
    with time_limit(20), pytest.raises(WorkerError) as error:
        workers.step(np.zeros((4, 1), dtype=np.int64))
    message = str(error.value)
    assert "deliberate failure at step 3" in message
    assert "environment 0" in message
    assert "Traceback (most recent call last)" in message and "failing_env.py" in message
    assert not live_child_pids()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    workers.close()  # a second close after the automatic one is harmless


@pytest.mark.parametrize(
    "n_processes",
    [0, pytest.param(2, marks=pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork"))],
)
def test_construction_failure_reaches_main_process(n_processes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def create_env_failing_on_second_call(env_config: dict, evaluation: bool = False) -> object:
        if built:  # each child starts from an empty copy of the list, so env 1 is the first to fail
            raise RuntimeError("cannot build this one")
        built.append(env_config)
        return create_env(env_config, evaluation=evaluation)

    built: list[dict] = []
    monkeypatch.setattr("worker.create_env", create_env_failing_on_second_call)  # forked children inherit the patch
    with time_limit(20), pytest.raises(WorkerError, match="environment 1 failed during construction") as error:
        Workers(POC, 4, n_processes, seed=0)
    assert "cannot build this one" in str(error.value)
    assert not live_child_pids()


def test_dying_worker_is_detected_quickly() -> None:
    workers = Workers({"type": "Failing", "fail_at_step": 2, "mode": "exit"}, 4, 2, seed=0)
    workers.reset()
    workers.step(np.zeros((4, 1), dtype=np.int64))
    start = time.monotonic()
    with time_limit(20), pytest.raises(WorkerError, match="exit code 3") as error:
        workers.step(np.zeros((4, 1), dtype=np.int64))
    assert time.monotonic() - start < 5.0
    assert "environments 0..1" in str(error.value)
    assert not live_child_pids()


def test_worker_killed_between_steps_is_reported() -> None:
    workers = Workers(POC, 4, 2, seed=0)
    workers.reset()
    victim = min(live_child_pids())
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)
    with time_limit(20), pytest.raises(WorkerError, match="exit code -9"):
        workers.step(np.zeros((4, 1), dtype=np.int64))
    assert not live_child_pids()


def test_close_is_idempotent_and_stops_every_child() -> None:
    workers = Workers(POC, 6, 3, seed=0)
    pids = live_child_pids()
    assert len(pids) == 3
    workers.reset()
    with time_limit(20):
        workers.close()
        workers.close()
    assert not live_child_pids()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_children_ignore_sigint() -> None:
    with Workers(POC, 2, 2, seed=0) as workers:
        workers.reset()
        for pid in live_child_pids():
            os.kill(pid, signal.SIGINT)
        time.sleep(0.3)
        assert len(live_child_pids()) == 2
        assert workers.step(np.zeros((2, 1), dtype=np.int64)).obs.shape == (2, 3)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_processes"):
        Workers(POC, 2, 3, seed=0)
    with pytest.raises(ValueError, match="environment.type"):
        Workers({"type": "Nope"}, 2, 0, seed=0)
    with Workers(POC, 2, 0, seed=0) as workers:
        workers.reset()
        with pytest.raises(ValueError, match=r"\(2, 1\)"):
            workers.step(np.zeros(2, dtype=np.int64))
