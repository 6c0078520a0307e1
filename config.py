"""Training configuration: loaded from YAML once, validated once, defaults filled in one place.

Every key, its default and its meaning lives in ``SCHEMA`` below: docs/configuration.md's table is written from it by
``python -m lab.docs --write`` (tests/test_docs.py fails when they differ), so a meaning is markdown, its links
relative to docs/.
``load_config`` turns a YAML file into a ``Config``; ``validate_config`` does the same for a dict (tests, and
checkpoints, which store ``Config.to_dict()``). Errors are ``ConfigError`` with a message that names the key, the bad
value and the fix.
"""

from __future__ import annotations

import copy
import difflib
import os
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from environments import FAMILIES, agents_per_env, episode_limit, validate_env_config


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


MEMORY_PATHS = ("fast", "plain")  # the TrXL memory's two implementations (memories/trxl.py)


def check_memory_rules(
    memory: str, memory_gradients: bool, sampling: str, path: str | None = None, flag: str = "--memory-path"
) -> None:
    """The rules that tie the memory, the gradient into it, the minibatch sampling and the TrXL memory path together,
    kept here only: the config's validation, the memory's construction and the commands that choose a path ask them.

    Args:
        memory: the config's ``memory``.
        memory_gradients: ``transformer.memory_gradients`` (TrXL only).
        sampling: ``minibatch_sampling``, "chunks" or "steps".
        path: the memory path, "fast" or "plain", or None to check the config alone.
        flag: the command-line option that chose the path, for the message.

    Raises:
        ConfigError: naming the fix. The other memories have one way to run, which either path name selects.
    """
    trxl = memory == "trxl"
    if sampling == "steps" and trxl and memory_gradients:
        raise ConfigError(
            "'transformer.memory_gradients' is true, which needs minibatches of consecutive steps, but "
            "'minibatch_sampling' is 'steps': set minibatch_sampling to chunks or transformer.memory_gradients to false"
        )
    if sampling == "steps" and memory in ("gru", "lstm"):
        raise ConfigError(
            f"'minibatch_sampling' is 'steps', but a {memory} memory learns through time only on sequences "
            "(a single step trains from its stored state, so no gradient would reach earlier steps): set "
            "minibatch_sampling to chunks"
        )
    if path is None:
        return
    if path not in MEMORY_PATHS:
        raise ConfigError(f"{flag} '{path}' is unknown: use one of {', '.join(MEMORY_PATHS)}")
    if trxl and memory_gradients and path != "fast":
        raise ConfigError(
            f"'transformer.memory_gradients' is true, which only the fast memory path implements: use {flag} fast "
            "or set it to false"
        )


def check_memory_path(path: str, config: Config, flag: str = "--memory-path") -> None:
    """``check_memory_rules`` for a validated config run on memory path ``path`` (chosen by ``flag``)."""
    check_memory_rules(config.memory, config.transformer.memory_gradients, config.minibatch_sampling, path, flag)


@dataclass(frozen=True)
class Schedule:
    """``initial`` up to update ``start``, then a polynomial move to ``final`` over ``max_decay_steps`` updates (a
    decay, or a rise where ``final`` is the larger)."""

    initial: float
    final: float
    power: float
    max_decay_steps: int
    start: int = 0

    def value(self, update: int) -> float:
        """The scheduled value at ``update`` (0-based); ``final`` once the decay is over."""
        step = update - self.start
        if step <= 0:
            return self.initial
        if step >= self.max_decay_steps or self.initial == self.final:
            return self.final
        return (self.initial - self.final) * (1 - step / self.max_decay_steps) ** self.power + self.final


@dataclass(frozen=True)
class TransformerConfig:
    """The episodic memory transformer (see transformer.py)."""

    num_blocks: int
    embed_dim: int
    num_heads: int
    memory_length: int
    positional_encoding: str
    layer_norm: str
    gtrxl: bool
    gtrxl_bias: float
    memory_gradients: bool
    query_position: bool
    positional_values: bool
    recency_bias: bool
    learned_slopes: bool
    output_norm: bool
    max_learning_rate: float
    warmup_updates: int

    @property
    def has_recency_bias(self) -> bool:
        """ALiBi's bias on the attention scores: ``positional_encoding`` "alibi", or ``recency_bias`` on another."""
        return self.positional_encoding == "alibi" or self.recency_bias


@dataclass(frozen=True)
class RecurrenceConfig:
    """The recurrent memory (``memory`` gru or lstm, see memories/recurrent.py)."""

    hidden_state_size: int
    num_layers: int


@dataclass(frozen=True)
class Config:
    """A validated training configuration. ``environment`` is the environment section with defaults filled in."""

    environment: dict
    gamma: float
    lamda: float
    updates: int
    epochs: int
    n_workers: int
    worker_steps: int
    n_mini_batch: int
    minibatch_sampling: str
    sequence_length: int
    normalize_advantages: bool
    normalize_observations: bool
    normalize_skip_keys: list[str]
    normalize_one_hot: bool
    normalize_rewards: bool
    normalize_clip: float
    clipped_log_prob: bool
    value_loss_coefficient: float
    value_trains_memory: bool
    reconstruction_coefficient: float
    hidden_layer_size: int
    max_grad_norm: float
    adam_epsilon: float
    adam_epsilon_schedule: Schedule
    adam_update_clipping: bool
    weight_decay: float
    memory_learning_rate_scale: float
    learning_rate_warmup: int
    target_kl: float
    kl_rollback: bool
    n_processes: int
    memory_dtype: str
    compute_dtype: str
    compile: bool
    checkpoint_interval: int
    eval_interval: int
    eval_episodes: int
    video_interval: int
    track: bool
    wandb_project: str
    wandb_entity: str
    memory: str
    transformer: TransformerConfig
    recurrence: RecurrenceConfig
    learning_rate_schedule: Schedule
    beta_schedule: Schedule
    clip_range_schedule: Schedule

    def to_dict(self) -> dict:
        """Plain dict of builtins (for checkpoints); ``validate_config`` reads it back."""
        return asdict(self)


