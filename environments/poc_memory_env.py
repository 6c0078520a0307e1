"""Proof-of-memory corridor: a tiny task that only an agent with memory can solve reliably.

The agent stands in a 1-D corridor between two goals at -1 and +1. At reset one goal is chosen as the rewarding one.
The observation ``[left_goal_signal, position, right_goal_signal]`` shows the goals (+1 rewarding, -1 punishing) only in
the first two observations (the reset observation and the one after the first step); afterwards both signals are 0, so
the agent has to remember which side to walk to. With ``freeze`` the agent cannot move while the goals are shown.

Rewards follow the reference PocMemoryEnv: a time penalty of 0.1 per step, and +-(1 + 0.1 * min_steps) on reaching the
rewarding / punishing goal, where min_steps = 1 / step_size + 1 (6 for the default step size 0.2, giving +-1.6).
With the defaults the best return is exactly 1.0: 2 frozen steps and 4 moves at -0.1, then +1.6 at the goal.

With ``continuous`` the action is a number in [-1, 1] (a 1-D Box) that moves the agent by that many steps of
``step_size`` (a continuous-control version with the same memory demand and the same best return).

With ``dict_observation`` the observation is a dict: "image", the corridor as a (1, 1, 2 n + 1) image with the agent's
cell lit (the position, no cue), and "cue", the two goal signals while they are shown and zeros afterwards: the cue is
only in the vector part, and the agent needs both parts and its memory.

Deliberate differences from the reference (MarcoMeter/episodic-transformer-memory-ppo):
- Without ``glob`` the agent starts at 0; the reference drew the start from {-0.4, ..., 0.4} even then.
- The goals are visible in 2 observations, exactly those the agent acts on while frozen; the reference still showed
  them in the observation after the second frozen step, when the agent can already move.
- Frozen steps pay the time penalty too (the reference paid 0 there), so every step costs the same.
- The step limit truncates instead of terminating.
"""

import numpy as np
from gymnasium import Env, spaces

from environments.registry import EnvFamily, Key, invalid

TIME_PENALTY = 0.1
NUM_SHOW_STEPS = 2  # goals are visible in this many observations, counting the reset observation

_CELL_PX = 16  # width of one corridor cell in rendered frames


def step_ticks(step_size: float) -> int | None:
    """Returns how many moves lead from the centre to a goal, or None when step_size does not divide 1 evenly.

    Args:
        step_size: Distance covered by one move.

    Returns:
        1 / step_size as an int, or None if that is not (close to) a whole number >= 1.
    """
    if not 0.0 < step_size <= 1.0:
        return None
    ticks = round(1.0 / step_size)
    return ticks if abs(ticks * step_size - 1.0) < 1e-6 else None


