"""Classic-control tasks with their velocities hidden, as rl-baselines3-zoo's ``NoVel`` tasks, registered on import:
``environment: {type: Gymnasium, id: "environments.no_velocity:PendulumNoVel-v1"}``.

- PendulumNoVel-v1: Pendulum-v1 observed as [cos(angle), sin(angle)], without the angular velocity (the zoo's
  PendulumNoVel-v1), so that the agent has to infer how fast the pendulum turns from the angles it remembers.
- MountainCarContinuousNoVel-v0: MountainCarContinuous-v0 observed as [position], without the velocity.

(Masked CartPole has its own environment type, ``CartPole`` with ``mask_velocity``, which the zoo's CartPoleNoVel-v1
equals with ``name: CartPole-v1``.)
"""

import gymnasium
import numpy as np


class HideVelocity(gymnasium.ObservationWrapper):
    """Keeps only the entries ``keep`` of a 1-D Box observation."""

    def __init__(self, env: gymnasium.Env, keep: list[int]) -> None:
        super().__init__(env)
        self._keep = np.asarray(keep)
        low, high = env.observation_space.low[self._keep], env.observation_space.high[self._keep]
        self.observation_space = gymnasium.spaces.Box(low=low, high=high, dtype=env.observation_space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self._keep]


def _pendulum(**kwargs: object) -> gymnasium.Env:
    return HideVelocity(gymnasium.make("Pendulum-v1", **kwargs), keep=[0, 1])


def _mountain_car(**kwargs: object) -> gymnasium.Env:
    return HideVelocity(gymnasium.make("MountainCarContinuous-v0", **kwargs), keep=[0])


for _name, _entry_point, _limit in (
    ("PendulumNoVel-v1", _pendulum, 200),
    ("MountainCarContinuousNoVel-v0", _mountain_car, 999),
):
    if _name not in gymnasium.registry:
        gymnasium.register(id=_name, entry_point=_entry_point, max_episode_steps=_limit)