MINIBATCH_SAMPLINGS = ("chunks", "steps")  # see buffer.Buffer.minibatches
MEMORY_TYPES = ("trxl", "gru", "lstm", "none")  # see memories.make_memory
POSITIONAL_ENCODINGS = ("", "relative", "learned", "rotary", "alibi")  # see transformer.py

# key: (type, default, check, meaning). A default of REQUIRED means the key must be given.
REQUIRED = object()
_POSITIVE = ("> 0", lambda v: v > 0)
_NON_NEGATIVE = (">= 0", lambda v: v >= 0)
_UNIT = ("in [0, 1]", lambda v: 0 <= v <= 1)

SCHEDULE_SCHEMA: dict[str, tuple] = {
    "initial": (float, REQUIRED, _NON_NEGATIVE, "value at update 0"),
    "final": (float, REQUIRED, _NON_NEGATIVE, "value once the decay is over"),
    "power": (float, 1.0, _POSITIVE, "exponent of the polynomial decay (1 = linear)"),
    "max_decay_steps": (int, REQUIRED, _POSITIVE, "updates over which the value decays"),
    "start": (int, 0, _NON_NEGATIVE, "the update (0-based) up to which the value stays initial; the decay follows it"),
}

TRANSFORMER_SCHEMA: dict[str, tuple] = {
    "num_blocks": (int, 3, _POSITIVE, "transformer blocks K"),
    "embed_dim": (int, 384, _POSITIVE, "token width D; divisible by `num_heads`"),
    "num_heads": (int, 4, _POSITIVE, "attention heads"),
    "memory_length": (
        int,
        64,
        _POSITIVE,
        (
            "how many past steps of the episode each step sees, exactly (the reference showed at most "
            "`memory_length - 1`); must not exceed the task's episode limit: `environment.max_episode_steps`, "
            "or the task's own (CartPole 200/500, Atari `max_episode_frames` / `frame_skip`, a Gymnasium "
            "id's registered limit); Memory Gym's is not checked"
        ),
    ),
    "positional_encoding": (
        str,
        "relative",
        ('"", "relative", "learned", "rotary" or "alibi"', lambda v: v in POSITIONAL_ENCODINGS),
        (
            "how attention knows when a memory step was (the reference's default: none). Added to each memory "
            'token by its episode step: `""` none, `relative` sinusoidal, `learned` a learned table of 2048 '
            "rows (episode steps beyond it get the sinusoidal encoding, so Endless episodes keep their steps "
            "apart). By the distance between the query's step and the memory token's: `rotary` turns each "
            "head's queries and keys by their steps (RoFormer; `embed_dim / num_heads` must be even), `alibi` "
            "adds a fixed recency bias of -slope x distance per head (ALiBi's slopes: 2^-8/H ... 2^-8 for H a "
            "power of two), so step 400 of an episode looks to attention like step 40 (`query_position` and "
            "`positional_values` do not apply)"
        ),
    ),
    "layer_norm": (
        str,
        "pre",
        ('"", "pre" or "post"', lambda v: v in ("", "pre", "post")),
        (
            "`pre` (before attention and feed-forward; memory tokens get their own LayerNorm), `post` (after "
            'each residual) or `""`'
        ),
    ),
    "gtrxl": (bool, False, None, "GTrXL: GRU gates instead of residual connections"),
    "gtrxl_bias": (
        float,
        0.0,
        None,
        (
            "initial value of the GRU gates' learned bias (one per unit, as in the reference); larger values "
            "start the gates closer to the identity"
        ),
    ),
    "memory_gradients": (
        bool,
        True,
        None,
        (
            "training only: the memory slots of a minibatch chunk's own steps hold this pass's block inputs, "
            "with gradient (Transformer-XL's training on segments), so a step's loss reaches the observations "
            "it remembers; false: every memory token is the rollout's, without gradient, as in the "
            "reference. Needs `--memory-path fast` and `minibatch_sampling: chunks` (set it false for either)"
        ),
    ),
    "query_position": (
        bool,
        True,
        None,
        (
            "also add the positional encoding of the current step to each block's attention query (the "
            "reference adds it to the memory tokens only), so attention can tell how long ago a memory token "
            "was written; no effect without a `positional_encoding`"
        ),
    ),
    "recency_bias": (
        bool,
        True,
        None,
        "add ALiBi's fixed recency bias (-slope x distance per head) to the attention scores, on top of any "
        '`positional_encoding` (`relative`, `learned`, `rotary` or none, `""`; `alibi` is that bias alone, '
        "whatever this says): attention prefers recent steps, strongly with 4 or more heads, barely with one (its "
        "slope is 2^-8: [memory.md](memory.md)) (the reference has no bias; models saved before 2026-12-05 load "
        "with false)",
    ),
    "learned_slopes": (
        bool,
        False,
        None,
        (
            "learn the recency bias's slopes (one per head, shared by the blocks) with the transformer's other "
            "parameters, starting at ALiBi's, so that each head can grow more or less local (or prefer older steps, "
            "a negative slope) as the task asks; needs the bias (`recency_bias` or `positional_encoding: alibi`); "
            "false: ALiBi's fixed slopes"
        ),
    ),
    "output_norm": (
        bool,
        False,
        None,
        (
            "a LayerNorm on the last block's output before the policy and value heads, as pre-norm transformers end "
            "(the reference has none): the heads see features of a fixed scale however the residual stream grows, "
            "as an LSTM's bounded output is"
        ),
    ),
    "max_learning_rate": (
        float,
        3.0e-4,
        _NON_NEGATIVE,
        (
            "the transformer's parameters (its input embedding, blocks and learned positions) train at most at "
            "this rate, whatever `learning_rate_schedule` and `memory_learning_rate_scale` say; the encoder and "
            "the heads at the schedule's rate; 0: no bound (the reference's, and the default until 2026-12-07: "
            "at rates above it the transformer's policy moved too far per update on masked Pendulum, docs/suite.md)"
        ),
    ),
    "warmup_updates": (
        int,
        6,
        _NON_NEGATIVE,
        (
            "updates over which every parameter's rate rises linearly from a tenth of its value (the first "
            "update) to all of it (update N + 1 on) while the memory is the transformer, as `learning_rate_warmup` "
            "does for any memory (the two multiply); 0: none (the reference's, and the default until 2026-12-07)"
        ),
    ),
    "positional_values": (
        bool,
        False,
        None,
        (
            "the positional encoding goes into the memory's keys only, so attention selects by position but "
            "reads the tokens' content; true: into the values as well, as the reference (its norm, sqrt(D/2), "
            "can drown a small token's content)"
        ),
    ),
}