class PocMemoryEnv(Env):
    """Proof-of-memory corridor with two goals whose meaning is only shown at the start.

    Positions are kept as integer ticks in [-n, n] with n = 1 / step_size, so reaching a goal is an exact comparison
    (the reference compared rounded floats); continuous moves make them floats, clamped to the goals.
    """

    metadata = {"render_modes": ["rgb_array", "human"], "render_fps": 4}

    def __init__(
        self,
        step_size: float = 0.2,
        glob: bool = False,
        freeze: bool = True,
        max_episode_steps: int = 32,
        continuous: bool = False,
        dict_observation: bool = False,
        render_mode: str | None = None,
    ) -> None:
        """Builds the corridor.

        Args:
            step_size: Distance covered by one move; 1 / step_size must be a whole number of ticks.
            glob: Whether the start position is drawn uniformly from all cells between the goals instead of being 0.
            freeze: Whether moves are ignored while the goals are shown.
            max_episode_steps: Steps after which the episode is truncated; -1 for no limit.
            continuous: Whether an action is a move in [-1, 1] steps (a Box) instead of 0 (left) or 1 (right).
            dict_observation: Whether observations are {"image": the corridor (1, 1, 2 n + 1), "cue": (2,)}.
            render_mode: None, "rgb_array" or "human".
        """
        ticks = step_ticks(step_size)
        if ticks is None:
            raise ValueError(f"step_size = {step_size!r} must divide 1 into whole steps, e.g. 0.1, 0.2, 0.25 or 0.5")
        self._ticks = ticks
        self._glob = glob
        self._freeze = freeze
        self.max_episode_steps = max_episode_steps
        self.render_mode = render_mode
        self.goal_reward = 1.0 + (ticks + 1) * TIME_PENALTY
        self._dict_observation = dict_observation
        if dict_observation:
            self.observation_space = spaces.Dict(
                {
                    "cue": spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32),
                    "image": spaces.Box(low=0.0, high=1.0, shape=(1, 1, 2 * ticks + 1), dtype=np.float32),
                }
            )
        else:
            self.observation_space = spaces.Box(low=-1.0, high=1.0, shape=(3,), dtype=np.float32)
        self._continuous = continuous
        if continuous:  # a move of a (clipped to [-1, 1]) steps
            self.action_space = spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=np.float32)
        else:
            self.action_space = spaces.Discrete(2)  # 0: left, 1: right
        self._position = 0  # in ticks (a float with continuous actions)
        self._goal_signals = np.zeros(2, dtype=np.float32)  # (left, right), +1 marks the rewarding goal
        self._steps = 0
        self._return = 0.0
        self._window = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a new episode.

        Args:
            seed: Re-seeds the environment's generator when given.
            options: Unused; accepted for the gymnasium API.

        Returns:
            The first observation (3,) and an empty info dict.
        """
        super().reset(seed=seed)
        self._position = int(self.np_random.integers(-(self._ticks - 1), self._ticks)) if self._glob else 0
        rewarding_right = bool(self.np_random.integers(2))
        self._goal_signals = np.array([-1.0, 1.0] if rewarding_right else [1.0, -1.0], dtype=np.float32)
        self._steps = 0
        self._return = 0.0
        if self.render_mode == "human":
            self.render()
        return self._observation(), {}

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Moves the agent one step left (0) or right (1), or by ``action`` steps with continuous actions.

        Args:
            action: 0 or 1; with continuous actions an array (1,) in [-1, 1].

        Returns:
            Observation (3,), reward, terminated, truncated and info (with "episode" at the episode's last step).
        """
        move = self._move(action)
        frozen = self._freeze and self._steps < NUM_SHOW_STEPS
        if not frozen:
            self._position = min(max(self._position + move, -self._ticks), self._ticks)
        self._steps += 1

        terminated = abs(self._position) == self._ticks
        success = terminated and bool(self._goal_signals[int(self._position > 0)] > 0)
        if terminated:
            reward = self.goal_reward if success else -self.goal_reward
        else:
            reward = -TIME_PENALTY
        self._return += reward
        truncated = not terminated and self._steps == self.max_episode_steps

        info = {}
        if terminated or truncated:
            info["episode"] = {"reward": self._return, "length": float(self._steps), "success": float(success)}
        if self.render_mode == "human":
            self.render()
        return self._observation(), reward, terminated, truncated, info

    def _move(self, action: int | np.ndarray) -> int | float:
        """The move of an action, in ticks."""
        if not self._continuous:
            if action not in (0, 1):
                raise ValueError(f"action = {action!r} is invalid for PocMemoryEnv; use 0 (left) or 1 (right)")
            return 1 if action == 1 else -1
        value = np.asarray(action, dtype=np.float64).reshape(-1)
        if value.shape != (1,) or not np.isfinite(value[0]) or abs(value[0]) > 1:
            raise ValueError(f"action = {action!r} is invalid for the continuous PocMemoryEnv; use one number in [-1, 1]")
        return float(value[0])

    def _observation(self) -> np.ndarray | dict:
        """Returns [left_goal_signal, position, right_goal_signal], with the signals zeroed once the goals are hidden
        (or, with ``dict_observation``, the corridor image and the signals)."""
        left, right = self._goal_signals if self._steps < NUM_SHOW_STEPS else (0.0, 0.0)
        if self._dict_observation:
            image = np.zeros((1, 1, 2 * self._ticks + 1), dtype=np.float32)
            image[0, 0, round(self._position + self._ticks)] = 1.0
            return {"cue": np.array([left, right], dtype=np.float32), "image": image}
        return np.array([left, self._position / self._ticks, right], dtype=np.float32)

    def render(self) -> np.ndarray | None:
        """Draws the corridor: goals green (rewarding) / red (punishing) while shown and grey afterwards, agent blue.

        Returns:
            An RGB frame (H, W, 3) uint8 in "rgb_array" mode; None in "human" mode, which shows it in a pygame window.
        """
        cells = 2 * self._ticks + 1
        frame = np.full((3 * _CELL_PX, cells * _CELL_PX, 3), 40, dtype=np.uint8)
        frame[_CELL_PX : 2 * _CELL_PX] = 200  # the corridor floor
        shown = self._steps < NUM_SHOW_STEPS
        for cell, signal in ((0, self._goal_signals[0]), (cells - 1, self._goal_signals[1])):
            colour = ((40, 180, 40) if signal > 0 else (200, 40, 40)) if shown else (120, 120, 120)
            frame[_CELL_PX : 2 * _CELL_PX, cell * _CELL_PX : (cell + 1) * _CELL_PX] = colour
        agent = round(self._position + self._ticks)  # the cell the agent is in (continuous positions rounded)
        pad = _CELL_PX // 4
        frame[_CELL_PX + pad : 2 * _CELL_PX - pad, agent * _CELL_PX + pad : (agent + 1) * _CELL_PX - pad] = (40, 80, 220)
        if self.render_mode != "human":
            return frame
        self._show(frame)
        return None

    def _show(self, frame: np.ndarray) -> None:
        """Shows a frame (H, W, 3) in a pygame window, opened on first use so headless runs never import pygame."""
        import pygame

        scale = 4
        if self._window is None:
            pygame.init()
            self._window = pygame.display.set_mode((frame.shape[1] * scale, frame.shape[0] * scale))
            pygame.display.set_caption("PocMemoryEnv")
            self._clock = pygame.time.Clock()
        pygame.event.pump()  # keeps the window responsive
        big = np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)
        pygame.surfarray.blit_array(self._window, big.transpose(1, 0, 2))  # pygame indexes surfaces as (x, y)
        pygame.display.flip()
        self._clock.tick(self.metadata["render_fps"])

    def close(self) -> None:
        """Closes the pygame window if one was opened."""
        if self._window is not None:
            import pygame

            pygame.display.quit()
            self._window = None


