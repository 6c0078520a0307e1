"""Multi-agent environments on PettingZoo's parallel API: agents as worker lanes, joint-action replay, errors for
environments the trainer cannot follow, evaluation with another agent count, and a learned multi-agent memory task."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import resume_matches_uninterrupted, small_config
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

import enjoy
from config import Config, ConfigError, load_config
from environments.recall_env import parallel_env
from evaluation import evaluate
from model import ActorCriticModel
from trainer import PPOTrainer
from worker import WorkerError, Workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECALL = {"type": "PettingZoo", "entry_point": "environments.recall_env:parallel_env", "kwargs": {"agents": 2, "delay": 3}}


class StaggeredEnv(ParallelEnv):
    """Two agents, of which the first ends its episode one step before the second: the agent count changes."""

    metadata = {"name": "staggered_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self._t = list(self.possible_agents), 0
        return {agent: np.zeros(2, np.float32) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self._t += 1
        done = {"a": self._t >= 2, "b": self._t >= 3}
        obs = {agent: np.zeros(2, np.float32) for agent in self.agents}
        rewards, infos = {agent: 0.0 for agent in self.agents}, {agent: {} for agent in self.agents}
        terminations, truncations = {agent: done[agent] for agent in self.agents}, {agent: False for agent in self.agents}
        self.agents = [agent for agent in self.agents if not done[agent]]
        return obs, rewards, terminations, truncations, infos


class MixedSpacesEnv(StaggeredEnv):
    """Agent "b" acts in a larger action space than agent "a"."""

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2 if agent == "a" else 3)


class LateAgentEnv(StaggeredEnv):
    """Agent "b" only joins after the reset."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = super().reset(seed, options)
        self.agents = ["a"]
        return {"a": obs["a"]}, {"a": {}}


class SplitEndEnv(StaggeredEnv):
    """Both agents end at step 2: "a" terminates, "b" is truncated."""

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self._t += 1
        obs = {agent: np.full(2, self._t / 4, np.float32) for agent in self.agents}
        rewards, infos = {agent: 0.0 for agent in self.agents}, {agent: {} for agent in self.agents}
        terminations, truncations = {"a": self._t >= 2, "b": False}, {"a": False, "b": self._t >= 2}
        if self._t >= 2:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


def env_of(name: str) -> dict:
    """An environment section for one of this module's test environments."""
    return {"type": "PettingZoo", "entry_point": f"{__name__}:{name}"}


def test_recall_env_follows_the_parallel_api() -> None:
    parallel_api_test(parallel_env(agents=3, delay=4), num_cycles=40)


def test_an_environment_with_k_agents_fills_k_lanes() -> None:
    with Workers(RECALL, 4, 0, seed=0) as workers:
        assert workers.agents == 2 and workers.observation_space.shape == (3,)
        obs = workers.reset()
        assert obs.shape == (4, 3) and np.all(np.abs(obs[:, 0]) == 1), "every agent sees its cue at the start"
        answers = (obs[:, 0] > 0).astype(np.int64)[:, None]  # each lane answers with its own cue
        for step in range(4):
            result = workers.step(answers if step == 3 else 1 - answers)
            assert not result.terminated.any() or step == 3
        assert result.terminated.all() and np.all(result.rewards == 1), "answers are judged per lane"
        assert sorted(result.final_obs) == [0, 1, 2, 3], "final observations are keyed by lane"
        assert len(result.episodes) == 4, "one episode dict per agent"
        assert all(episode["success"] == 1 and episode["team_reward"] == 2 for episode in result.episodes)
        assert np.all(result.obs[:, 0] != 0), "the next episode started with new cues"


def test_one_wrong_agent_fails_its_team() -> None:
    with Workers(RECALL, 2, 0, seed=3) as workers:
        obs = workers.reset()
        answers = (obs[:, 0] > 0).astype(np.int64)[:, None]
        answers[1] = 1 - answers[1]
        for _ in range(4):
            result = workers.step(answers)
        assert [episode["success"] for episode in result.episodes] == [1.0, 0.0]
        assert all(episode["team_success"] == 0 and episode["team_reward"] == 1 for episode in result.episodes)


