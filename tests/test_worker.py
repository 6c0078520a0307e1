"""Tests of worker.py, env_group.py and environments/replay.py: in-process vs subprocess stepping, same-step autoreset, failure
reporting, seeding, restore, and the group's recorder and the replay on their own."""

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import contextlib  # noqa: E402
import io  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import toy_env  # noqa: E402

import environments  # noqa: E402
from env_group import EnvGroup  # noqa: E402
from environments import EnvFamily, Key, create_env  # noqa: E402
from environments.replay import EpisodeRecorder, check_states, replay_episode, restore  # noqa: E402
from worker import ObservationError, StepResult, WorkerError, Workers, environment_processes, episode_seed  # noqa: E402

POC = {"type": "PocMemoryEnv"}
POC_GLOB = {"type": "PocMemoryEnv", "glob": True, "freeze": False}
MORTAR_2 = {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": [2]}}
CARTPOLE = {"type": "CartPole"}
MINIGRID = {"type": "MiniGrid", "name": "MiniGrid-MemoryS9-v0"}


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


def random_actions(rng: np.random.Generator, workers: Workers) -> np.ndarray:
    """Draws one uniformly random action (N, A) per environment."""
    return np.stack([rng.integers(0, n, size=workers.n_envs) for n in workers.action_dims], axis=1)


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
            results.append(workers.step(random_actions(rng, workers)))
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


def test_each_reset_seeds_env_i_with_its_episode_seed() -> None:
    with Workers(POC_GLOB, 4, 2, seed=10) as workers:
        first = workers.reset()
        assert first.shape == (4, 3) and first.dtype == np.float32
        assert workers.state() == [{"episode": 0, "actions": []}] * 4
        second = workers.reset()  # a further reset() starts each environment's next episode
        assert workers.state() == [{"episode": 1, "actions": []}] * 4
    for i in range(4):
        assert np.array_equal(first[i], create_env(POC_GLOB).reset(seed=episode_seed(10, i, 0))[0])
        assert np.array_equal(second[i], create_env(POC_GLOB).reset(seed=episode_seed(10, i, 1))[0])


def test_episode_seeds_differ_across_envs_episodes_and_base_seeds() -> None:
    seeds = {episode_seed(base, i, k) for base in range(3) for i in range(8) for k in range(8)}
    assert len(seeds) == 3 * 8 * 8
    assert all(0 <= seed < 2**32 for seed in seeds)
    hashed = int(np.random.SeedSequence([5, 2, 3]).generate_state(1)[0])  # the documented formula
    assert episode_seed(5, 2, 3) == hashed & ~1 and episode_seed(5, 2, 3, evaluation=True) == hashed | 1


def test_autoresets_use_episode_seeds_and_vary_the_goal_side() -> None:
    with Workers(POC, 4, 0, seed=0) as workers:
        obs = workers.reset()
        sides = [[obs[i][2]] for i in range(4)]  # right goal signal: +1 when the right goal rewards
        for _ in range(70):  # always right: 2 frozen steps and 5 moves, so 10 episodes per environment
            result = workers.step(np.ones((4, 1), dtype=np.int64))
            for i in result.final_obs:
                expected = create_env(POC).reset(seed=episode_seed(0, i, len(sides[i])))[0]
                assert np.array_equal(result.obs[i], expected)
                sides[i].append(result.obs[i][2])
        assert [state["episode"] for state in workers.state()] == [10] * 4
    assert len({side[0] for side in sides}) == 2  # first episodes differ across environments
    assert all(set(side) == {-1.0, 1.0} for side in sides)  # and episodes differ within each environment


def test_memory_gym_episode_seeds_vary_and_stay_in_their_ranges() -> None:
    for evaluation, low, high in ((False, 0, 100_000), (True, 100_000, 200_000)):
        env = create_env(MORTAR_2, evaluation=evaluation)
        drawn = []
        for i in range(3):
            for k in range(3):
                env.reset(seed=episode_seed(0, i, k))
                drawn.append(env.episode_seed)
        assert all(low <= seed < high for seed in drawn)
        assert len(set(drawn)) == len(drawn)
    with Workers(MORTAR_2, 2, 0, seed=0, evaluation=True) as workers:
        obs = workers.reset()
    for i in range(2):  # env is the evaluation instance built last
        assert np.array_equal(obs[i], env.reset(seed=episode_seed(0, i, 0, evaluation=True))[0])


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
    monkeypatch.setattr("env_group.create_env", create_env_failing_on_second_call)  # forked children inherit the patch
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
    with pytest.raises(ValueError, match="seed = -1"):
        Workers(POC, 2, 0, seed=-1)
    with pytest.raises(ValueError, match="environment.type"):
        Workers({"type": "Nope"}, 2, 0, seed=0)
    with Workers(POC, 2, 0, seed=0) as workers:
        workers.reset()
        with pytest.raises(ValueError, match=r"\(2, 1\)"):
            workers.step(np.zeros(2, dtype=np.int64))


def continue_after_restore(
    config: dict, n_envs: int, n_steps: int, n_more: int, processes: tuple[int, int], via_checkpoint: bool = False
) -> tuple[list[dict], list[StepResult], list[StepResult], list[StepResult]]:
    """Steps Workers A, restores Workers B from A's state, then steps both with the same further actions.

    Args:
        processes: n_processes of A and of B.
        via_checkpoint: Whether the state goes through torch.save and torch.load(weights_only=True) on its way to B.

    Returns:
        A's state, A's steps before it, then A's and B's StepResults after it.
    """
    rng = np.random.default_rng(7)
    with time_limit(60), Workers(config, n_envs, processes[0], seed=3) as a:
        a.reset()
        before = [a.step(random_actions(rng, a)) for _ in range(n_steps)]
        state = a.state()
        if via_checkpoint:
            buffer = io.BytesIO()
            torch.save({"workers": state}, buffer)
            buffer.seek(0)
            state = torch.load(buffer, weights_only=True)["workers"]
        with Workers(config, n_envs, processes[1], seed=3) as b:
            assert np.array_equal(b.restore(state), before[-1].obs)
            assert b.state() == state
            actions = [random_actions(rng, a) for _ in range(n_more)]
            expected = [a.step(action) for action in actions]
            actual = [b.step(action) for action in actions]
    return state, before, expected, actual


def assert_restore_was_tested(state: list[dict], before: list[StepResult], after: list[StepResult]) -> None:
    """Asserts that A's state came after several episode ends and that an episode running at the snapshot ended later."""
    assert sum(len(result.episodes) for result in before) >= 2
    assert max(entry["episode"] for entry in state) >= 1
    running = {i for i, entry in enumerate(state) if entry["actions"]}
    ended_later = {i for result in after for i in result.final_obs}
    assert running & ended_later  # so equal episodes lists also show that replay restored the episode statistics


@pytest.mark.parametrize(
    "config, n_steps, n_more",
    [(POC_GLOB, 60, 40), (CARTPOLE, 60, 60), (MINIGRID, 110, 96), (MORTAR_2, 60, 40)],
    ids=["poc", "cartpole", "minigrid", "mortar"],
)
def test_restore_continues_bit_for_bit(config: dict, n_steps: int, n_more: int) -> None:
    state, before, expected, actual = continue_after_restore(config, 3, n_steps, n_more, (0, 0))
    assert_same_results(expected, actual)
    assert_restore_was_tested(state, before, expected)


@pytest.mark.parametrize(
    "config, processes", [(POC_GLOB, (0, 2)), (MORTAR_2, (2, 0))], ids=["poc-into-2-processes", "mortar-from-2-processes"]
)
def test_restore_across_process_counts_through_a_checkpoint(config: dict, processes: tuple[int, int]) -> None:
    state, before, expected, actual = continue_after_restore(config, 4, 60, 40, processes, via_checkpoint=True)
    assert_same_results(expected, actual)
    assert_restore_was_tested(state, before, expected)


@pytest.mark.parametrize("n_processes", [0, 2])
def test_restore_rejects_a_state_whose_episode_ends_early(n_processes: int) -> None:
    workers = Workers(POC, 2, n_processes, seed=0)
    # PoC starts at the centre: 2 frozen steps, then the 5th move to the right reaches the goal at action 7.
    states = [{"episode": 0, "actions": []}, {"episode": 4, "actions": [[1]] * 10}]
    with time_limit(20), pytest.raises(WorkerError, match="does not match environment 1") as error:
        workers.restore(states)
    assert "episode 4 ended at replayed action 7 of 10" in str(error.value)
    assert not live_child_pids()  # a failed restore closes the workers, as any WorkerError does
    workers.close()


def test_restore_rejects_malformed_states() -> None:
    good = {"episode": 2, "actions": [[0], [1]]}
    cases = [
        ({"episode": 0}, "states is a dict"),
        ([good], "states has 1 entries, but these Workers run n_envs = 2"),
        ([good, [0, []]], r"states\[1\] is a list"),
        ([good, {"actions": []}], r"states\[1\] lacks the key\(s\) \['episode'\]"),
        ([good, {"episode": -1, "actions": []}], r"states\[1\]\['episode'\] = -1"),
        ([good, {"episode": 0, "actions": "01"}], r"states\[1\]\['actions'\] is a str"),
        ([good, {"episode": 0, "actions": [[0], [2]]}], r"states\[1\]\['actions'\]\[1\] = \[2\] is not an action"),
        ([good, {"episode": 0, "actions": [[0, 1]]}], r"list of 1 int\(s\) in \[0, n\) for n in the action counts \[2\]"),
    ]
    with Workers(POC, 2, 0, seed=0) as workers:
        for states, message in cases:
            with pytest.raises(ValueError, match=message):
                workers.restore(states)
        assert workers.restore([good, good]).shape == (2, 3)  # rejected states leave the workers usable
        assert workers.state() == [good, good]


def test_step_and_state_need_a_started_episode() -> None:
    with Workers(POC, 2, 0, seed=0) as workers:
        with pytest.raises(RuntimeError, match=r"call reset\(\) or restore\(\) first"):
            workers.step(np.zeros((2, 1), dtype=np.int64))
        with pytest.raises(RuntimeError, match=r"call reset\(\) or restore\(\) first"):
            workers.state()


class LoggingRecorder:
    """A recorder that logs what a group reports and starts environment j at episode first[j]."""

    def __init__(self, first: list[int]) -> None:
        """Starts with an empty log; first holds the number of each environment's first episode."""
        self.next = list(first)
        self.calls: list[tuple] = []

    def next_episode(self, j: int) -> int:
        """Returns the episode that environment j starts next."""
        return self.next[j]

    def start(self, j: int, episode: int) -> None:
        """Logs an episode start."""
        self.calls.append(("start", j, episode))
        self.next[j] = episode + 1

    def record(self, j: int, action: list[int]) -> None:
        """Logs an action."""
        self.calls.append(("record", j, action))


def test_group_takes_episode_numbers_from_its_recorder_and_reports_to_it() -> None:
    recorder = LoggingRecorder([0, 7])
    group = EnvGroup(POC, range(2, 4), 5, False, recorder)  # global indices 2 and 3
    try:
        obs = group.reset()
        assert recorder.calls == [("start", 0, 0), ("start", 1, 7)]
        assert np.array_equal(obs[0], create_env(POC).reset(seed=episode_seed(5, 2, 0))[0])
        assert np.array_equal(obs[1], create_env(POC).reset(seed=episode_seed(5, 3, 7))[0])
        recorder.calls.clear()
        group.step(np.array([[1], [0]], dtype=np.int64))
        assert recorder.calls == [("record", 0, [1]), ("record", 1, [0])]
        assert all(type(call[2][0]) is int for call in recorder.calls)  # plain ints, as a checkpoint needs
    finally:
        group.close()


def test_recorder_state_is_a_copy_in_the_checkpoint_format() -> None:
    recorder = EpisodeRecorder(2)
    assert [recorder.next_episode(j) for j in range(2)] == [0, 0]
    recorder.start(0, 3)
    recorder.record(0, [1, 2])
    recorder.start(1, 0)
    state = recorder.state()
    recorder.record(0, [0, 0])
    assert state == [{"episode": 3, "actions": [[1, 2]]}, {"episode": 0, "actions": []}]
    assert recorder.next_episode(0) == 4
    recorder.start(0, 4)  # a new episode forgets the actions of the last one
    assert recorder.state()[0] == {"episode": 4, "actions": []}


def test_replay_restores_a_group_without_workers() -> None:
    rng = np.random.default_rng(0)
    recorder = EpisodeRecorder(3)
    group = EnvGroup(POC_GLOB, range(1, 4), 9, False, recorder)
    other_recorder = EpisodeRecorder(3)
    other = EnvGroup(POC_GLOB, range(1, 4), 9, False, other_recorder)
    try:
        group.reset()
        for _ in range(50):
            result = group.step(rng.integers(0, 2, size=(3, 1)))
        state = recorder.state()
        assert max(entry["episode"] for entry in state) >= 1 and any(entry["actions"] for entry in state)
        assert np.array_equal(restore(other, state), result.obs)
        assert other_recorder.state() == state
        for _ in range(30):
            actions = rng.integers(0, 2, size=(3, 1))
            assert_same_results([group.step(actions)], [other.step(actions)])
    finally:
        group.close()
        other.close()


def test_replay_rejects_an_episode_that_ends_early() -> None:
    group = EnvGroup(POC, range(5, 7), 0, False, EpisodeRecorder(2))
    try:
        # PoC starts at the centre: 2 frozen steps, then the 5th move to the right reaches the goal at action 7.
        with pytest.raises(WorkerError, match="does not match environment 6: its episode 4 ended at replayed action 7 of 9"):
            replay_episode(group, 1, 4, [[1]] * 9)
    finally:
        group.close()


def test_check_states_names_the_bad_entry_and_returns_plain_ints() -> None:
    good = {"episode": 1, "actions": [[2, 1]]}
    checked = check_states(({"episode": np.int64(2), "actions": ((np.int64(1), 0),)}, good), 2, [3, 2])
    assert checked == [{"episode": 2, "actions": [[1, 0]]}, good]
    assert type(checked[0]["episode"]) is int and type(checked[0]["actions"][0][0]) is int
    cases = [
        ([good, {"episode": True, "actions": []}], r"states\[1\]\['episode'\] = True"),
        ([good, {"episode": 0, "actions": [[2, 1], [3, 0]]}], r"states\[1\]\['actions'\]\[1\] = \[3, 0\] is not an action"),
        ([{"episode": 0, "actions": [[1]]}, good], r"states\[0\]\['actions'\]\[0\] = \[1\].*action counts \[3, 2\]"),
        ([good, good, good], "states has 3 entries, but these Workers run n_envs = 2"),
    ]
    for states, message in cases:
        with pytest.raises(ValueError, match=message):
            check_states(states, 2, [3, 2])


def test_environment_processes_auto_fills_the_free_cores_on_a_gpu_only() -> None:
    # -1 (auto) on a GPU: every core but the trainer's steps environments, at most one process per environment.
    assert environment_processes(-1, 32, "cuda", cores=16) == 15
    assert environment_processes(-1, 8, "cuda", cores=16) == 8
    assert environment_processes(-1, 32, "cuda", cores=1) == 0
    # On the CPU the model needs the cores: auto steps the environments in the trainer's process.
    assert environment_processes(-1, 32, "cpu", cores=16) == 0
    # A number is what was asked for, shared among the training processes, at most one per environment.
    assert environment_processes(4, 32, "cuda", cores=16) == 4
    assert environment_processes(5, 16, "cpu", cores=2, ranks=2) == 3
    assert environment_processes(40, 32, "cpu", cores=2) == 32


def test_n_processes_below_auto_is_refused() -> None:
    from conftest import small_config

    from config import ConfigError

    assert small_config(n_processes=-1).n_processes == -1
    with pytest.raises(ConfigError, match="'n_processes' must be >= -1, got -2"):
        small_config(n_processes=-2)


SCRIPTED_SHORT = {"type": "Gymnasium", "id": "toy_env:ToyScripted-v0", "kwargs": {"case": "short_vector"}}


@pytest.mark.parametrize("n_processes", [0, 2])
def test_an_observation_of_the_wrong_shape_stops_with_one_message_naming_env_step_and_shapes(n_processes: int) -> None:
    workers = Workers(SCRIPTED_SHORT, 2, n_processes, seed=0)
    workers.reset()
    workers.step(np.zeros((2, 1), dtype=np.int64))
    with time_limit(20), pytest.raises(ObservationError) as error:  # not a WorkerError: the message is complete
        workers.step(np.zeros((2, 1), dtype=np.int64))
    message = str(error.value)
    assert message.startswith("environment 0 (Gymnasium 'toy_env:ToyScripted-v0') at step 2 of episode 0: ")
    assert "has shape (2,) and dtype float32" in message and "declares shape (3,) and dtype float32" in message
    assert "\n" not in message, "one message, no traceback"
    assert not live_child_pids()


@pytest.fixture
def scripted_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registers the family "ToyScripted": toy_env.ToyScriptedEnv as it is, without the Gymnasium type's wrapper and its
    own check, as a family of one's own would hand over its observations (forked children inherit it)."""
    family = EnvFamily(
        name="ToyScripted",
        schema={"case": Key("short_vector", "a case of toy_env.SCRIPTS")},
        make=lambda config, render_mode, evaluation: toy_env.ToyScriptedEnv(config["case"]),
    )
    monkeypatch.setitem(environments.FAMILIES, family.name, family)


@pytest.mark.parametrize(
    "case, step, patterns",
    [
        ("short_vector", 2, [r"has shape \(2,\) and dtype float32, but its space Box\(-1.0, 1.0, \(3,\), float32\)"]),
        ("short_reset", 0, [r"has shape \(2,\) and dtype float32"]),
        ("level_image", 1, [r"values from 255.0 to 255.0, outside the bounds", r"divide levels 0-255 by 255"]),
        ("extra_key", 2, [r"the key\(s\) \['b'\] that the space does not declare"]),
    ],
)
@pytest.mark.parametrize("n_processes", [0, 1])
def test_the_group_checks_every_familys_observations(
    scripted_family: None, case: str, step: int, patterns: list[str], n_processes: int
) -> None:
    with time_limit(20), Workers({"type": "ToyScripted", "case": case}, 1, n_processes, seed=0) as workers:
        with pytest.raises(ObservationError) as error:
            workers.reset()
            for _ in range(step):
                workers.step(np.zeros((1, 1), dtype=np.int64))
    where = f"step {step}" if step else "the reset"
    assert str(error.value).startswith(f"environment 0 (ToyScripted) at {where} of episode 0: ")
    for pattern in patterns:
        assert re.search(pattern, str(error.value)), (pattern, str(error.value))


def test_a_replayed_observation_is_checked_too(scripted_family: None) -> None:
    group = EnvGroup({"type": "ToyScripted", "case": "short_vector"}, range(3, 4), 0, False, EpisodeRecorder(1))
    try:
        with pytest.raises(ObservationError, match=r"^environment 3 \(ToyScripted\) at step 2 of episode 5 \(replaying"):
            replay_episode(group, 0, 5, [[0], [0]])
    finally:
        group.close()
