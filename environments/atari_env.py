"""Atari 2600 games through ale-py (its ROMs ship with the package), preprocessed as Machado et al. (2018) advise.

``ALE/<game>-v5`` with one frame per ALE step, sticky actions (``sticky_actions``, 0.25 as in the v5 environments)
and the game's minimal action set, then gymnasium's ``AtariPreprocessing``: up to ``noop_max`` no-op actions at reset,
``frame_skip`` frames per agent step (max-pooled over the last two), grayscale, resized to ``screen_size`` square.
No life-loss terminations: an episode is a whole game. ``max_episode_frames`` (108k frames, 30 minutes of play,
counted by the emulator from the reset, its no-ops included) truncates it. No frame stack by default (the memory
replaces it); ``frame_stack`` k > 1 stacks the last k frames as channels, for a memory-less baseline (``memory: none``).

Observations: (k, screen_size, screen_size) float32 in [0, 1]. Rewards: their sign for learning (``clip_rewards``),
while ``info["episode"]["reward"]`` is the raw game score, the number that Atari results report.

ale-py and OpenCV (which AtariPreprocessing uses to resize) are imported only when an Atari environment is checked or
built.
"""

from __future__ import annotations

import collections
import difflib
import functools

import gymnasium
import numpy as np

from environments.registry import REQUIRED, EnvFamily, Key, invalid


@functools.cache
def _games() -> tuple[str, ...]:
    """The games ale-py registers (names as in ``ALE/<game>-v5``)."""
    import ale_py

    gymnasium.register_envs(ale_py)
    return tuple(sorted(name[4:-3] for name in gymnasium.registry if name.startswith("ALE/") and name.endswith("-v5")))


class AtariEnv(gymnasium.Wrapper):
    """One Atari game, preprocessed (see the module docstring), with per-episode raw scores."""

    def __init__(
        self,
        game: str,
        frame_skip: int = 4,
        noop_max: int = 30,
        sticky_actions: float = 0.25,
        screen_size: int = 84,
        frame_stack: int = 1,
        clip_rewards: bool = True,
        max_episode_frames: int = 108_000,
        render_mode: str | None = None,
    ) -> None:
        """Builds the game.

        Args:
            game: An ale-py game name, e.g. "Frostbite" or "Pong".
            frame_skip: Emulator frames per agent step.
            noop_max: At most this many no-op actions at reset (a random number of them).
            sticky_actions: Probability that the emulator repeats the previous action instead of the new one, per frame.
            screen_size: Side of the square grayscale observation.
            frame_stack: Frames stacked as channels (1: none).
            clip_rewards: Whether the learning reward is the sign of the game's reward.
            max_episode_frames: Emulator frames after which an episode is truncated.
            render_mode: None, "rgb_array" or "human".
        """
        from gymnasium.wrappers import AtariPreprocessing

        _games()  # registers the ALE ids
        env = gymnasium.make(
            f"ALE/{game}-v5",
            frameskip=1,
            repeat_action_probability=sticky_actions,
            full_action_space=False,
            max_num_frames_per_episode=max_episode_frames,
            render_mode=render_mode,
        )
        env = AtariPreprocessing(
            env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size, terminal_on_life_loss=False,
            grayscale_obs=True,
        )  # fmt: skip
        super().__init__(env)
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (frame_stack, screen_size, screen_size), np.float32)
        self.action_space = gymnasium.spaces.Discrete(int(env.action_space.n))
        self.max_episode_steps = -(-max_episode_frames // frame_skip)  # the truncation, in agent steps
        self._clip = clip_rewards
        self._frames: collections.deque = collections.deque(maxlen=frame_stack)
        self._score = 0.0
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Starts a game (after the random no-ops); returns the observation (k, S, S) and the info."""
        frame, info = self.env.reset(seed=seed, options=options)
        for _ in range(self._frames.maxlen):
            self._frames.append(frame)
        self._score = 0.0
        self._length = 0
        return self._observe(), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """One agent step of ``frame_skip`` frames; the reward is clipped to its sign with ``clip_rewards``."""
        frame, reward, terminated, truncated, info = self.env.step(int(action))
        self._frames.append(frame)
        terminated = bool(terminated)
        truncated = bool(truncated) and not terminated
        self._score += float(reward)
        self._length += 1
        if terminated or truncated:
            info = {**info, "episode": {"reward": self._score, "length": float(self._length)}}
        return self._observe(), float(np.sign(reward)) if self._clip else float(reward), terminated, truncated, info

    def _observe(self) -> np.ndarray:
        return np.stack(self._frames).astype(np.float32) / 255.0


def _check(config: dict) -> None:
    """Checks the values of a validated Atari section, including that ale-py has the game."""
    games = _games()
    if config["game"] not in games:
        close = difflib.get_close_matches(str(config["game"]), games, n=3)
        hint = f"did you mean {', '.join(repr(name) for name in close)}? " if close else ""
        raise invalid("game", config["game"], f"{hint}use a game of ale-py, e.g. 'Frostbite' or 'Pong' ({len(games)} in all)")
    for key in ("frame_skip", "screen_size", "frame_stack", "max_episode_frames"):
        if config[key] < 1:
            raise invalid(key, config[key], "use a whole number >= 1")
    if config["noop_max"] < 0:
        raise invalid("noop_max", config["noop_max"], "use 0 (no no-ops) or more")
    if not 0.0 <= config["sticky_actions"] < 1.0:
        raise invalid("sticky_actions", config["sticky_actions"], "use a probability in [0, 1), e.g. 0.25")


FAMILY = EnvFamily(
    name="Atari",
    schema={
        "game": Key(REQUIRED, "an ale-py game, e.g. Frostbite or Pong"),
        "frame_skip": Key(4, "emulator frames per agent step (max-pooled over the last two)"),
        "noop_max": Key(30, "at most this many no-ops at reset"),
        "sticky_actions": Key(0.25, "probability of repeating the previous action per frame, as in the v5 games"),
        "screen_size": Key(84, "side of the square grayscale observation"),
        "frame_stack": Key(1, "frames stacked as channels; 1: none (the memory replaces it), 4 for a memory-less baseline"),
        "clip_rewards": Key(True, "learn from the sign of each reward; the episode reward reported is the raw score"),
        "max_episode_frames": Key(108_000, "emulator frames after which an episode is truncated"),
    },
    check=_check,
    render_modes=(None, "rgb_array", "human"),
    make=lambda config, render_mode, evaluation: AtariEnv(**config, render_mode=render_mode),
    episode_limit=lambda config: -(-config["max_episode_frames"] // config["frame_skip"]),
)