def test_joint_actions_replay_with_any_number_of_processes() -> None:
    generator = np.random.default_rng(0)
    with Workers(RECALL, 6, 3, seed=1) as workers:
        workers.reset()
        for _ in range(9):
            result = workers.step(generator.integers(0, 2, size=(6, 1)))
        state = workers.state()
        assert len(state) == 3, "one entry per environment, not per lane"
        assert all(len(action) == 2 for entry in state for action in entry["actions"]), "joint actions of 2 agents"
        with Workers(RECALL, 6, 0, seed=1) as copy:
            assert np.array_equal(copy.restore(state), result.obs)
            actions = generator.integers(0, 2, size=(6, 1))
            assert np.array_equal(copy.step(actions).rewards, workers.step(actions).rewards)
        with Workers(RECALL, 6, 0, seed=1) as copy, pytest.raises(ValueError, match=r"states\[0\]\['actions'\]\[0\]"):
            copy.restore([{"episode": entry["episode"], "actions": [[0]] * 2} for entry in state])


@pytest.mark.slow
def test_resumed_multi_agent_run_equals_uninterrupted_run(tmp_path: str) -> None:
    overrides = {"environment": {**RECALL, "kwargs": {"agents": 2, "delay": 4}}, "worker_steps": 12}
    checkpoint = resume_matches_uninterrupted(tmp_path, **overrides)
    assert len(checkpoint["workers"]) == 2, "4 workers are 2 environments of 2 agents"


def test_worker_counts_must_fit_the_agents() -> None:
    with pytest.raises(ConfigError, match=r"'n_workers' \(5\) must be a multiple of the 2 agents.*n_workers = 6"):
        small_config(environment=RECALL, n_workers=5, worker_steps=16, n_mini_batch=5)
    with pytest.raises(ConfigError, match=r"'n_processes' \(3\) exceeds the 2 environments"):
        small_config(environment=RECALL, n_processes=3)
    with pytest.raises(ValueError, match="use a multiple of 2"):
        Workers(RECALL, 3, 0, seed=0)


def test_agents_that_terminate_and_truncate_on_the_same_step_keep_their_own_ends() -> None:
    # The truncated agent's lane must be truncated (bootstrapped from its final observation), not terminated.
    with Workers(env_of("SplitEndEnv"), 2, 1, seed=0) as workers:
        workers.reset()
        result = workers.step(np.zeros((2, 1), dtype=np.int64))
        assert not result.terminated.any() and not result.truncated.any()
        result = workers.step(np.zeros((2, 1), dtype=np.int64))
        assert result.terminated.tolist() == [True, False]
        assert result.truncated.tolist() == [False, True]
        assert sorted(result.final_obs) == [0, 1] and np.all(result.final_obs[1] == 0.5)


