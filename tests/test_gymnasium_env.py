"""The "Gymnasium" environment type: any registered id, built and checked without editing the package (tests/toy_env.py)."""

from __future__ import annotations

import os
import re

import gymnasium
import numpy as np
import pytest
import torch
import toy_env
from conftest import small_config

from config import ConfigError
from environments import create_env, episode_limit, gymnasium_env, validate_env_config
from observations import ObservationError

TOY = {"type": "Gymnasium", "id": "toy_env:ToyCue-v0"}
TOY_IMAGE = {"type": "Gymnasium", "id": "toy_env:ToyCueImage-v0"}


def play(env: gymnasium.Env, seed: int, answer: str = "right", max_steps: int = 100) -> tuple[np.ndarray, list[tuple]]:
    """Plays one episode: action 0 until the last step of ToyCue's default length (4), then the right or wrong answer.

    Returns:
        The reset observation and the (obs, reward, terminated, truncated, info) tuple of every step.
    """
    obs, _ = env.reset(seed=seed)
    cue = int(obs[0] > 0)
    steps = []
    for t in range(max_steps):
        action = 0 if t < 3 else (cue if answer == "right" else 1 - cue)
        if isinstance(env.action_space, gymnasium.spaces.MultiDiscrete):
            action = np.array([action, 2])
        steps.append(env.step(action))
        if steps[-1][2] or steps[-1][3]:
            return obs, steps
    raise AssertionError(f"no episode end within {max_steps} steps")


def test_toy_cue_builds_with_its_spaces_and_reports_episodes() -> None:
    env = create_env(TOY)
    assert env.observation_space == gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert env.action_space == gymnasium.spaces.Discrete(2)
    assert env.max_episode_steps == toy_env.SPEC_LIMIT
    for answer, reward in (("right", 1.0), ("wrong", 0.0)):
        obs, steps = play(env, seed=3, answer=answer)
        assert abs(obs[0]) == 1.0 and all(step[0][0] == 0.0 for step in steps), "the cue shows in the first observation only"
        assert [step[2] for step in steps] == [False, False, False, True]
        assert not any(step[3] for step in steps)
        assert all("episode" not in step[4] for step in steps[:-1])
        assert steps[-1][1] == reward
        assert steps[-1][4]["episode"] == {"reward": reward, "length": 4.0, "success": reward}
        for ob in [obs] + [step[0] for step in steps]:
            assert ob.dtype == np.float32 and env.observation_space.contains(ob)
    env.close()


def test_builtin_id_without_module() -> None:
    env = create_env({"type": "Gymnasium", "id": "CartPole-v1"})
    assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float32
    assert env.max_episode_steps == 500
    assert episode_limit(validate_env_config({"type": "Gymnasium", "id": "CartPole-v1"})) == 500


def test_reset_seed_reaches_the_env() -> None:
    env = create_env(TOY)
    cues = [float(env.reset(seed=seed)[0][0]) for seed in range(20)]
    assert cues == [float(env.reset(seed=seed)[0][0]) for seed in range(20)]
    assert set(cues) == {-1.0, 1.0}


def test_episode_info_reports_numeric_keys_present_at_the_end() -> None:
    config = {**TOY, "episode_info": ["success", "progress", "label", "missing"]}
    _, steps = play(create_env(config), seed=0)
    assert steps[-1][4]["episode"] == {"reward": 1.0, "length": 4.0, "success": 1.0, "progress": 1.0}
    _, steps = play(create_env({**TOY, "episode_info": []}), seed=0)
    assert steps[-1][4]["episode"] == {"reward": 1.0, "length": 4.0}


@pytest.mark.parametrize("layout, shape", [("hwc", (3, 6, 5)), ("chw", (3, 6, 5)), ("hw", (1, 6, 5))])
def test_uint8_images_become_channel_first_float32_in_unit_range(layout: str, shape: tuple) -> None:
    env = create_env({**TOY_IMAGE, "kwargs": {"layout": layout}})
    assert env.observation_space == gymnasium.spaces.Box(0.0, 1.0, shape, np.float32)
    obs, _ = env.reset(seed=1)
    cue = env.unwrapped.cue
    observations = [obs] + [env.step(0)[0] for _ in range(3)]
    for t, ob in enumerate(observations):
        raw = toy_env.cue_image(t, cue, layout)
        channel_first = raw.transpose(2, 0, 1) if layout == "hwc" else raw[None] if layout == "hw" else raw
        expected = channel_first.astype(np.float32) / 255.0
        assert ob.shape == shape and ob.dtype == np.float32 and ob.flags.c_contiguous
        assert np.array_equal(ob, expected), f"observation {t}"
        assert env.observation_space.contains(ob)
    assert observations[0].max() == 1.0 and min(ob.min() for ob in observations) >= 0.0  # 255 -> 1.0
    if layout == "hwc":  # pixel (0, 0) of the cue's channel is 255 at the first step only
        assert observations[0][cue, 0, 0] == 1.0 and observations[1][cue, 0, 0] == 0.0


