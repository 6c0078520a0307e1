"""The cue task of the learning-regression matrix (tests/test_learning_matrix.py), one task in every observation and
action kind the README promises; importing this module registers it as "cue_task:Cue-v0".

A cue (0 or 1) is shown in the first observation only; the episode lasts ``length`` steps, and the action of the last
one answers: reward 1 and info["success"] 1.0 when it names the cue, else 0. An agent without memory answers at chance
(0.5). Every observation shows the step (so the agent knows when to answer); where the cue is shown depends on
``observation``:

- "vector": Box (3,) float32 [+1/-1 for cue 1/0 at step 0 else 0, t / length, 1 at the answer step else 0].
- "image": Box (side, side, 3) uint8 (``side`` 8): a pattern that moves with the step, the answer step's image
  brighter, and at step 0 its top row at 255 in channel ``cue``.
- "dict": {"image": the image without the cue pixel, "vector": the vector} (the cue in the vector only), as the
  issue's Dict task: the image shows the step alone.
- "tuple": Tuple(Discrete(3): 0 or 1 + cue at step 0, Discrete(length + 1): t).
- "discrete": Discrete(2 * length + 1, start=1): 1 + code * length + t, code 0 or 1 + cue at step 0 (so cue 1 is
  the largest code, 2 * length + 1).
- "multidiscrete": MultiDiscrete([3, length], start=[1, 1]): [1 + code, 1 + t] (the answer step the largest code).
Both use their space's largest code, so that an encoder that ignores ``start`` fails on it.

``action`` is "discrete" (Discrete(2)), "multidiscrete" (MultiDiscrete([2, 3]); the first branch answers) or
"continuous" (Box(-1, 1, (1,)); the answer is 1 when the action is positive).
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

OBSERVATIONS = ("vector", "image", "dict", "tuple", "discrete", "multidiscrete")
ACTIONS = ("discrete", "multidiscrete", "continuous")


def step_image(t: int, length: int, side: int = 8) -> np.ndarray:
    """The (side, side, 3) uint8 image of step t without the cue: a bright bar in row t, all of it brighter at the
    answer."""
    image = np.full((side, side, 3), 20, dtype=np.uint8)
    image[1 + t % (side - 1), :, 2] = 200
    if t == length - 1:
        image[:, :, 1] = 120
    return image


class CueEnv(gymnasium.Env):
    """See the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        observation: str = "vector",
        action: str = "discrete",
        length: int = 5,
        side: int = 8,
        render_mode: str | None = None,
    ) -> None:
        if observation not in OBSERVATIONS or action not in ACTIONS:
            raise ValueError(f"observation {observation!r} / action {action!r}: use one of {OBSERVATIONS} / {ACTIONS}")
        self.kind, self.action_kind, self.length, self.side = observation, action, length, side
        self.render_mode = render_mode
        vector = spaces.Box(-1.0, 1.0, (3,), np.float32)
        image = spaces.Box(0, 255, (side, side, 3), np.uint8)
        self.observation_space = {
            "vector": vector,
            "image": image,
            "dict": spaces.Dict({"image": image, "vector": vector}),
            "tuple": spaces.Tuple((spaces.Discrete(3), spaces.Discrete(length + 1))),
            "discrete": spaces.Discrete(2 * length + 1, start=1),
            "multidiscrete": spaces.MultiDiscrete([3, length], start=[1, 1]),
        }[observation]
        self.action_space = {
            "discrete": spaces.Discrete(2),
            "multidiscrete": spaces.MultiDiscrete([2, 3]),
            "continuous": spaces.Box(-1.0, 1.0, (1,), np.float32),
        }[action]
        self.cue, self.t = 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[object, dict]:
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return self._observation(), {}

    def step(self, action: object) -> tuple[object, float, bool, bool, dict]:
        self.t += 1
        if self.t < self.length:
            return self._observation(), 0.0, False, False, {}
        if self.action_kind == "continuous":
            answer = int(float(np.asarray(action).reshape(-1)[0]) > 0)
        else:
            answer = int(np.asarray(action).reshape(-1)[0])
        success = float(answer == self.cue)
        return self._observation(), success, True, False, {"success": success}

    def _observation(self) -> object:
        t, length = min(self.t, self.length - 1), self.length
        code = 1 + self.cue if self.t == 0 else 0
        signal = (1.0 if self.cue else -1.0) if self.t == 0 else 0.0
        vector = np.array([signal, t / length, float(t == length - 1)], np.float32)
        if self.kind == "vector":
            return vector
        if self.kind == "image":
            image = step_image(t, length, self.side)
            if self.t == 0:
                image[0, :, self.cue] = 255
            return image
        if self.kind == "dict":
            return {"image": step_image(t, length, self.side), "vector": vector}
        if self.kind == "tuple":
            return (code, t)
        if self.kind == "discrete":
            return 1 + code * length + t
        return np.array([1 + code, 1 + t], dtype=np.int64)

    def render(self) -> np.ndarray:
        """The step's image, the cue pixel included."""
        image = step_image(min(self.t, self.length - 1), self.length, self.side)
        if self.t == 0:
            image[0, :, self.cue] = 255
        return image


if "Cue-v0" not in gymnasium.registry:
    gymnasium.register(id="Cue-v0", entry_point=CueEnv, max_episode_steps=16)
