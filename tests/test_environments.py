"""Tests of the environments package: spaces, episode info, time limits, PoC dynamics, config checks, Memory Gym seeds."""

import os
import subprocess
import sys

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

from config import ConfigError, load_config, parse_overrides  # noqa: E402
from environments import ENV_TYPES, FAMILIES, REQUIRED, EnvFamily, Key, create_env, episode_limit, validate_env_config  # noqa: E402
from observations import ObservationError  # noqa: E402

MEMORY_GYM_COMMANDS_2 = {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": [2]}}

# (config, observation shape, action space type, max_episode_steps)
SPACE_CASES = [
    ({"type": "PocMemoryEnv"}, (3,), gymnasium.spaces.Discrete, 32),
    ({"type": "CartPole"}, (4,), gymnasium.spaces.Discrete, 200),
    ({"type": "MiniGrid"}, (3, 84, 84), gymnasium.spaces.Discrete, 96),
    ({"type": "MiniGrid", "name": "MiniGrid-MemoryS7-v0", "observation": "symbolic"}, (180,), gymnasium.spaces.Discrete, 96),
    ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0"}, (3, 84, 84), gymnasium.spaces.Discrete, 119),
    ({"type": "MemoryGym", "name": "MysteryPath-Grid-v0"}, (3, 84, 84), gymnasium.spaces.Discrete, 128),
    ({"type": "MemoryGym", "name": "SearingSpotlights-v0"}, (3, 84, 84), gymnasium.spaces.MultiDiscrete, 256),
    ({"type": "MemoryGym", "name": "Endless-MortarMayhem-v0"}, (3, 84, 84), gymnasium.spaces.MultiDiscrete, -1),
    ({"type": "Failing", "fail_at_step": 10_000}, (4,), gymnasium.spaces.Discrete, 8),
]


def run_episode(env: gymnasium.Env, actions: list[int] | None = None, max_steps: int = 2000) -> list[tuple]:
    """Steps env until the episode ends, with the given actions or random ones (seeded through the action space).

    Returns:
        The (obs, reward, terminated, truncated, info) tuple of every step.
    """
    steps = []
    for t in range(max_steps):
        action = actions[t] if actions is not None else env.action_space.sample()
        steps.append(env.step(action))
        if steps[-1][2] or steps[-1][3]:
            return steps
    raise AssertionError(f"no episode end within {max_steps} steps")


@pytest.mark.parametrize("config, obs_shape, action_type, max_steps", SPACE_CASES, ids=lambda c: str(c))
def test_spaces_observations_and_episode_info(config: dict, obs_shape: tuple, action_type: type, max_steps: int) -> None:
    env = create_env(config)
    env.action_space.seed(0)
    assert env.observation_space.shape == obs_shape
    assert env.observation_space.dtype == np.float32
    assert isinstance(env.action_space, action_type)
    assert env.max_episode_steps == max_steps

    obs, _ = env.reset(seed=3)
    steps = run_episode(env)
    for ob in [obs] + [step[0] for step in steps]:
        assert ob.shape == obs_shape and ob.dtype == np.float32
        assert env.observation_space.contains(ob)
    if len(obs_shape) == 3:
        assert 0.0 <= obs.min() and obs.max() <= 1.0 and obs.max() > 0.0

    assert all("episode" not in step[4] for step in steps[:-1])
    assert not (steps[-1][2] and steps[-1][3])
    episode = steps[-1][4]["episode"]
    assert episode["length"] == len(steps)
    if config["type"] != "CartPole":  # CartPole reports the unscaled return, tested separately
        assert episode["reward"] == pytest.approx(sum(step[1] for step in steps))
    assert all(isinstance(value, float) for value in episode.values())
    env.close()


@pytest.mark.parametrize(
    "config, metrics",
    [
        ({"type": "PocMemoryEnv"}, {"success"}),
        ({"type": "MiniGrid"}, {"success"}),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0"}, {"success", "commands_completed"}),
        ({"type": "MemoryGym", "name": "MysteryPath-Grid-v0"}, {"success", "num_fails"}),
    ],
)
def test_episode_info_has_task_metrics(config: dict, metrics: set[str]) -> None:
    env = create_env(config)
    env.action_space.seed(1)
    env.reset(seed=1)
    episode = run_episode(env)[-1][4]["episode"]
    assert metrics | {"reward", "length"} <= set(episode)
    assert episode["success"] in (0.0, 1.0)


@pytest.mark.parametrize(
    "config, action",
    [
        ({"type": "MiniGrid"}, 0),  # turning left forever never touches an object
        ({"type": "MemoryGym", "name": "MysteryPath-Grid-v0"}, 0),  # action 0 is a no-op in Mystery Path Grid
    ],
)
def test_step_limit_is_truncation(config: dict, action: int) -> None:
    env = create_env(config)
    env.reset(seed=0)
    steps = run_episode(env, [action] * 1000)
    assert len(steps) == env.max_episode_steps
    _, _, terminated, truncated, info = steps[-1]
    assert truncated and not terminated
    assert info["episode"]["success"] == 0.0


@pytest.mark.parametrize("health, success, truncated", [(0.0, 0, False), (0.5, 0, True), (0.5, 1, False)])
def test_searing_spotlights_end_at_the_limit_is_truncation_only_if_nothing_else_ended_it(
    monkeypatch: pytest.MonkeyPatch, health: float, success: int, truncated: bool
) -> None:
    # memory-gym sets done at its step limit whatever else happened: a death on the last allowed step is terminal.
    env = create_env({"type": "MemoryGym", "name": "SearingSpotlights-v0"})
    env.reset(seed=0)
    inner_step = env.env.step
    env._length = env.max_episode_steps - 1  # as if the episode had run until one step before its limit
    info = {"reward": 0.0, "length": 256, "agent_health": health, "coins_collected": 0.0, "success": success}
    monkeypatch.setattr(env.env, "step", lambda action: (*inner_step(action)[:2], True, False, dict(info)))
    _, _, terminated, was_truncated, step_info = env.step(np.zeros(2, dtype=np.int64))
    assert (terminated, was_truncated) == (not truncated, truncated)
    assert step_info["episode"]["agent_health"] == health
    env.close()


def test_minigrid_reward_uses_minigrids_own_step_limit() -> None:
    # The reference cut episodes at 96 steps but kept MiniGrid's reward, whose step penalty is scaled by MiniGrid's own
    # max_steps (5 * 9^2 for S9): a success after n steps pays 1 - 0.9 * n / 405, not 1 - 0.9 * n / 96.
    env = create_env({"type": "MiniGrid"})
    limit = env.unwrapped.max_steps
    assert limit == 5 * env.unwrapped.width**2 > env.max_episode_steps
    # Walk to the end of the hallway, then into each arm: one of the two turns finds the matching object.
    for turn in (0, 1):
        env.reset(seed=3)
        steps = run_episode(env, [2] * 10 + [turn] + [2] * 5)
        reward, terminated, info = steps[-1][1], steps[-1][2], steps[-1][4]
        if info.get("episode", {}).get("success") == 1.0:
            break
    assert terminated and info["episode"]["success"] == 1.0
    assert reward == pytest.approx(1 - 0.9 * len(steps) / limit)
    env.close()


def poc_env(**overrides: object) -> gymnasium.Env:
    """Builds a PocMemoryEnv from the default config with overrides."""
    return create_env({"type": "PocMemoryEnv", **overrides})


def test_minigrid_symbolic_observation_is_minigrids_own_encoding_one_hot() -> None:
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

    sizes = (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX))
    env = create_env({"type": "MiniGrid", "name": "MiniGrid-MemoryS7-v0", "observation": "symbolic"})
    plain = gymnasium.make("MiniGrid-MemoryS7-v0", agent_view_size=3)
    obs, _ = env.reset(seed=4)
    image = plain.reset(seed=4)[0]["image"]  # (3, 3, 3): object type, colour, state per cell
    kinds = set()
    for action in [2, 2, 1, 2, 0, 2, None]:  # walk a little, comparing every view on the way
        assert obs.shape == (3 * 3 * sum(sizes),) and obs.dtype == np.float32
        cells = obs.reshape(9, sum(sizes))
        blocks = np.split(cells, np.cumsum(sizes)[:-1], axis=1)  # object, colour and state blocks, each (9, n)
        assert all(np.array_equal(block.sum(axis=1), np.ones(9)) for block in blocks)  # one-hot: one 1 per block
        assert set(np.unique(cells)) == {0.0, 1.0}
        decoded = np.stack([block.argmax(axis=1) for block in blocks], axis=1)  # (9, 3)
        assert np.array_equal(decoded, image.reshape(9, 3))
        kinds |= set(image[..., 0].ravel().tolist())
        if action is not None:
            obs = env.step(action)[0]
            image = plain.step(action)[0]["image"]
    assert len(kinds) > 2  # the views saw more than walls and floor
    env.close()
    plain.close()