@pytest.mark.parametrize(
    "configured, attribute, end, truncated",
    [
        (0, toy_env.SPEC_LIMIT, toy_env.SPEC_LIMIT, True),  # the spec's limit
        (3, 3, 3, True),  # below the spec's limit
        (8, 8, 8, True),  # above it: the config overrides the spec
        (-1, -1, 10, False),  # no limit: the task's own end at 10 steps
    ],
)
def test_max_episode_steps_from_spec_or_config(configured: int, attribute: int, end: int, truncated: bool) -> None:
    config = {**TOY, "kwargs": {"length": 10}, "max_episode_steps": configured}
    env = create_env(config)
    assert env.max_episode_steps == attribute
    assert episode_limit(validate_env_config(config)) == attribute
    env.reset(seed=0)
    steps = [env.step(0) for _ in range(end)]
    assert not any(step[2] or step[3] for step in steps[:-1])
    assert (steps[-1][2], steps[-1][3]) == (not truncated, truncated)
    episode = steps[-1][4]["episode"]
    assert episode["length"] == end
    assert ("success" in episode) == (not truncated)


def test_terminal_step_at_the_limit_is_terminated_not_truncated() -> None:
    env = create_env({**TOY, "max_episode_steps": 4})  # gymnasium's TimeLimit truncates where the task terminates
    _, steps = play(env, seed=2)
    assert len(steps) == 4
    assert steps[-1][2] and not steps[-1][3]
    inner = env.env  # gymnasium's stack under the wrapper
    inner.reset(seed=2)
    inner_steps = [inner.step(0) for _ in range(4)]
    assert inner_steps[-1][2] and inner_steps[-1][3], "without the wrapper both flags are set"


@pytest.mark.parametrize("multi", [False, True])
def test_action_space_start_is_shifted_to_zero(multi: bool) -> None:
    env = create_env({**TOY, "kwargs": {"action_start": 5, "multi": multi}})
    if multi:
        assert env.action_space == gymnasium.spaces.MultiDiscrete([2, 3])
        assert np.array_equal(env.unwrapped.action_space.start, [5, 5])
    else:
        assert env.action_space == gymnasium.spaces.Discrete(2)
        assert env.unwrapped.action_space.start == 5
    _, steps = play(env, seed=4)  # the inner env raises for actions outside its space
    assert steps[-1][4]["episode"]["success"] == 1.0


def test_render_modes_follow_the_env_metadata() -> None:
    env = create_env(TOY, render_mode="rgb_array")
    env.reset(seed=0)
    assert env.render().shape == (8, 8, 3)
    with pytest.raises(ValueError, match="render_mode = 'human' is not supported by Gymnasium"):
        create_env(TOY, render_mode="human")  # ToyCue lists only rgb_array


@pytest.mark.parametrize(
    "config, patterns",
    [
        ({"type": "Gymnasium"}, ["environment.id is required"]),
        ({**TOY, "id": 3}, ["environment.id = 3"]),
        ({**TOY, "id": "toy_env:ToyCeu-v0"}, ["environment.id", "ToyCeu-v0", "not a registered", "did you mean 'ToyCue-v0'"]),
        ({**TOY, "id": "CartPol-v1"}, ["environment.id", "did you mean 'CartPole-v1'", "module:Name-v0"]),
        # An ALE id without its module (unregistered whether or not an earlier test imported ale_py).
        ({**TOY, "id": "ALE/NoSuchGame-v5"}, ["'ale_py:ALE/NoSuchGame-v5'", "type: Atari, game: NoSuchGame"]),
        ({**TOY, "id": "no_such_module_xyz:Foo-v0"}, ["environment.id", "no_such_module_xyz", "ModuleNotFoundError"]),
        (
            {**TOY, "id": "toy_env:ToyBoxAction-v0"},
            ["environment.id", r"action space Box\(-inf, inf, \(1,\), float32\)", "infinite bounds", "finite low and high"],
        ),
        (
            {**TOY, "id": "toy_env:ToyNestedObs-v0"},
            ["environment.id", r"observation space Tuple\(Discrete\(3\), Tuple\(Discrete\(5\)", r"\(H, W, C\)", "Tuple"],
        ),
        ({**TOY, "kwargs": {"size": 3}}, ["environment.kwargs", "could not be built", "size"]),
        ({**TOY, "kwargs": {"render_mode": "human"}}, ["environment.kwargs", "render_mode"]),
        ({**TOY, "kwargs": {"max_episode_steps": 3}}, ["environment.kwargs", "use environment.max_episode_steps"]),
        ({**TOY, "kwargs": [1]}, ["environment.kwargs", "must be of type dict"]),
        ({**TOY, "max_episode_steps": -2}, ["environment.max_episode_steps = -2"]),
        ({**TOY, "max_episode_steps": 1.5}, ["environment.max_episode_steps = 1.5"]),
        ({**TOY, "episode_info": ["reward"]}, ["environment.episode_info", "always reported"]),
        ({**TOY, "episode_info": [1]}, ["environment.episode_info"]),
        ({**TOY, "seed": 1}, ["environment.seed is not a key of a Gymnasium environment"]),
    ],
)
def test_bad_configs_are_value_errors_naming_the_key(config: dict, patterns: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        validate_env_config(config)
    message = str(error.value)
    assert message.startswith("environment.")
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)