RECURRENCE_SCHEMA: dict[str, tuple] = {
    "hidden_state_size": (
        int,
        256,
        _POSITIVE,
        "width H of the GRU/LSTM state (an LSTM keeps a hidden and a cell state of H each)",
    ),
    "num_layers": (int, 1, _POSITIVE, "stacked recurrent layers"),
}

SCHEMA: dict[str, tuple] = {
    "environment": (dict, REQUIRED, None, "the task: `type` and the type's own keys ([environments.md](environments.md))"),
    "gamma": (float, 0.99, _UNIT, "discount factor, in [0, 1]"),
    "lamda": (float, 0.95, _UNIT, "GAE lambda (the reference's spelling), in [0, 1]"),
    "updates": (int, 200, _POSITIVE, "PPO updates; each is one rollout and `epochs` passes over it"),
    "epochs": (int, 4, _POSITIVE, "optimisation epochs per rollout"),
    "n_workers": (int, 16, _POSITIVE, "parallel environments N"),
    "worker_steps": (int, 128, _POSITIVE, "steps per environment and rollout T"),
    "n_mini_batch": (int, 8, _POSITIVE, "minibatches per epoch; N * T / `sequence_length` must be divisible by it"),
    "minibatch_sampling": (
        str,
        "chunks",
        ('"chunks" or "steps"', lambda v: v in MINIBATCH_SAMPLINGS),
        (
            "`chunks`: minibatches of chunks of `sequence_length` consecutive steps; `steps`: all N * T steps "
            "are shuffled and each minibatch holds N * T / `n_mini_batch` single steps, as in the reference "
            "(`sequence_length` is then unused; not with `transformer.memory_gradients` or a GRU/LSTM memory, "
            "which need consecutive steps). Costs and design: [memory.md](memory.md), "
            "[performance.md](performance.md)"
        ),
    ),
    "sequence_length": (
        int,
        0,
        _NON_NEGATIVE,
        (
            "steps per minibatch chunk C (see [architecture.md](architecture.md)); must divide "
            "`worker_steps`; 0 = the largest divisor <= 128 that gives every minibatch the same number of "
            "chunks"
        ),
    ),
    "normalize_observations": (
        bool,
        False,
        None,
        (
            "shift and scale each feature of vector observations (each vector key of a dict) by its running "
            "mean and standard deviation over all of training, then clip to `normalize_clip`, as "
            "Stable-Baselines3's `VecNormalize`; images are left as they are, and so are one-hot codes "
            "(Discrete and MultiDiscrete observations, MiniGrid's symbolic view, which is then left whole; "
            "`normalize_one_hot` normalises them too) and the keys of `normalize_skip_keys`. A new run first "
            "takes `worker_steps` steps of random actions in every worker into the statistics (not counted in "
            "the run's steps), so the first rollout already sees normalised inputs; then they are updated "
            "once per rollout from all workers (and all torchrun ranks), after the update trained on it, are "
            "saved in the checkpoint and the model file, and are applied frozen by enjoy.py and every evaluation "
            "([normalization.py](../normalization.py))"
        ),
    ),
    "normalize_skip_keys": (
        list,
        [],
        ("a list of key names (strings)", lambda v: all(isinstance(key, str) for key in v)),
        (
            "keys of a Dict observation that `normalize_observations` leaves as they are, as SB3's "
            "`norm_obs_keys` lists the others, e.g. `[goal]`; a key the observations do not have is refused "
            "when training starts, with the list of their keys"
        ),
    ),
    "normalize_one_hot": (
        bool,
        False,
        None,
        (
            "let `normalize_observations` normalise one-hot codes too (the parts environments declare one-hot: "
            "Discrete and MultiDiscrete observations, MiniGrid's symbolic view), as `VecNormalize` normalises any "
            "Box, e.g. the integer grid codes of MiniGrid's `FlatObsWrapper` in rl-baselines3-zoo; a rare code "
            "then stands out (up to the clip), and one never seen in the warm-up jumps to the clip when it "
            "first appears. False leaves them as they are, as SB3 does one-hot codes. "
            "[configs/minigrid_memory_s7.yaml](../configs/minigrid_memory_s7.yaml) sets it: its memories "
            "learn the task with it and mostly not without ([docs/suite.md](suite.md))"
        ),
    ),
    "normalize_rewards": (
        bool,
        False,
        None,
        (
            "divide each reward by the running standard deviation of the discounted return (`gamma`), then "
            "clip to `normalize_clip`, as `VecNormalize`; training only: reported episode rewards stay "
            "unscaled"
        ),
    ),
    "normalize_clip": (float, 10.0, _POSITIVE, "normalised observations and rewards are clipped to [-clip, clip]"),
    "normalize_advantages": (
        bool,
        True,
        None,
        (
            "scale the advantages to mean 0 and std 1 over each minibatch, as the reference does; false uses "
            "GAE's advantages as they are (`configs/poc_memory_env.yaml`: false, see "
            "[differences.md](differences.md))"
        ),
    ),
    "clipped_log_prob": (
        bool,
        False,
        None,
        (
            "continuous actions only: the log-probability of a sample beyond a bound is that of the normal's "
            "whole tail beyond it, i.e. of the clipped action the environment executes (Fujita and Maeda "
            "2018); false uses the density of the unclipped sample, as CleanRL's continuous PPO. Measured on "
            "the continuous proof-of-memory task: 5 of 10 seeds solved it against 6 of 10 with false "
            "([results](../results/memories/poc/README.md))"
        ),
    ),
    "value_loss_coefficient": (float, 0.25, _NON_NEGATIVE, "weight of the value loss"),
    "value_trains_memory": (
        bool,
        True,
        None,
        (
            "the value loss's gradient reaches the memory and the encoder, which the policy and the value "
            "share (the reference's); false: the value head learns on a detached copy of the memory's output, "
            "so only the policy loss (and the reconstruction loss) trains them"
        ),
    ),
    "reconstruction_coefficient": (
        float,
        0.0,
        _NON_NEGATIVE,
        (
            "weight of the observation-reconstruction loss (0: off, no decoder is built): a decoder "
            "(transposed convolutions mirroring the encoder for images, binary cross-entropy per pixel; one "
            "linear layer for vectors, mean squared error) reconstructs each step's observation (each key of "
            "a dict) as the encoder sees it (normalised with `normalize_observations`, so that each feature "
            "weighs alike in the squared error, not by its variance in the environment's units) from the "
            "memory's output, as in the Memory Gym paper and CleanRL's "
            "`reconstruction_coef`; TensorBoard `losses/reconstruction`. `configs/mortar_mayhem.yaml` and "
            "`configs/searing_spotlights.yaml`: 0.1, the paper's value"
        ),
    ),
    "hidden_layer_size": (int, 384, _POSITIVE, "width of the policy and value hidden layers"),
    "max_grad_norm": (float, 0.5, _POSITIVE, "gradient norm clip"),
    "adam_epsilon": (
        float,
        1e-8,
        _POSITIVE,
        (
            "epsilon of the AdamW optimizer, added to the root of its second-moment estimate (torch's "
            "default, the reference's; `configs/poc_memory_env.yaml`: 1e-5, `configs/minigrid.yaml`: 1e-4 "
            "rising to 1e-3 by `adam_epsilon_schedule`, `configs/recall_multi_agent.yaml`: 1e-3, see "
            "[differences.md](differences.md))"
        ),
    ),
    "adam_epsilon_schedule": (
        dict,
        {},
        None,
        (
            "`{}`: `adam_epsilon` throughout. Otherwise AdamW's epsilon by update, from `adam_epsilon` (its "
            "`initial` defaults to it; giving both with different values is an error). E.g. `{final: 1.0e-3, "
            "start: 99, max_decay_steps: 1}`: `adam_epsilon` for updates 1-100, 1e-3 after, a larger epsilon "
            "once an agent is solved ([results](../results/ablations/minigrid/README.md#against-the-falls-target_kl-then-"
            "undoing-a-step-or-a-larger-adamw-epsilon)). TensorBoard `training/adam_epsilon`"
        ),
    ),
    "adam_update_clipping": (
        bool,
        False,
        None,
        (
            "StableAdamW's update clipping (Wortsman et al., 2023): each tensor's AdamW step is divided by "
            "max(1, RMS(g²/v̂)), v̂ the second-moment estimate with this gradient, so one gradient far above "
            "the recent ones (a rare failure of a solved policy) cannot move the weights by several learning "
            "rates at once; TensorBoard `training/update_scale_min` is the update's smallest scale. False is "
            "plain AdamW, the reference's. On the multi-agent recall task it did not stop solved seeds from "
            "falling back; a larger `adam_epsilon` did ([results](../results/ablations/recall/README.md#multi-agent-"
            "recall-why-a-solved-agent-fell-back-and-the-fix-5-seeds-per-setting))"
        ),
    ),
    "weight_decay": (
        float,
        0.01,
        _NON_NEGATIVE,
        (
            "AdamW's decoupled weight decay, on every parameter (gate biases, layer norms and learned "
            "positions included), as the reference's AdamW with torch's default"
        ),
    ),
    "memory_learning_rate_scale": (
        float,
        1.0,
        _POSITIVE,
        (
            "the memory's parameters (TrXL: its input embedding, blocks and learned positions; GRU/LSTM: the "
            "recurrent layers and the Linear + ReLU after them) train at this multiple of the learning rate, the "
            "encoder and the heads at the rate itself; 1 (the reference's): one rate for all. A run resumes only "
            "with the scale's side of 1 it was trained with (two parameter groups or one)"
        ),
    ),
    "learning_rate_warmup": (
        int,
        0,
        _NON_NEGATIVE,
        (
            "updates over which the learning rate rises linearly from a tenth of `learning_rate_schedule`'s value "
            "(the first update) to all of it (update N + 1 on), for every parameter; 0 (the reference's): none"
        ),
    ),
    "target_kl": (
        float,
        0.0,
        _NON_NEGATIVE,
        (
            "end an update's epochs at the first minibatch whose approximate KL divergence from the rollout's "
            "policy exceeds this, before that minibatch's step (0: every epoch runs, as in the reference); "
            "TensorBoard `training/gradient_steps` and `training/kl_stop`, and the console line says where it "
            "stopped; `training/approx_kl_max`, the largest minibatch KL of each update, shows how far a run "
            "without it would pass a given target"
        ),
    ),
    "kl_rollback": (
        bool,
        False,
        None,
        (
            "with `target_kl`: when a minibatch exceeds it, also undo the update's last gradient step (the "
            "weights and AdamW's moments restored as they were before it), so that a single step that moved "
            "the policy far is not kept, as a stop before the next step alone keeps it; TensorBoard "
            "`training/kl_rollback` is 1 where a step was undone and `training/gradient_steps` counts the "
            "steps kept. Needs `target_kl` > 0. Replayed on a MiniGrid fall it turned success 0.79 into a dip "
            "to 0.92; over 5 seeds of the multi-agent recall task 2 still fell, where a larger "
            "`adam_epsilon` stopped the falls ([results](../results/ablations/recall/README.md#multi-agent-"
            "recall-why-a-solved-agent-fell-back-and-the-fix-5-seeds-per-setting))"
        ),
    ),
    "n_processes": (
        int,
        0,
        (">= -1", lambda v: v >= -1),
        (
            "environment worker processes; 0 steps the environments in the main process (fastest for cheap "
            "tasks, and on a 2-core CPU); -1 (auto): on a GPU run one process per core but the trainer's (at "
            "most one per environment; with torchrun each rank takes its share of the machine's cores), on "
            "the CPU 0; the GPU-scale Memory Gym configs use -1"
        ),
    ),
    "memory_dtype": (
        str,
        "float32",
        ('"float32" or "bfloat16"', lambda v: v in ("float32", "bfloat16")),
        (
            "dtype of stored memory tokens (recurrent memories: of the stored state, rounded after every step "
            "in rollouts and training alike): `float32` or `bfloat16` (halves the trace; compute stays "
            "float32)"
        ),
    ),
    "compute_dtype": (
        str,
        "float32",
        ('"float32" or "bfloat16"', lambda v: v in ("float32", "bfloat16")),
        (
            "`bfloat16` runs the encoder's and the memory's matrix products in bfloat16 (training under "
            "`torch.autocast`; rollouts and evaluations with bfloat16 copies of those weights, made once per "
            "rollout), the heads, the losses and the optimizer's weights stay float32: for GPUs and CPUs with "
            "bfloat16 units (AMX, AVX-512 BF16, Arm BF16). A CPU without them would emulate bfloat16, slower "
            "than float32: the run says so and computes in float32 (the summaries' `ran` text and the "
            "benchmark's JSON say what ran). Log-probabilities and values stay within 0.03 of float32's "
            "(`tests/test_compute_dtype.py`); 1.4-1.6x the steps/s of float32 at Mortar Mayhem Grid's 32 x 512 "
            "on a Xeon with AMX (training alone 1.6-2.1x; the rollout, a third of it the environments, barely "
            "gains), 1.21x on the MiniGrid config with AVX-512 BF16 ([performance.md](performance.md)). "
            "It learns the proof-of-memory task as float32 does; masked CartPole, 5 seeds: 191 against "
            "float32's 196, within each other's intervals, since the attention computes in float32 on the CPU "
            "(186 before; [results](../results/ablations/bfloat16/README.md)). Not measured on more tasks, so "
            "float32 stays the default"
        ),
    ),
    "compile": (
        bool,
        False,
        None,
        (
            "compile the encoder, the transformer blocks and the heads with `torch.compile` (`dynamic=True`, "
            "in place: checkpoints keep their keys); the first update compiles (the console says how long it "
            "took), outputs stay those of the plain modules to float rounding (`tests/test_compile.py`). Off: "
            "on the MiniGrid config on the development CPU it ran at 0.94x the plain modules' steps/s "
            "([performance.md](performance.md))"
        ),
    ),
    "checkpoint_interval": (
        int,
        10,
        _NON_NEGATIVE,
        ("write `models/<run-id>/checkpoint.pt` every this many updates (0: only at the end and on early stops)"),
    ),
    "eval_interval": (int, 50, _NON_NEGATIVE, "evaluate on unseen seeds every this many updates and at the end (0: never)"),
    "eval_episodes": (
        int,
        10,
        _POSITIVE,
        "episodes per evaluation during training (the same unseen episodes at every evaluation)",
    ),
    "video_interval": (
        int,
        0,
        _NON_NEGATIVE,
        (
            "at every this many evaluations, and at the last, also record the first evaluation episode (with "
            "the attention strips for `memory: trxl`) as an animated GIF: TensorBoard's Images tab "
            "`evaluation/episode`, and W&B with `track`; 0: never. Videos come with evaluations "
            "(`eval_interval`); needs an environment that renders frames. Replaces `eval_video` (`true` is 1); "
            "cost: [training.md](training.md#videos-of-the-agent)"
        ),
    ),
    "track": (
        bool,
        False,
        None,
        (
            "also log the run to Weights & Biases (`pip install wandb`; `train.py --track` sets it): the "
            "TensorBoard scalars against environment steps, the resolved config, the git commit and the seed, "
            "videos; the W&B run is named after `--run-id` and a resumed run continues it; with torchrun rank 0 "
            "alone logs ([training.md](training.md#weights-and-biases))"
        ),
    ),
    "wandb_project": (str, "trxl-ppo", None, "with `track`: the W&B project the run goes to"),
    "wandb_entity": (str, "", None, "with `track`: the W&B team or user it goes to (empty: the account's default)"),
    "memory": (
        str,
        "trxl",
        ('"trxl", "gru", "lstm" or "none"', lambda v: v in MEMORY_TYPES),
        (
            "the agent's memory: `trxl` the episodic transformer (`transformer.*` keys), `gru` or `lstm` a "
            "recurrent layer trained with truncated backpropagation through each chunk (`recurrence.*` keys), "
            "`none` no memory (the encoder's features go straight to the heads). `--set memory=gru` works on "
            "any config; see [Memories](architecture.md#memories-transformer-gru-lstm-none)"
        ),
    ),
    "transformer": (
        dict,
        {},
        None,
        "the memory transformer: a mapping of the `transformer.*` keys below, each with its default",
    ),
    "recurrence": (
        dict,
        {},
        None,
        "the recurrent memory (`memory: gru` or `lstm`): a mapping of the `recurrence.*` keys below",
    ),
    "learning_rate_schedule": (dict, {"initial": 3e-4, "final": 3e-4, "max_decay_steps": 1}, None, "AdamW learning rate"),
    "beta_schedule": (dict, {"initial": 1e-3, "final": 1e-3, "max_decay_steps": 1}, None, "entropy bonus coefficient"),
    "clip_range_schedule": (
        dict,
        {"initial": 0.2, "final": 0.2, "max_decay_steps": 1},
        None,
        "PPO clip range (policy and value)",
    ),
}