def test_minigrid_doorkey_with_all_actions_picks_up_the_key_and_opens_the_door() -> None:
    config = {"type": "MiniGrid", "name": "MiniGrid-DoorKey-5x5-v0", "observation": "symbolic", "view_size": 7}
    env = create_env({**config, "actions": "all", "max_episode_steps": 250})
    assert env.action_space.n == 7 and env.observation_space.shape == (7 * 7 * 20,)
    env.reset(seed=0)  # the agent at (1, 3) facing left, the key above it, the door at (2, 1), the goal at (3, 3)
    steps = run_episode(env, [1, 3, 2, 2, 1, 5, 2, 2, 1, 2, 2])  # turn, pickup, up, up, turn, toggle, through, down
    assert env.unwrapped.carrying is not None and env.unwrapped.carrying.type == "key"
    assert steps[-1][2] and steps[-1][4]["episode"]["success"] == 1.0 and steps[-1][1] > 0

    navigation = create_env(config)
    assert navigation.action_space.n == 3
    navigation.reset(seed=0)
    with pytest.raises(ValueError, match=r"action = 3 is invalid .*navigation.*environment\.actions: all"):
        navigation.step(3)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "MiniGrid-DoorKey-5x5"}, r"'MiniGrid-DoorKey-5x5' is invalid; did you mean 'MiniGrid-DoorKey-5x5-v0'"),
        ({"name": "MiniGrid-Nope-v0"}, r"'MiniGrid-Nope-v0' is invalid.*MiniGrid-MemoryS9-v0.*or any MiniGrid-\* id"),
        ({"observation": "pixels"}, r"environment\.observation = 'pixels' is invalid; use rgb .* or symbolic"),
        ({"actions": "seven"}, r"environment\.actions = 'seven' is invalid; use navigation .* or all"),
        ({"name": "MiniGrid-DoorKey-5x5-v0", "max_episode_steps": 251}, r"= 251 is invalid; .* allows at most 250"),
    ],
)
def test_minigrid_errors_name_the_bad_value_and_the_fix(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_env_config({"type": "MiniGrid", **config})


def test_minigrid_defaults_are_the_references_rgb_view_and_three_actions() -> None:
    config = validate_env_config({"type": "MiniGrid"})
    assert (config["observation"], config["actions"], config["view_size"], config["tile_size"]) == ("rgb", "navigation", 3, 28)


def test_poc_truncates_after_32_steps() -> None:
    env = poc_env()
    env.reset(seed=0)
    steps = run_episode(env, [0, 1] * 100)  # oscillating around the start never reaches a goal
    assert len(steps) == 32
    _, _, terminated, truncated, info = steps[-1]
    assert truncated and not terminated
    assert info["episode"] == {"reward": pytest.approx(-3.2), "length": 32.0, "success": 0.0}


def test_poc_goals_are_shown_only_in_the_first_two_observations() -> None:
    env = poc_env()
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        observations = [obs] + [step[0] for step in run_episode(env, [0, 1] * 100)]
        for t, ob in enumerate(observations):
            signals = ob[[0, 2]]
            if t < 2:
                assert sorted(signals) == [-1.0, 1.0], f"goals must be visible in observation {t}"
            else:
                assert list(signals) == [0.0, 0.0], f"goals must be hidden in observation {t}"


def test_poc_freeze_holds_the_agent_while_goals_are_shown() -> None:
    env = poc_env()
    obs, _ = env.reset(seed=0)
    positions = [obs[1]] + [env.step(1)[0][1] for _ in range(3)]
    assert positions == pytest.approx([0.0, 0.0, 0.0, 0.2])
    env = poc_env(freeze=False)
    obs, _ = env.reset(seed=0)
    assert env.step(1)[0][1] == pytest.approx(0.2)


@pytest.mark.parametrize("correct", [True, False])
def test_poc_goal_rewards(correct: bool) -> None:
    env = poc_env()
    obs, _ = env.reset(seed=4)
    right_is_rewarding = obs[2] > 0
    direction = int(right_is_rewarding == correct)  # 1 walks right
    steps = run_episode(env, [direction] * 7)  # 2 frozen steps, then 5 moves of 0.2 reach the goal
    assert len(steps) == 7
    _, reward, terminated, truncated, info = steps[-1]
    assert terminated and not truncated
    assert reward == pytest.approx(1.6 if correct else -1.6)
    assert [step[1] for step in steps[:-1]] == pytest.approx([-0.1] * 6)
    assert info["episode"] == {
        "reward": pytest.approx(1.0 if correct else -2.2),
        "length": 7.0,
        "success": float(correct),
    }


def test_poc_glob_spreads_start_positions() -> None:
    env = poc_env(glob=True)
    starts = {round(float(env.reset(seed=seed)[0][1]), 2) for seed in range(200)}
    assert starts == {-0.8, -0.6, -0.4, -0.2, 0.0, 0.2, 0.4, 0.6, 0.8}
    assert {float(poc_env().reset(seed=seed)[0][1]) for seed in range(20)} == {0.0}


@pytest.mark.parametrize("config", [{"type": "PocMemoryEnv"}, {"type": "Failing", "fail_at_step": 10_000}])
def test_plain_envs_pass_gymnasium_checker(config: dict) -> None:
    check_env(create_env(config), skip_render_check=True)


def test_masked_cartpole() -> None:
    env = create_env({"type": "CartPole"})
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    steps = run_episode(env)
    observations = np.stack([obs] + [step[0] for step in steps])
    assert np.all(observations[:, [1, 3]] == 0.0)
    assert np.all(np.abs(observations[:, [0, 2]]).sum(axis=0) > 0.0)
    assert [step[1] for step in steps] == pytest.approx([0.01] * len(steps))
    assert steps[-1][4]["episode"]["reward"] == float(len(steps))  # unscaled return

    unmasked = create_env({"type": "CartPole", "mask_velocity": False, "reward_scale": 1.0})
    unmasked.reset(seed=0)
    assert np.all(unmasked.step(0)[0][[1, 3]] != 0.0)


@pytest.mark.parametrize(
    "config",
    [
        {"type": "PocMemoryEnv"},
        {"type": "CartPole"},
        {"type": "MiniGrid"},
        {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0"},
    ],
)
def test_render_rgb_array(config: dict) -> None:
    env = create_env(config, render_mode="rgb_array")
    env.reset(seed=0)
    env.step(env.action_space.sample())
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert frame.max() > frame.min()


def test_memory_gym_render_matches_observation() -> None:
    env = create_env({"type": "MemoryGym", "name": "MysteryPath-Grid-v0"}, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert np.array_equal((obs * 255).round().astype(np.uint8).transpose(1, 2, 0), env.render())


@pytest.mark.parametrize(
    "config, key",
    [
        ({}, "environment.type"),
        ({"type": "Procgen"}, "environment.type"),
        ({"type": "PocMemoryEnv", "speed": 1}, "environment.speed"),
        ({"type": "PocMemoryEnv", "step_size": "0.2"}, "environment.step_size"),
        ({"type": "PocMemoryEnv", "step_size": 0.3}, "environment.step_size"),
        ({"type": "PocMemoryEnv", "glob": 1}, "environment.glob"),
        ({"type": "PocMemoryEnv", "max_episode_steps": 0}, "environment.max_episode_steps"),
        ({"type": "CartPole", "name": "CartPole-v2"}, "environment.name"),
        ({"type": "CartPole", "reward_scale": 0}, "environment.reward_scale"),
        ({"type": "MiniGrid", "name": "MiniGrid-Nope-v0"}, "environment.name"),
        ({"type": "MiniGrid", "name": "Empty-5x5-v0"}, "environment.name"),  # registered only with the prefix
        ({"type": "MiniGrid", "observation": "pixels"}, "environment.observation"),
        ({"type": "MiniGrid", "actions": 7}, "environment.actions"),
        ({"type": "MiniGrid", "view_size": 4}, "environment.view_size"),
        ({"type": "MiniGrid", "view_size": 3.0}, "environment.view_size"),
        ({"type": "MiniGrid", "max_episode_steps": 406}, "environment.max_episode_steps"),  # S9's own limit is 405
        ({"type": "MemoryGym"}, "environment.name"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v1"}, "environment.name"),
        ({"type": "MemoryGym", "name": "MortarMayhemB-Grid-v0"}, "environment.name"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": [2]}, "environment.reset_params"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"commands": [2]}}, "reset_params.commands"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": 2}}, "command_count"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"num-seeds": 0}}, "reset_params.num-seeds"),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"arena_size": 9}}, "environment.reset_params"),
        ({"type": "Failing", "mode": "crash"}, "environment.mode"),
    ],
)
def test_validate_env_config_names_the_bad_key(config: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as error:
        validate_env_config(config)
    assert "environment." in str(error.value)


def test_validate_env_config_fills_defaults_without_touching_the_input() -> None:
    given = {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": [2]}}
    config = validate_env_config(given)
    assert given == {"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": {"command_count": [2]}}
    assert config["reset_params"] == {"start-seed": 0, "num-seeds": 100000, "command_count": [2]}
    assert validate_env_config({"type": "PocMemoryEnv"}) == {
        "type": "PocMemoryEnv",
        "step_size": 0.2,
        "glob": False,
        "freeze": True,
        "max_episode_steps": 32,
        "continuous": False,
        "dict_observation": False,
    }
    required = {
        "MemoryGym": {"name": "MortarMayhem-Grid-v0"},
        "Gymnasium": {"id": "CartPole-v1"},
        "Atari": {"game": "Pong"},
        "PettingZoo": {"entry_point": "environments.recall_env:parallel_env"},
    }
    for env_type in ENV_TYPES:
        minimal = {"type": env_type, **required.get(env_type, {})}
        assert validate_env_config(minimal)["type"] == env_type


def test_create_env_rejects_unknown_type_and_render_mode() -> None:
    with pytest.raises(ValueError, match="environment.type"):
        create_env({"type": "Unknown"})
    with pytest.raises(ValueError, match="render_mode"):
        create_env({"type": "PocMemoryEnv"}, render_mode="ascii")


def test_a_misspelt_type_gets_the_close_match_and_the_list_leaves_out_test_types() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"), parse_overrides(["environment.type=Gymnasum"]))
    message = str(error.value)
    assert "environment.type = 'Gymnasum' is not a known environment type; did you mean 'Gymnasium'?" in message
    assert "PettingZoo" in message and "Failing" not in message
    assert validate_env_config({"type": "Failing"})["type"] == "Failing", "test-only types stay registered"


def test_a_parallel_environments_observations_are_checked_per_agent() -> None:
    env = create_env({"type": "PettingZoo", "entry_point": "toy_env:ToyScriptedAgents", "kwargs": {"case": "short_vector"}})
    env.reset(seed=0)
    env.step([0, 0])
    with pytest.raises(ObservationError, match=r"^agent 'second': the observation has shape \(2,\) and dtype float32"):
        env.step([0, 0])
    env.close()


def memory_gym_episodes(env: gymnasium.Env, n_episodes: int, plain_resets: bool) -> list[tuple[int, dict, int]]:
    """Plays n_episodes of Mortar Mayhem with random actions; later episodes start with a bare reset() if plain_resets.

    Returns:
        (episode seed, inner reset parameters, number of commands) per episode.
    """
    env.action_space.seed(0)
    records = []
    env.reset(seed=123)
    for i in range(n_episodes):
        if i > 0 and plain_resets:
            env.reset()
        elif i > 0:
            env.reset(seed=1000 + i)
        inner = env.unwrapped
        records.append((env.episode_seed, dict(inner.reset_params), inner.num_commands))
        run_episode(env)
    return records


@pytest.mark.parametrize("plain_resets", [True, False])
def test_memory_gym_reset_params_persist_and_seeds_stay_in_range(plain_resets: bool) -> None:
    config = {**MEMORY_GYM_COMMANDS_2, "reset_params": {"command_count": [2], "start-seed": 500, "num-seeds": 20}}
    env = create_env(config)
    assert env.max_episode_steps < 119  # derived from 2 commands, not memory-gym's default of 10
    records = memory_gym_episodes(env, 25, plain_resets)
    seeds = [seed for seed, _, _ in records]
    assert all(500 <= seed < 520 for seed in seeds)
    assert len(set(seeds)) > 5
    assert all(params["command_count"] == [2] and commands == 2 for _, params, commands in records)

    evaluation = create_env(config, evaluation=True)
    evaluation_seeds = [seed for seed, _, _ in memory_gym_episodes(evaluation, 10, plain_resets)]
    assert all(seed >= 520 for seed in evaluation_seeds)


def test_memory_gym_seed_reproduces_episodes() -> None:
    first, second = create_env(MEMORY_GYM_COMMANDS_2), create_env(MEMORY_GYM_COMMANDS_2)
    obs_a = [first.reset(seed=7)[0]] + [first.reset()[0] for _ in range(3)]
    obs_b = [second.reset(seed=7)[0]] + [second.reset()[0] for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(obs_a, obs_b, strict=True))
    assert not np.array_equal(obs_a[0], obs_a[1])


@pytest.mark.parametrize("commands", [1, 2])
def test_mortar_mayhem_success_needs_every_command_executed(commands: int) -> None:
    # memory-gym reports success (and all commands completed) once the last command is checked, even when the agent
    # failed it; the wrapper must count only episodes whose every command earned its reward.
    params = {"command_count": [commands], "reward_command_success": 0.1, "reward_command_failure": 0.0}
    env = create_env({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0", "reset_params": params})
    env.reset(seed=0)
    env.action_space.seed(0)
    episodes = []
    for _ in range(60):
        episodes.append(run_episode(env)[-1][4]["episode"])
        env.reset()
    executed = [round(episode["reward"] / 0.1) for episode in episodes]
    assert [episode["success"] for episode in episodes] == [float(n == commands) for n in executed]
    assert [episode["commands_completed"] for episode in episodes] == pytest.approx([n / commands for n in executed])
    assert 0 < sum(n == commands for n in executed) < len(episodes)  # random play both fails and succeeds


def test_memory_gym_close_keeps_other_instances_working() -> None:
    first, second = create_env(MEMORY_GYM_COMMANDS_2), create_env(MEMORY_GYM_COMMANDS_2)
    first.reset(seed=0)
    second.reset(seed=0)
    first.close()
    obs = second.step(0)[0]
    assert obs.shape == (3, 84, 84) and obs.max() > 0.0


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_importing_the_package_imports_no_heavy_environment() -> None:
    code = (
        "import sys, environments\n"
        "environments.validate_env_config({'type': 'PocMemoryEnv'})\n"
        "environments.create_env({'type': 'CartPole'})\n"
        "print(sorted(m for m in ('pygame', 'minigrid', 'memory_gym') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_family_is_declared_once_with_meanings() -> None:
    assert ENV_TYPES == ("PocMemoryEnv", "CartPole", "MiniGrid", "MemoryGym", "Atari", "Failing", "Gymnasium", "PettingZoo")
    for name, family in FAMILIES.items():
        assert family.name == name
        assert family.schema, name
        for key, entry in family.schema.items():
            assert isinstance(entry, Key) and isinstance(entry.meaning, str) and entry.meaning.strip(), f"{name}.{key}"
            assert "\n" not in entry.meaning, f"{name}.{key}: one line"


@pytest.mark.parametrize(
    "config, limit",
    [
        ({"type": "PocMemoryEnv"}, 32),
        ({"type": "PocMemoryEnv", "max_episode_steps": -1}, -1),
        ({"type": "CartPole"}, 200),
        ({"type": "CartPole", "name": "CartPole-v1"}, 500),
        ({"type": "MiniGrid", "max_episode_steps": 50}, 50),
        ({"type": "MemoryGym", "name": "MortarMayhem-Grid-v0"}, -1),  # depends on the reset parameters
        ({"type": "Failing"}, -1),
    ],
)
def test_episode_limit(config: dict, limit: int) -> None:
    assert episode_limit(validate_env_config(config)) == limit


def test_a_family_declaration_validates_its_section() -> None:
    def check(config: dict) -> None:
        if config["size"] < 1:
            raise ValueError(f"environment.size = {config['size']} is invalid")

    family = EnvFamily(
        name="Probe",
        schema={"size": Key(REQUIRED, "a required key"), "scale": Key(1.0, "a float"), "tags": Key(["a"], "a list")},
        make=lambda config, render_mode, evaluation: FAMILIES["Failing"].make({}, render_mode, evaluation),
        check=check,
        render_modes=lambda config: (None, "rgb_array") if config["size"] > 1 else (None,),
    )
    config = family.validate({"type": "Probe", "size": 2, "scale": 3})
    assert config == {"type": "Probe", "size": 2, "scale": 3, "tags": ["a"]}
    config["tags"].append("b")
    assert family.schema["tags"].default == ["a"], "defaults are copied"
    assert family.allowed_render_modes(config) == (None, "rgb_array")
    assert family.episode_limit(config) == -1
    for bad, message in [
        ({"type": "Probe"}, "environment.size is required for Probe"),
        ({"type": "Probe", "size": 0}, "environment.size = 0 is invalid"),
        ({"type": "Probe", "size": 1, "scale": True}, "environment.scale = True must be of type float"),
        ({"type": "Probe", "size": 1, "colour": 1}, "environment.colour is not a key of a Probe environment"),
    ]:
        with pytest.raises(ValueError, match=message):
            family.validate(bad)


def test_continuous_poc_moves_by_the_action_and_keeps_the_best_return() -> None:
    env = create_env({"type": "PocMemoryEnv", "continuous": True}).unwrapped
    assert env.action_space == gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    env.reset(seed=0)
    for _ in range(2):  # frozen while the goals are shown
        obs, *_ = env.step(np.array([1.0], dtype=np.float32))
    assert obs[1] == 0.0
    obs, *_ = env.step(np.array([0.5], dtype=np.float32))
    assert obs[1] == pytest.approx(0.1)  # half a step of 0.2
    with pytest.raises(ValueError, match=r"one number in \[-1, 1\]"):
        env.step(np.array([1.5], dtype=np.float32))
    env.reset(seed=0)
    side = 1.0 if env._goal_signals[1] > 0 else -1.0
    total, done = 0.0, False
    while not done:
        _, reward, done, _, info = env.step(np.array([side], dtype=np.float32))
        total += reward
    assert info["episode"]["success"] == 1.0 and total == pytest.approx(1.0)
