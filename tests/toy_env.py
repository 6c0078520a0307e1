"""Tiny Gymnasium tasks that register themselves on import, for the tests of the "Gymnasium" environment type.

Importing this module (e.g. through the id "toy_env:ToyCue-v0"; tests/ is on sys.path under pytest) registers:

- ToyCue-v0: a memory task. A cue (0 or 1) shows only in the first observation; the action of the episode's last
  step must name it. Observation (2,) float32: [+1 for cue 1 / -1 for cue 0 at step 0 and 0 later, t / length].
  Actions Discrete(2, start=action_start), or with ``multi`` MultiDiscrete([2, 3]) whose first branch answers (same
  start). The episode terminates after ``length`` (4) steps with reward 1 and info["success"] = 1.0 for the right
  answer, else reward 0 and success 0.0. The spec limit is 6 steps.
- ToyCueImage-v0: the same task observed as a uint8 image, (6, 5, 3) for layout "hwc", (3, 6, 5) for "chw" or (6, 5)
  for "hw"; ``cue_image`` computes it.
- ToyBoxAction-v0 and ToyTupleObs-v0: ToyCue with a Box action space of infinite bounds / a Tuple observation space,
  which the models of this repository cannot take.
- ToyScripted-v0 (kwargs ``case``): declares the observation space of one of ``SCRIPTS`` and returns that script's
  observations one per step, some of which break the space (for the observation checks); ``ToyScriptedAgents`` is
  the same for two agents of PettingZoo's parallel API, the second of which gets the script.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

SPEC_LIMIT = 6
IMAGE_SHAPE = (6, 5, 3)  # (H, W, C)


def cue_image(t: int, cue: int, layout: str = "hwc") -> np.ndarray:
    """The image observation of step t: a fixed uint8 pattern shifted with t, with pixel (0, 0) of channel ``cue`` at
    255 in the first observation only.

    Args:
        t: Step of the episode (0 for the reset observation).
        cue: 0 or 1.
        layout: "hwc" (H, W, C), "chw" (C, H, W) or "hw" (H, W), the first channel.

    Returns:
        The image as uint8 in the layout's shape.
    """
    height, width, channels = IMAGE_SHAPE
    image = (np.arange(height * width * channels).reshape(IMAGE_SHAPE) * 7 + 40 * t) % 250
    image[0, 0] = 0
    if t == 0:
        image[0, 0, cue] = 255
    image = image.astype(np.uint8)
    if layout == "chw":
        return image.transpose(2, 0, 1).copy()
    if layout == "hw":
        return image[:, :, cue if t == 0 else 0].copy()
    return image


class ToyCueEnv(gymnasium.Env):
    """See the module docstring (ToyCue-v0)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, length: int = 4, action_start: int = 0, multi: bool = False, render_mode: str | None = None) -> None:
        self.length = length
        self.action_start = action_start
        self.multi = multi
        self.render_mode = render_mode
        self.observation_space = spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32)
        if multi:  # the answer is the first branch; the second one is ignored
            self.action_space = spaces.MultiDiscrete([2, 3], start=[action_start, action_start])
        else:
            self.action_space = spaces.Discrete(2, start=action_start)
        self.cue = 0
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(2))
        self.t = 0
        return self._observation(), {"cue_shown": True}

    def step(self, action: object) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        if self.t < self.length:
            return self._observation(), 0.0, False, False, {"progress": self.t / self.length}
        answer = int(action[0]) if self.multi else int(action)
        success = float(answer - self.action_start == self.cue)
        info = {"success": success, "label": "final", "progress": 1.0}
        return self._observation(), success, True, False, info

    def _observation(self) -> np.ndarray:
        signal = (1.0 if self.cue else -1.0) if self.t == 0 else 0.0
        return np.array([signal, min(self.t / self.length, 1.0)], dtype=np.float32)

    def render(self) -> np.ndarray:
        """An (8, 8, 3) uint8 frame: green for cue 1, red for cue 0, in the first step only."""
        frame = np.full((8, 8, 3), 30, dtype=np.uint8)
        if self.t == 0:
            frame[2:6, 2:6] = (40, 200, 40) if self.cue else (200, 40, 40)
        return frame