_KIND_NAMES = {dict: "a mapping of keys to values", int: "an integer (int)", float: "a number (float)", str: "a string",
               bool: "true or false", list: "a list"}  # fmt: skip


def _check_section(values: Any, schema: dict[str, tuple], prefix: str) -> dict:
    """Type-check ``values`` against ``schema``, fill defaults, and return a new dict."""
    if not isinstance(values, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping of keys to values, got {values!r}")
    unknown = sorted(set(values) - set(schema))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(schema), n=1, cutoff=0.6)
        hint = f"did you mean '{prefix}{close[0]}'? " if close else ""
        raise ConfigError(f"unknown key '{prefix}{unknown[0]}': {hint}Allowed keys here: {', '.join(schema)}")
    out = {}
    for key, (kind, default, check, _) in schema.items():
        name = prefix + key
        if key not in values:
            if default is REQUIRED:
                raise ConfigError(f"missing key '{name}': add it to the config ({schema[key][3]})")
            out[key] = copy.deepcopy(default)
            continue
        value = values[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is float and isinstance(value, str):
            # YAML 1.1 reads "3e-4" (no dot) as a string; accept it as the number the user meant.
            try:
                value = float(value)
            except ValueError:
                pass
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"'{name}' must be {_KIND_NAMES[kind]}, got {value!r} ({type(value).__name__})")
        if check is not None and not check[1](value):
            raise ConfigError(f"'{name}' must be {check[0]}, got {value!r}")
        out[key] = value
    return out


