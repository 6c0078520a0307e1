"""GAE against hand-computed values, with terminations and truncations."""

from __future__ import annotations

import pytest
import torch

from buffer import Buffer

GAMMA, LAMDA = 0.9, 0.5


def run_gae(rewards, values, terminated, truncated, final_values, last_value):
    buffer = Buffer(1, len(rewards), (1,), torch.float32, 1, None, torch.device("cpu"))  # GAE needs no memory trace
    buffer.rewards[0] = torch.tensor(rewards)
    buffer.values[0] = torch.tensor(values)
    buffer.terminated[0] = torch.tensor(terminated)
    buffer.truncated[0] = torch.tensor(truncated)
    buffer.final_values[0] = torch.tensor(final_values)
    buffer.compute_advantages(torch.tensor([last_value]), GAMMA, LAMDA)
    return buffer.advantages[0].tolist(), buffer.returns[0].tolist()


# Each case: inputs, then the advantages worked out by hand (d = delta, A_t = d_t + 0.45 * A_{t+1} unless the episode ends).
CASES = {
    "no episode end": (
        dict(
            rewards=[1.0, 0.0, 2.0],
            values=[0.5, 1.0, 0.0],
            terminated=[False] * 3,
            truncated=[False] * 3,
            final_values=[0.0] * 3,
            last_value=4.0,
        ),
        # d2 = 2 + .9*4 - 0 = 5.6; d1 = 0 + .9*0 - 1 = -1; d0 = 1 + .9*1 - .5 = 1.4
        # A2 = 5.6; A1 = -1 + .45*5.6 = 1.52; A0 = 1.4 + .45*1.52 = 2.084
        [2.084, 1.52, 5.6],
    ),
    "termination cuts the future": (
        dict(
            rewards=[1.0, 1.0, 1.0],
            values=[0.0, 2.0, 3.0],
            terminated=[False, True, False],
            truncated=[False] * 3,
            final_values=[0.0] * 3,
            last_value=10.0,
        ),
        # d2 = 1 + 9 - 3 = 7; d1 = 1 + 0 - 2 = -1 (terminal); d0 = 1 + .9*2 - 0 = 2.8
        # A2 = 7; A1 = -1; A0 = 2.8 + .45*(-1) = 2.35
        [2.35, -1.0, 7.0],
    ),
    "truncation bootstraps from the final observation": (
        dict(
            rewards=[1.0, 1.0, 1.0],
            values=[0.0, 2.0, 3.0],
            terminated=[False] * 3,
            truncated=[False, True, False],
            final_values=[0.0, 5.0, 0.0],
            last_value=10.0,
        ),
        # d2 = 7; d1 = 1 + .9*5 - 2 = 3.5 (not terminal, but the recursion stops); d0 = 2.8
        # A2 = 7; A1 = 3.5; A0 = 2.8 + .45*3.5 = 4.375
        [4.375, 3.5, 7.0],
    ),
    "episode end at the last step": (
        dict(
            rewards=[0.0, 1.0],
            values=[1.0, 1.0],
            terminated=[False, True],
            truncated=[False, False],
            final_values=[0.0, 0.0],
            last_value=100.0,
        ),
        # d1 = 1 - 1 = 0; d0 = 0 + .9*1 - 1 = -.1; A0 = -.1 + .45*0
        [-0.1, 0.0],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gae_hand_computed(name: str) -> None:
    inputs, expected = CASES[name]
    advantages, returns = run_gae(**inputs)
    assert advantages == pytest.approx(expected, abs=1e-5)
    assert returns == pytest.approx([a + v for a, v in zip(expected, inputs["values"], strict=True)], abs=1e-5)