class ToyCueImageEnv(ToyCueEnv):
    """ToyCue observed as the uint8 image ``cue_image(t, cue, layout)``."""

    def __init__(self, layout: str = "hwc", **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.layout = layout
        self.observation_space = spaces.Box(low=0, high=255, shape=cue_image(0, 0, layout).shape, dtype=np.uint8)

    def _observation(self) -> np.ndarray:
        return cue_image(self.t, self.cue, self.layout)


class ToyBoxActionEnv(ToyCueEnv):
    """ToyCue with a continuous action without bounds, which a clipped Gaussian policy cannot take."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.action_space = spaces.Box(low=-np.inf, high=np.inf, shape=(1,), dtype=np.float32)


class ToyTupleObsEnv(ToyCueEnv):
    """ToyCue observed as a Tuple (as POPGym's tasks are): (cue, 1 + cue in the first observation and 0 after; step)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Tuple((spaces.Discrete(3), spaces.Discrete(self.length + 1)))

    def _observation(self) -> tuple[int, int]:
        return (1 + self.cue if self.t == 0 else 0, self.t)


class ToyNestedObsEnv(ToyTupleObsEnv):
    """ToyTupleObs with its step nested in a Tuple of its own, which the models cannot take."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Tuple((spaces.Discrete(3), spaces.Tuple((spaces.Discrete(self.length + 1),))))

    def _observation(self) -> tuple:
        cue, step = super()._observation()
        return (cue, (step,))


class ToyDictObsEnv(ToyCueEnv):
    """ToyCue observed as a dict: the image of ToyCueImage with the cue pixel cleared, the cue as a Discrete(3) (0: not
    shown, 1 + cue in the first observation), and the step as a MultiDiscrete([length + 1, 2])."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        image = spaces.Box(low=0, high=255, shape=IMAGE_SHAPE, dtype=np.uint8)
        steps = spaces.MultiDiscrete([self.length + 1, 2])
        self.observation_space = spaces.Dict({"image": image, "cue": spaces.Discrete(3), "step": steps})

    def _observation(self) -> dict:
        image = cue_image(self.t, self.cue)
        image[0, 0] = 0
        return {"image": image, "cue": 1 + self.cue if self.t == 0 else 0, "step": np.array([self.t, self.t % 2])}


for _name, _entry_point in (
    ("ToyCue-v0", ToyCueEnv),
    ("ToyDictObs-v0", ToyDictObsEnv),
    ("ToyCueImage-v0", ToyCueImageEnv),
    ("ToyBoxAction-v0", ToyBoxActionEnv),
    ("ToyTupleObs-v0", ToyTupleObsEnv),
    ("ToyNestedObs-v0", ToyNestedObsEnv),
):
    if _name not in gymnasium.registry:  # a second import (e.g. under another module name) must not re-register
        gymnasium.register(id=_name, entry_point=_entry_point, max_episode_steps=SPEC_LIMIT)


def _scripts() -> dict[str, tuple[spaces.Space, list]]:
    """Per case: the declared observation space and the observations of one episode, the reset's first."""
    box = spaces.Box(low=-1.0, high=1.0, shape=(3,), dtype=np.float32)
    vector = np.zeros(3, dtype=np.float32)
    codes = spaces.Discrete(3, start=1)
    pairs = spaces.MultiDiscrete([2, 3], start=[1, 1])
    return {
        "codes_from_one": (codes, [1, 3, 2]),  # codes 1..3: 3 is the last entry, not one past the block
        "pairs_from_one": (pairs, [np.array([1, 1]), np.array([2, 1]), np.array([1, 3])]),
        "dict_from_one": (spaces.Dict({"cue": codes, "pair": pairs}), [{"cue": 3, "pair": np.array([2, 1])}] * 2),
        "tuple_from_one": (spaces.Tuple((codes, pairs)), [(3, np.array([2, 1]))] * 2),
        "short_vector": (box, [vector, vector, vector[:2]]),  # (2,) at step 2
        "short_reset": (box, [vector[:2], vector]),
        # Gymnasium's own checker refuses a Dict's or Tuple's wrong parts in the reset and the first step, not later.
        "extra_key": (spaces.Dict({"a": box}), [{"a": vector}, {"a": vector}, {"a": vector, "b": vector}]),
        "pair_out_of_range": (pairs, [np.array([1, 1]), np.array([3, 1])]),  # 3 is past the first entry's codes 1..2
        "short_tuple": (spaces.Tuple((codes, codes)), [(1, 1), (1, 1), (1,)]),
        # Only for use without the Gymnasium type, which takes uint8 images alone: an image of levels 0-255 declared
        # as floats in [0, 1].
        "level_image": (
            spaces.Box(low=0.0, high=1.0, shape=(3, 6, 5), dtype=np.float32),
            [np.zeros((3, 6, 5), dtype=np.float32), np.full((3, 6, 5), 255.0, dtype=np.float32)],
        ),
    }


SCRIPTS = tuple(_scripts())


class ToyScriptedEnv(gymnasium.Env):
    """See the module docstring (ToyScripted-v0). Episodes end (terminated) with the script's last observation and
    report ``info["episode"]``, so that the env also runs without the Gymnasium type's wrapper."""

    metadata = {"render_modes": []}

    def __init__(self, case: str = "short_vector", render_mode: str | None = None) -> None:
        self.observation_space, self.script = _scripts()[case]
        self.action_space = spaces.Discrete(2)
        self.max_episode_steps = len(self.script) - 1
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[object, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.script[0], {}

    def step(self, action: object) -> tuple[object, float, bool, bool, dict]:
        self.t += 1
        done = self.t == len(self.script) - 1
        info = {"episode": {"reward": 0.0, "length": float(self.t)}} if done else {}
        return self.script[self.t], 0.0, done, False, info


class ToyScriptedAgents:
    """See the module docstring: agents "first" and "second" of PettingZoo's parallel API (entry point
    "toy_env:ToyScriptedAgents"); "first" sees the script's reset observation throughout, "second" the script."""

    metadata = {"render_modes": []}

    def __init__(self, case: str = "short_vector") -> None:
        self.env = ToyScriptedEnv(case)
        self.possible_agents = ["first", "second"]
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space:
        return self.env.observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self.env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        obs, _ = self.env.reset(seed=seed)
        return {"first": obs, "second": obs}, {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, _, done, _, _ = self.env.step(0)
        flags = {agent: done for agent in self.agents}
        rewards = {agent: 0.0 for agent in self.agents}
        return {"first": self.env.script[0], "second": obs}, rewards, flags, dict.fromkeys(flags, False), {}

    def close(self) -> None:
        pass


if "ToyScripted-v0" not in gymnasium.registry:
    gymnasium.register(id="ToyScripted-v0", entry_point=ToyScriptedEnv)