def test_a_module_failing_to_import_is_reported_with_its_error(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_toy_tasks.py").write_text('raise RuntimeError("the task needs a licence file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="importing the module 'broken_toy_tasks' failed with RuntimeError: the task needs"):
        validate_env_config({"type": "Gymnasium", "id": "broken_toy_tasks:Broken-v0"})


def test_a_module_not_found_suggests_pythonpath_and_a_missing_package_inside_it_does_not(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's own task file, resumed from another folder: the module itself is not found.
    with pytest.raises(ValueError, match="add that folder to PYTHONPATH, as for the run that trained with it"):
        validate_env_config({"type": "Gymnasium", "id": "my_missing_tasks:Task-v0"})
    # The module is found but needs a package that is not installed: the hint would mislead.
    (tmp_path / "needs_a_package.py").write_text("import no_such_package_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as error:
        validate_env_config({"type": "Gymnasium", "id": "needs_a_package:Task-v0"})
    assert "No module named 'no_such_package_here'" in str(error.value) and "PYTHONPATH" not in str(error.value)


def test_checking_builds_the_env_once_per_id_and_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    make = gymnasium.make

    def counting_make(*args: object, **kwargs: object) -> gymnasium.Env:
        env = make(*args, **kwargs)
        built.append(env)
        return env

    monkeypatch.setattr(gymnasium, "make", counting_make)
    config = {**TOY, "kwargs": {"length": 7, "action_start": 1}}  # no other test uses these kwargs
    for _ in range(3):
        validate_env_config(config)
    validate_env_config({**config, "kwargs": {"action_start": 1, "length": 7}, "max_episode_steps": 2})
    assert len(built) == 1
    assert built[0].unwrapped.length == 7
    validate_env_config({**TOY, "kwargs": {"length": 7, "action_start": 2}})
    assert len(built) == 2


def test_episode_limit_bounds_memory_length_in_the_training_config() -> None:
    transformer = {"num_blocks": 1, "embed_dim": 16, "num_heads": 2, "memory_length": toy_env.SPEC_LIMIT + 1}
    with pytest.raises(ConfigError, match="memory_length"):
        small_config(environment=TOY, transformer=transformer)
    config = small_config(environment={**TOY, "max_episode_steps": -1}, transformer=transformer)
    assert config.environment["max_episode_steps"] == -1


@pytest.mark.slow
@pytest.mark.parametrize("n_processes", [0, 2])
def test_training_on_a_gymnasium_id_without_editing_the_package(tmp_path: str, n_processes: int) -> None:
    from trainer import PPOTrainer

    config = small_config(
        environment=dict(TOY),
        n_workers=2,
        worker_steps=16,
        n_mini_batch=2,
        updates=2,
        n_processes=n_processes,
        transformer={"num_blocks": 1, "embed_dim": 16, "num_heads": 2, "memory_length": 4},
    )
    trainer = PPOTrainer(config, "toy", torch.device("cpu"), seed=0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    means = trainer.run()
    assert trainer.update == 2
    assert os.path.isfile(trainer.model_path)
    assert set(means) >= {"reward", "length", "success"}  # 32 steps of 4-step episodes end some episodes
    assert means["length"] == 4.0


def test_tuple_observations_become_dicts_of_their_parts() -> None:
    env = create_env({**TOY, "id": "toy_env:ToyTupleObs-v0"})
    length = toy_env.ToyCueEnv().length
    assert {key: space.shape for key, space in env.observation_space.spaces.items()} == {"0": (3,), "1": (length + 1,)}
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs["0"], np.eye(3, dtype=np.float32)[1 + env.unwrapped.cue])
    np.testing.assert_array_equal(obs["1"], np.eye(length + 1, dtype=np.float32)[0])
    obs, *_ = env.step(0)
    np.testing.assert_array_equal(obs["0"], [1, 0, 0])
    np.testing.assert_array_equal(obs["1"], np.eye(length + 1, dtype=np.float32)[1])
    assert env.observation_space.contains(obs)


def test_a_tuple_of_twelve_parts_keeps_its_order_in_sorted_keys() -> None:
    space = gymnasium.spaces.Tuple([gymnasium.spaces.Discrete(n + 2) for n in range(12)])
    parts = gymnasium_env._parts(space)
    assert list(parts) == sorted(parts) and [sub.n for sub in parts.values()] == list(range(2, 14))


def test_dict_observations_become_dicts_of_images_and_one_hot_vectors() -> None:
    env = create_env({**TOY, "id": "toy_env:ToyDictObs-v0"})
    expected = {"cue": (3,), "image": (3, *toy_env.IMAGE_SHAPE[:2]), "step": (toy_env.ToyCueEnv().length + 1 + 2,)}
    assert {key: space.shape for key, space in env.observation_space.spaces.items()} == expected
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == ["cue", "image", "step"]
    cue = env.unwrapped.cue
    np.testing.assert_array_equal(obs["cue"], np.eye(3, dtype=np.float32)[1 + cue])
    np.testing.assert_array_equal(obs["step"], [1, 0, 0, 0, 0, 1, 0])  # step 0 of 0..4, then 0 of 0..1
    assert obs["image"].dtype == np.float32 and obs["image"].max() <= 1.0
    obs, *_ = env.step(0)
    np.testing.assert_array_equal(obs["cue"], [1, 0, 0])  # not shown any more
    np.testing.assert_array_equal(obs["step"], [0, 1, 0, 0, 0, 0, 1])
    assert env.observation_space.contains(obs)


SCRIPTED = {"type": "Gymnasium", "id": "toy_env:ToyScripted-v0"}


def scripted_observations(case: str) -> list:
    """The observations of one episode of ToyScripted-v0's case through the Gymnasium type, the reset's first."""
    env = create_env({**SCRIPTED, "kwargs": {"case": case}})
    obs = [env.reset(seed=0)[0]]
    while len(obs) < len(env.unwrapped.script):
        obs.append(env.step(0)[0])
    env.close()
    return obs


CODES = np.eye(3, dtype=np.float32)  # codes 1, 2, 3 of Discrete(3, start=1)
PAIR_21 = [0, 1, 1, 0, 0]  # [2, 1] of MultiDiscrete([2, 3], start=[1, 1]): the second and the third entry


@pytest.mark.parametrize(
    "case, expected",
    [
        ("codes_from_one", [CODES[0], CODES[2], CODES[1]]),
        ("pairs_from_one", [[1, 0, 1, 0, 0], PAIR_21, [1, 0, 0, 0, 1]]),
        ("dict_from_one", [{"cue": CODES[2], "pair": PAIR_21}] * 2),
        ("tuple_from_one", [{"0": CODES[2], "1": PAIR_21}] * 2),
    ],
)
def test_one_hot_blocks_start_at_the_spaces_start(case: str, expected: list) -> None:
    for obs, want in zip(scripted_observations(case), expected, strict=True):
        if isinstance(want, dict):
            assert sorted(obs) == sorted(want)
            for key in want:
                np.testing.assert_array_equal(obs[key], want[key])
        else:
            np.testing.assert_array_equal(obs, want)


@pytest.mark.parametrize(
    "case, patterns",
    [
        ("short_vector", [r"the observation has shape \(2,\) and dtype float32", r"declares shape \(3,\) and dtype float32"]),
        ("extra_key", [r"the key\(s\) \['b'\] that the space does not declare", r"declared: \['a'\]"]),
        ("pair_out_of_range", [r"values from 1 to 3, outside the bounds of its space MultiDiscrete", r"run from \[1, 1\]"]),
        ("short_tuple", [r"a tuple of 1 parts, but its space Tuple\(Discrete\(3, start=1\), Discrete\(3, start=1\)\)"]),
    ],
)
def test_observations_that_break_their_space_are_refused_before_conversion(case: str, patterns: list[str]) -> None:
    with pytest.raises(ObservationError) as error:
        scripted_observations(case)
    for pattern in patterns + ["make the environment return observations of its declared observation_space"]:
        assert re.search(pattern, str(error.value)), (pattern, str(error.value))
