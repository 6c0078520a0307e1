"""Atari through ale-py: preprocessing, clipped rewards with raw scores, truncation, frame stacks, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest

from environments import create_env, validate_env_config


def make(**keys: object) -> object:
    return create_env(validate_env_config({"type": "Atari", "game": "Frostbite", **keys}))


def test_learning_rewards_are_signs_while_the_episode_reports_the_raw_score() -> None:
    env = make(max_episode_frames=4000)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    clipped, done, info = [], False, {}
    while not done:
        _, reward, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
        clipped.append(reward)
        done = terminated or truncated
    assert set(clipped) <= {-1.0, 0.0, 1.0} and sum(clipped) > 0, "Frostbite pays points early, even at random"
    assert info["episode"]["reward"] >= 10 * sum(clipped), "the raw score (10 points a jump) is what is reported"
    assert info["episode"]["length"] == len(clipped)
    env.close()


def test_observations_frame_stack_and_truncation() -> None:
    env = make(frame_stack=4, max_episode_frames=40)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.float32 and 0 <= obs.min() and obs.max() <= 1
    assert all(np.array_equal(obs[0], obs[k]) for k in range(4)), "the stack starts filled with the first frame"
    assert env.max_episode_steps == 10
    steps, truncated = 0, False
    while not truncated:
        obs, _, terminated, truncated, info = env.step(0)
        steps += 1
        assert not terminated
    # the frame limit counts the reset's random no-op frames too (up to 30): between 3 and 10 agent steps of 4 frames
    assert 3 <= steps <= 10 and info["episode"]["length"] == steps
    env.close()


def test_same_seed_and_actions_give_the_same_game() -> None:
    """Sticky actions and no-ops draw from generators seeded at reset: what an exact resume's replay relies on."""
    runs = []
    for _ in range(2):
        env = make()
        frames = [env.reset(seed=7)[0]]
        frames += [env.step(action % env.action_space.n)[0] for action in range(60)]
        runs.append(np.stack(frames))
        env.close()
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize(
    "keys, words",
    [
        ({"game": "Frostbit"}, ["environment.game", "did you mean 'Frostbite'"]),
        ({"sticky_actions": 1.0}, ["environment.sticky_actions", "[0, 1)"]),
        ({"frame_stack": 0}, ["environment.frame_stack", ">= 1"]),
        ({"game": None}, ["environment.game"]),
    ],
)
def test_bad_atari_configs_are_named_before_any_game_starts(keys: dict, words: list) -> None:
    with pytest.raises(ValueError) as error:
        validate_env_config({"type": "Atari", "game": "Frostbite", **keys})
    for word in words:
        assert word in str(error.value)