def test_an_agent_that_ends_before_the_others_stops_training_with_its_name() -> None:
    with Workers(env_of("StaggeredEnv"), 2, 1, seed=0) as workers:
        workers.reset()
        workers.step(np.zeros((2, 1), dtype=np.int64))
        with pytest.raises(WorkerError, match=r"agent\(s\) \['a'\] ended their episode while \['b'\] went on"):
            workers.step(np.zeros((2, 1), dtype=np.int64))


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (env_of("MixedSpacesEnv"), r"agent 'b' has the action space Discrete\(3\), but agent 'a' has Discrete\(2\)"),
        (env_of("LateAgentEnv"), r"reset started the agents \['a'\], not all of possible_agents \['a', 'b'\]"),
        ({"type": "PettingZoo", "entry_point": "environments.recall_env"}, "write it as 'module:function'"),
        ({"type": "PettingZoo", "entry_point": "no_such_module:env"}, "importing the module 'no_such_module' failed"),
        ({"type": "PettingZoo", "entry_point": "environments.recall_env:nothing"}, "has no 'nothing'"),
        ({"type": "PettingZoo", "entry_point": "numpy:zeros", "kwargs": {"shape": 2}}, "lacks .*parallel API"),
        ({**RECALL, "kwargs": {"render_mode": "human"}}, "remove 'render_mode'"),
        ({**RECALL, "max_episode_steps": 0}, "a step count >= 1, or -1"),
    ],
)
def test_environments_the_trainer_cannot_follow_are_refused_before_training(environment: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        small_config(environment=environment)


def test_evaluation_plays_any_agent_count(tmp_path: str) -> None:
    config = small_config(environment=RECALL, transformer={"memory_length": 4})
    model = ActorCriticModel(config, (3,), [2])
    four = config.__class__(**{**config.__dict__, "environment": {**RECALL, "kwargs": {"agents": 4, "delay": 3}}})
    results = evaluate(model, four, torch.device("cpu"), episodes=3)
    assert len(results) == 12, "one result per agent and episode"
    assert all(result["length"] == 4 for result in results)
    assert len({result["team_reward"] for result in results[:4]}) == 1, "the agents of an episode share its team values"


@pytest.mark.slow
def test_enjoy_changes_the_agent_count_and_refuses_other_keys(tmp_path: str, capsys: pytest.CaptureFixture) -> None:
    config = load_config(os.path.join(ROOT, "configs", "recall_multi_agent.yaml"), {"updates": 1, "eval_interval": 0})
    trainer = PPOTrainer(config, "ma", torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    trainer.run()
    model = os.path.join(str(tmp_path), "ma.nn")
    assert enjoy.main(["--model", model, "--no-render", "--episodes", "2", "--set", "environment.kwargs.agents=3"]) == 0
    assert capsys.readouterr().out.count("episode ") == 6, "2 episodes of 3 agents"
    assert enjoy.main(["--model", model, "--no-render", "--set", "gamma=0.5"]) == 2
    assert "changes only keys of the environment section" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("memory", "low", "high"), [("trxl", 0.9, 1.0), ("none", 0.0, 0.75)])
def test_multi_agent_recall_needs_and_learns_memory(tmp_path: str, memory: str, low: float, high: float) -> None:
    """Each agent must answer with its own cue after 6 steps: TrXL reaches success >= 0.9 in 20 updates (it did
    from update 17 when measured), no memory stays near chance (0.5)."""
    config = load_config(os.path.join(ROOT, "configs", "recall_multi_agent.yaml"), {"updates": 20, "memory": memory})
    trainer = PPOTrainer(config, memory, torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    means = trainer.run(log_every=10)
    assert low <= means["success"] <= high, means


def test_random_play_reports_every_agent_of_every_episode() -> None:
    from evaluation import random_play

    results = random_play(RECALL, episodes=3)
    assert len(results) == 3 * RECALL["kwargs"]["agents"] and all("reward" in result for result in results)


def mpe_simple_spread(**overrides: object) -> Config:
    """configs/mpe_simple_spread.yaml with 2 environments of 25 steps and ``overrides``; skips the test where mpe2
    (requirements.txt) is not installed."""
    pytest.importorskip("mpe2", reason="MPE's simple_spread_v3 needs the mpe2 package (pip install -r requirements.txt)")
    path = os.path.join(ROOT, "configs", "mpe_simple_spread.yaml")
    return load_config(path, {"n_workers": 6, "worker_steps": 25, **overrides})


def test_mpe_simple_spread_runs_as_three_lanes_that_end_together_at_max_cycles() -> None:
    config = mpe_simple_spread()
    with Workers(config.environment, 6, 0, seed=0) as workers:
        assert workers.agents == 3 and workers.observation_space.shape == (18,) and workers.action_dims == [5]
        assert workers.reset().shape == (6, 18)
        actions = np.random.default_rng(0).integers(0, 5, size=(25, 6, 1))
        rewards = np.zeros(6)
        for step in range(25):
            result = workers.step(actions[step])
            rewards += result.rewards
            assert result.truncated.any() == (step == 24) and not result.terminated.any(), "max_cycles truncates"
    assert result.truncated.all() and [episode["length"] for episode in result.episodes] == [25] * 6
    assert np.allclose([episode["reward"] for episode in result.episodes], rewards)
    teams = [episode["team_reward"] for episode in result.episodes]
    assert np.allclose(teams, np.repeat(rewards.reshape(2, 3).sum(axis=1), 3)), "the sum over each environment's agents"


@pytest.mark.slow
def test_mpe_simple_spread_trains_one_update(tmp_path: str) -> None:
    config = mpe_simple_spread(updates=1, epochs=1)
    trainer = PPOTrainer(config, "mpe", torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    means = trainer.run()
    assert means["length"] == 25 and means["team_reward"] < 0, means
