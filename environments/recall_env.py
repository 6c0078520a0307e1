"""Multi-agent recall: a small memory task on PettingZoo's parallel API, for the "PettingZoo" environment family.

K agents share an environment. At reset each agent is shown its own cue, left or right, drawn independently; then
``delay`` steps pass in which nobody sees any cue; then each agent must answer with the side of its own cue. An agent
earns +1 for the right answer and 0 otherwise; all agents end the episode together after ``delay + 1`` steps. Answers
given before the question are ignored.

An agent's observation is ``[cue, question, time]``: the cue (-1 left, +1 right) in the reset observation only, else
0; 1 in the observation that asks for the answer, else 0; and the fraction of the episode that has passed. Without
memory an agent answers by chance (success 0.5); with it, always right (1.0). The team succeeds when every agent does.

Use it as::

    environment:
      type: PettingZoo
      entry_point: "environments.recall_env:parallel_env"
      kwargs: {agents: 2, delay: 6}
"""

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

_CELL_PX = 16  # side of one cell in rendered frames


class RecallEnv(ParallelEnv):
    """K agents, each of which must recall its own cue after a delay."""

    metadata = {"name": "recall_v0", "render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, agents: int = 2, delay: int = 6, render_mode: str | None = None) -> None:
        """Builds the task.

        Args:
            agents: Number of agents K >= 1.
            delay: Steps between the cue and the question, >= 1.
            render_mode: None or "rgb_array".

        Raises:
            ValueError: For an agent count or delay below 1, or another render mode.
        """
        if not isinstance(agents, int) or agents < 1:
            raise ValueError(f"agents = {agents!r} must be an int >= 1")
        if not isinstance(delay, int) or delay < 1:
            raise ValueError(f"delay = {delay!r} must be an int >= 1, the steps between cue and question")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode = {render_mode!r} is not supported; use None or 'rgb_array'")
        self.possible_agents = [f"agent_{k}" for k in range(agents)]
        self.agents: list[str] = []
        self.delay = delay
        self.render_mode = render_mode
        self._rng = np.random.default_rng()
        self._cues = np.zeros(agents, dtype=np.int64)  # 0 left, 1 right
        self._answers = np.full(agents, -1, dtype=np.int64)
        self._t = 0

    @functools.cache  # noqa: B019 - PettingZoo's documented pattern; the spaces never change
    def observation_space(self, agent: str) -> spaces.Box:
        """[cue, question, time], each in [-1, 1]."""
        return spaces.Box(low=-1.0, high=1.0, shape=(3,), dtype=np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        """0 answers left, 1 answers right."""
        return spaces.Discrete(2)

    def _observe(self) -> dict[str, np.ndarray]:
        """Every agent's observation at the current step."""
        question = float(self._t == self.delay)
        time = self._t / self.delay
        return {
            agent: np.array([(2.0 * self._cues[k] - 1.0) if self._t == 0 else 0.0, question, time], dtype=np.float32)
            for k, agent in enumerate(self.possible_agents)
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Draws every agent's cue (from ``seed`` when given) and shows it."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._cues = self._rng.integers(0, 2, size=len(self.possible_agents))
        self._answers[:] = -1
        self._t = 0
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Takes every agent's action; at the question it is the answer, which ends the episode for all."""
        question = self._t == self.delay
        rewards, infos = {}, {}
        for k, agent in enumerate(self.possible_agents):
            rewards[agent] = 0.0
            infos[agent] = {}
            if question:
                self._answers[k] = int(actions[agent])
                correct = self._answers[k] == self._cues[k]
                rewards[agent] = float(correct)
                infos[agent] = {"success": float(correct)}
        self._t += 1
        obs = self._observe()
        terminations = {agent: question for agent in self.possible_agents}
        truncations = {agent: False for agent in self.possible_agents}
        if question:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def render(self) -> np.ndarray | None:
        """A frame with one row per agent: its cue while shown (blue left, orange right), then its answer (green
        right, red wrong) once given."""
        if self.render_mode != "rgb_array":
            return None
        frame = np.full((len(self.possible_agents) * _CELL_PX, 3 * _CELL_PX, 3), 40, dtype=np.uint8)
        for k in range(len(self.possible_agents)):
            rows = slice(k * _CELL_PX + 2, (k + 1) * _CELL_PX - 2)
            if self._t == 0:
                column = slice(2, _CELL_PX - 2) if self._cues[k] == 0 else slice(2 * _CELL_PX + 2, 3 * _CELL_PX - 2)
                frame[rows, column] = (60, 120, 255) if self._cues[k] == 0 else (255, 150, 40)
            if self._answers[k] >= 0:
                column = slice(_CELL_PX + 2, 2 * _CELL_PX - 2)
                frame[rows, column] = (60, 200, 80) if self._answers[k] == self._cues[k] else (220, 50, 50)
        return frame

    def close(self) -> None:
        """Nothing to release."""


def parallel_env(agents: int = 2, delay: int = 6, render_mode: str | None = None) -> RecallEnv:
    """Builds the task, as PettingZoo's environment modules name their constructor."""
    return RecallEnv(agents=agents, delay=delay, render_mode=render_mode)