def _schedule(values: Any, name: str) -> Schedule:
    return Schedule(**_check_section(values, SCHEDULE_SCHEMA, name + "."))


def auto_sequence_length(n_workers: int, worker_steps: int, n_mini_batch: int, limit: int = 128) -> int:
    """Largest chunk length <= ``limit`` that divides ``worker_steps`` and gives every minibatch the same chunk count.

    Returns 0 when there is none.
    """
    for length in range(min(limit, worker_steps), 0, -1):
        if worker_steps % length == 0 and (n_workers * worker_steps // length) % n_mini_batch == 0:
            return length
    return 0


def validate_config(raw: Any) -> Config:
    """Validate a raw config mapping and return a ``Config`` with every default filled in."""
    if isinstance(raw, dict) and "eval_video" in raw:  # saved configs are renamed by with_saved_defaults
        raise ConfigError(
            f"'eval_video' ({raw['eval_video']!r}) was replaced by 'video_interval', a video at every this many "
            "evaluations: write video_interval: 1 for eval_video: true, or leave both out for none"
        )
    values = _check_section(raw, SCHEMA, "")
    try:
        environment = validate_env_config(values["environment"])
    except ValueError as error:
        raise ConfigError(str(error)) from None
    transformer = TransformerConfig(**_check_section(values["transformer"], TRANSFORMER_SCHEMA, "transformer."))
    recurrence = RecurrenceConfig(**_check_section(values["recurrence"], RECURRENCE_SCHEMA, "recurrence."))
    trxl = values["memory"] == "trxl"  # the transformer section is checked against the rest only when it is used
    if transformer.embed_dim % transformer.num_heads != 0:
        raise ConfigError(
            f"'transformer.embed_dim' ({transformer.embed_dim}) must be divisible by 'transformer.num_heads' "
            f"({transformer.num_heads}): change one of them, e.g. embed_dim {transformer.num_heads * 64}"
        )
    if transformer.positional_encoding in ("relative", "learned") and transformer.embed_dim % 2:
        raise ConfigError(
            f"'transformer.embed_dim' ({transformer.embed_dim}) must be even for positional_encoding "
            f"'{transformer.positional_encoding}' (sine and cosine halves, also past the learned table): use an even embed_dim"
        )
    head_width = transformer.embed_dim // transformer.num_heads
    if transformer.positional_encoding == "rotary" and head_width % 2:
        raise ConfigError(
            f"positional_encoding 'rotary' turns pairs of each head's {head_width} dimensions (embed_dim / num_heads): "
            "make embed_dim / num_heads even"
        )
    if transformer.learned_slopes and not transformer.has_recency_bias:
        raise ConfigError(
            "'transformer.learned_slopes' learns the recency bias's slopes, and this transformer has no bias "
            "(recency_bias false, positional_encoding not alibi): set transformer.recency_bias=true or drop learned_slopes"
        )
    n, t, m = values["n_workers"], values["worker_steps"], values["n_mini_batch"]
    if (n * t) % m != 0:
        raise ConfigError(
            f"the batch n_workers * worker_steps = {n * t} is not divisible by 'n_mini_batch' ({m}): "
            "change n_workers, worker_steps or n_mini_batch"
        )
    check_memory_rules(values["memory"], transformer.memory_gradients, values["minibatch_sampling"])
    if values["minibatch_sampling"] == "chunks":  # single steps need no chunk length: sequence_length stays unused
        if values["sequence_length"] == 0:
            values["sequence_length"] = auto_sequence_length(n, t, m)
            if values["sequence_length"] == 0:
                raise ConfigError(
                    f"no 'sequence_length' splits worker_steps ({t}) into chunks that n_mini_batch ({m}) divides"
                )
        c = values["sequence_length"]
        if t % c != 0:
            raise ConfigError(f"'sequence_length' ({c}) must divide 'worker_steps' ({t}): pick a divisor, or 0 for automatic")
        if (n * t // c) % m != 0:
            raise ConfigError(
                f"n_workers * worker_steps / sequence_length = {n * t // c} chunks is not divisible by 'n_mini_batch' ({m}): "
                "change sequence_length (0 picks one automatically) or n_mini_batch"
            )
    agents = agents_per_env(environment)
    if n % agents:
        raise ConfigError(
            f"'n_workers' ({n}) must be a multiple of the {agents} agents of one {environment['type']} environment: "
            f"each agent is a worker (one memory stream), so use e.g. n_workers = {agents * -(-n // agents)}"
        )
    if values["n_processes"] > n // agents:
        raise ConfigError(
            f"'n_processes' ({values['n_processes']}) exceeds the {n // agents} environments of {n} workers with "
            f"{agents} agents each: use n_processes <= {n // agents}"
        )
    max_steps = episode_limit(environment)  # -1 when unknown or unbounded
    if trxl and 0 < max_steps < transformer.memory_length:
        raise ConfigError(
            f"'transformer.memory_length' ({transformer.memory_length}) exceeds the episode length "
            f"'environment.max_episode_steps' ({max_steps}; the task's own limit where that key is unset or 0): "
            f"memory beyond the episode is never filled; use memory_length <= {max_steps}"
        )
    if values["normalize_skip_keys"] and not values["normalize_observations"]:
        raise ConfigError(
            f"'normalize_skip_keys' ({values['normalize_skip_keys']}) names keys that observation normalisation leaves "
            "as they are, but 'normalize_observations' is false: set normalize_observations true, or leave out "
            "normalize_skip_keys"
        )
    if values["normalize_one_hot"] and not values["normalize_observations"]:
        raise ConfigError(
            "'normalize_one_hot' lets observation normalisation normalise one-hot codes, but "
            "'normalize_observations' is false: set normalize_observations true, or leave out normalize_one_hot"
        )
    if values["kl_rollback"] and values["target_kl"] <= 0:
        raise ConfigError(
            "'kl_rollback' undoes the step before the minibatch that passes target_kl, but 'target_kl' is 0 (off): "
            "set target_kl > 0 (e.g. 0.2) or kl_rollback to false"
        )
    if values["video_interval"] and "rgb_array" not in FAMILIES[environment["type"]].allowed_render_modes(environment):
        raise ConfigError(
            f"'video_interval' ({values['video_interval']}) records videos, which need frames, but a "
            f"{environment['type']} environment cannot render them (no 'rgb_array' render mode): set video_interval to 0"
        )
    values["environment"] = environment
    values["transformer"] = transformer
    values["recurrence"] = recurrence
    for key in ("learning_rate_schedule", "beta_schedule", "clip_range_schedule"):
        values[key] = _schedule(values[key], key)
    values["adam_epsilon"], values["adam_epsilon_schedule"] = _epsilon_schedule(raw, values)
    return Config(**values)


def _epsilon_schedule(raw: dict, values: dict) -> tuple[float, Schedule]:
    """AdamW's epsilon and its schedule: ``adam_epsilon`` throughout where ``adam_epsilon_schedule`` is empty, else the
    schedule from ``adam_epsilon`` (or from the schedule's ``initial`` where the config gives no ``adam_epsilon``)."""
    name, epsilon, section = "adam_epsilon_schedule", values["adam_epsilon"], dict(values["adam_epsilon_schedule"])
    if not section:
        return epsilon, Schedule(initial=epsilon, final=epsilon, power=1.0, max_decay_steps=1)
    given = "adam_epsilon" in raw
    section.setdefault("initial", epsilon)
    schedule = _schedule(section, name)
    if given and schedule.initial != epsilon:
        raise ConfigError(
            f"'{name}.initial' ({schedule.initial:g}) differs from 'adam_epsilon' ({epsilon:g}), where the schedule "
            f"starts: leave out {name}.initial, or set both to the same value"
        )
    for key, value in (("initial", schedule.initial), ("final", schedule.final)):
        if value <= 0:
            raise ConfigError(f"'{name}.{key}' must be > 0 (AdamW divides by the root of v plus epsilon), got {value!r}")
    return schedule.initial, schedule


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn command-line ``key=value`` items into {dotted key: value}, values parsed as YAML.

    An empty value is the empty string (``--set transformer.positional_encoding=`` turns the encoding off), not YAML's
    null, which no config key takes.
    """
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value (e.g. updates=10 or transformer.memory_length=16), got '{item}'")
        try:
            overrides[key] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {key}: '{value}' is not a valid YAML value ({error})") from None
    return overrides


# Keys added after runs were saved, whose default is not what those runs did: a saved config (checkpoint, model file,
# experiment record) without the key gets this value, so that an old model behaves as it was trained.
SAVED_DEFAULTS = {
    "transformer.query_position": False,
    "transformer.positional_values": True,
    "transformer.memory_gradients": False,
    "transformer.output_norm": False,
    "transformer.recency_bias": False,
    "transformer.learned_slopes": False,
    "transformer.max_learning_rate": 0.0,
    "transformer.warmup_updates": 0,
}


def with_saved_defaults(saved: dict) -> dict:
    """A copy of a saved config with each ``SAVED_DEFAULTS`` key it lacks set to the value its run used, and a renamed
    key under its new name (``eval_video``, a video at every evaluation or none, as ``video_interval`` 1 or 0)."""
    saved = copy.deepcopy(saved)
    if isinstance(saved, dict) and "eval_video" in saved:
        saved.setdefault("video_interval", int(bool(saved.pop("eval_video"))))
    for key, value in SAVED_DEFAULTS.items():
        section, leaf = key.split(".")
        if isinstance(saved.get(section), dict):
            saved[section].setdefault(leaf, value)
    return saved


def resumable(saved: dict) -> dict:
    """A saved config (a checkpoint's) as a config file would say it, so that ``--set`` overrides on resume act as they
    would on a new run: ``with_saved_defaults``, and the keys that validation derives from others put back to what
    derives them. ``adam_epsilon_schedule`` is saved with ``initial`` filled in from ``adam_epsilon`` (a constant
    schedule where the config had none): left so, ``--set adam_epsilon=X`` would be refused as differing from it,
    or, with ``initial`` set too, the saved ``final`` would put epsilon back to the old value after update 0."""
    saved = with_saved_defaults(saved)
    schedule = saved.get("adam_epsilon_schedule")
    if isinstance(schedule, dict) and "initial" in schedule:
        constant = schedule["initial"] == schedule.get("final")
        saved["adam_epsilon_schedule"] = {} if constant else {k: v for k, v in schedule.items() if k != "initial"}
    return saved


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as {"dotted.key": value}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def apply_overrides(raw: dict, overrides: dict[str, Any]) -> dict:
    """A copy of ``raw`` with each dotted key of ``overrides`` set, e.g. "transformer.memory_length" sets one key of
    the transformer section and keeps the others, while "environment" replaces the whole section."""
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        node = raw
        *parents, leaf = key.split(".")
        for parent in parents:
            if not isinstance(node.setdefault(parent, {}), dict):
                raise ConfigError(f"--set {key}: '{parent}' is not a section of the config")
            node = node[parent]
        node[leaf] = value
    return raw


def read_yaml(path: str, what: str, hint: str = "") -> Any:
    """The content of the YAML file ``path``; ConfigError naming it as ``what`` ("config file", "search file", ...)
    where it is missing (followed by ``hint``) or not valid YAML."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what} '{path}' does not exist{hint}")
    with open(path) as file:
        try:
            return yaml.safe_load(file)
        except yaml.YAMLError as error:
            raise ConfigError(f"{what} '{path}' is not valid YAML: {error}") from None


def load_config(path: str, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config file, apply ``overrides`` ({dotted key: value}), validate it and return a ``Config``."""
    raw = read_yaml(path, "config file", ": pass an existing YAML file, e.g. configs/poc_memory_env.yaml")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values, got {type(raw).__name__}")
    return validate_config(apply_overrides(raw, overrides or {}))