def _check(config: dict) -> None:
    """Checks the values of a validated PocMemoryEnv section."""
    if step_ticks(config["step_size"]) is None:
        raise invalid("step_size", config["step_size"], "use a value in (0, 1] that divides 1 evenly, e.g. 0.1, 0.2 or 0.25")
    if config["max_episode_steps"] < 1 and config["max_episode_steps"] != -1:
        raise invalid("max_episode_steps", config["max_episode_steps"], "use a step count >= 1, or -1 for no limit")


FAMILY = EnvFamily(
    name="PocMemoryEnv",
    schema={
        "step_size": Key(0.2, "distance of one move; 1 / step_size moves lead from the centre to a goal"),
        "glob": Key(False, "start anywhere between the goals instead of at the centre"),
        "freeze": Key(True, "the agent cannot move while the goals are shown"),
        "max_episode_steps": Key(32, "truncation limit, -1 for none"),
        "continuous": Key(False, "an action is a move of [-1, 1] steps (a 1-D Box) instead of left or right"),
        "dict_observation": Key(False, 'observations are {"image": the corridor, "cue": the goal signals}'),
    },
    check=_check,
    render_modes=(None, "rgb_array", "human"),
    make=lambda config, render_mode, evaluation: PocMemoryEnv(**config, render_mode=render_mode),
)
