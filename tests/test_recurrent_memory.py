"""GRU, LSTM and no memory: training reproduces the rollout, state resets at episode ends, shapes, and the config.

Random observations and episode ends cover episode starts inside chunks, at chunk starts and across rollout
boundaries (three rollouts with the state carried on).
"""

from __future__ import annotations

import pytest
import torch
from conftest import collect_random_rollout, small_config

from buffer import Buffer
from config import ConfigError
from memories.recurrent import NoMemory, RecurrentMemory
from model import ActorCriticModel
from ppo import forward_minibatch

N, T, OBS = 3, 12, 4
KINDS = ["gru", "lstm", "none"]


def make_model(memory: str, layers: int = 1, memory_dtype: str = "float32", obs_shape: tuple = (OBS,),
               action_dims: list | None = None) -> ActorCriticModel:  # fmt: skip
    torch.manual_seed(0)
    config = small_config(
        memory=memory, recurrence={"hidden_state_size": 8, "num_layers": layers}, n_workers=N, worker_steps=T,
        sequence_length=4, n_mini_batch=3, memory_dtype=memory_dtype,
    )  # fmt: skip
    return ActorCriticModel(config, obs_shape, action_dims or [3, 2])


def rollouts(model: ActorCriticModel, n_rollouts: int = 3, seed: int = 0, end_rate: float = 0.15) -> Buffer:
    """Three rollouts (the memory carried over their boundaries) of random observations and episode ends."""
    cpu = torch.device("cpu")
    buffer = Buffer(N, T, (OBS,), torch.float32, 2, model.memory.trace(N, T, cpu), cpu)
    collect_random_rollout(model, buffer, (OBS,), seed, end_rate, n_rollouts)
    return buffer


@pytest.mark.parametrize("memory", KINDS)
@pytest.mark.parametrize("sampling", ["chunks", "steps"])
@pytest.mark.parametrize("layers", [1, 2])
def test_training_reproduces_the_rollout(memory: str, sampling: str, layers: int) -> None:
    model = make_model(memory, layers)
    buffer = rollouts(model)
    assert buffer.trace is not None
    if memory != "none":
        starts = buffer.trace.starts.view(N, T // 4, 4)  # chunks of 4
        assert starts[..., 1:].any() and starts[..., 0].any(), "episode starts inside chunks and at chunk starts"
    generator = torch.Generator().manual_seed(1)
    seen = 0
    for minibatch in buffer.minibatches(3, 4, generator, sampling):
        out = forward_minibatch(model, minibatch)
        valid = torch.ones_like(minibatch.log_probs, dtype=torch.bool) if minibatch.valid is None else minibatch.valid
        log_probs = out.policy.log_prob(minibatch.actions)
        torch.testing.assert_close(log_probs[valid], minibatch.log_probs[valid], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.value[valid], minibatch.values[valid], rtol=1e-5, atol=1e-5)
        seen += int(valid.sum())
    assert seen == N * T


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_bfloat16_state_rollout_matches_training(memory: str) -> None:
    model = make_model(memory, memory_dtype="bfloat16")
    buffer = rollouts(model)
    assert buffer.trace.states.dtype == torch.bfloat16
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(1)):
        out = forward_minibatch(model, minibatch)
        torch.testing.assert_close(out.value, minibatch.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_state_is_zero_at_episode_starts_and_carries_otherwise(memory: str) -> None:
    model = make_model(memory)
    buffer = rollouts(model, n_rollouts=2)
    states, starts = buffer.trace.states, buffer.trace.starts
    assert torch.all(states[starts] == 0), "every episode starts from a zero state"
    assert torch.all(states[~starts].abs().sum(dim=(-1, -2)) > 0), "within an episode the state carries on"


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_memory_changes_later_outputs_and_gradients_reach_earlier_steps_of_the_chunk(memory: str) -> None:
    model = make_model(memory)
    buffer = rollouts(model, end_rate=0.0)
    minibatch = next(buffer.minibatches(3, 4, torch.Generator().manual_seed(1)))
    obs = minibatch.obs.clone().requires_grad_(True)
    out = forward_minibatch(model, minibatch._replace(obs=obs))
    out.value[:, -1].sum().backward()
    assert obs.grad[:, 0].abs().sum() > 0, "the last step's value depends on the chunk's first observation"
    grads = [p.grad for p in model.memory.recurrent.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("memory", KINDS)
@pytest.mark.parametrize("obs_shape,action_dims", [((5,), [3]), ((3, 84, 84), [2, 3, 4])])
def test_output_shapes(memory: str, obs_shape: tuple, action_dims: list) -> None:
    model = make_model(memory, obs_shape=obs_shape, action_dims=action_dims)
    state = model.memory.start(2, torch.device("cpu"))
    obs = model.prepare(torch.rand(2, *obs_shape).numpy())
    out = model.step(obs, state)
    assert out.value.shape == (2,)
    assert [tuple(logits.shape) for logits in out.policy.logits] == [(2, n) for n in action_dims]
    assert out.policy.sample().shape == (2, len(action_dims))


def test_models_are_what_the_reference_sister_repository_builds() -> None:
    gru = make_model("gru", obs_shape=(3, 84, 84))
    assert isinstance(gru.memory, RecurrentMemory)
    assert gru.encoder.embedding is None and gru.memory.recurrent.input_size == 64 * 7 * 7  # raw conv features
    assert all(torch.all(b == 0) for name, b in gru.memory.recurrent.named_parameters() if name.startswith("bias"))
    none = make_model("none")
    assert isinstance(none.memory, NoMemory) and none.encoder.output_dim == 16  # hidden_layer_size
    lstm = make_model("lstm")
    assert lstm.memory.start(2, torch.device("cpu")).hidden.shape == (2, 1, 16)  # hidden and cell state


def test_state_dict_round_trip() -> None:
    model = make_model("lstm")
    state = model.memory.start(N, torch.device("cpu"))
    model.act(torch.rand(N, OBS), state, lambda policy: policy.sample())
    state.end_episodes(torch.tensor([True, False, False]))
    copy = model.memory.start(N, torch.device("cpu"))
    copy.load_state_dict(state.state_dict())
    assert torch.equal(copy.hidden, state.hidden) and torch.equal(copy.fresh, state.fresh)
    assert copy.fresh.tolist() == [True, False, False]


@pytest.mark.parametrize(
    "overrides,words",
    [
        ({"memory": "rnn"}, ["memory", "rnn", "gru"]),
        ({"recurrence": {"hidden_state_size": 0}}, ["recurrence.hidden_state_size", "0"]),
        ({"recurrence": {"layers": 2}}, ["recurrence.layers", "num_layers"]),
    ],
)
def test_bad_memory_config_is_named(overrides: dict, words: list) -> None:
    with pytest.raises(ConfigError) as error:
        small_config(**overrides)
    for word in words:
        assert word in str(error.value)


def test_transformer_checks_only_apply_to_the_transformer_memory() -> None:
    with pytest.raises(ConfigError, match="memory_length"):
        small_config({"memory_length": 64})  # the PoC episode has 32 steps at most
    assert small_config({"memory_length": 64}, memory="gru").memory == "gru"


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_single_step_minibatches_are_refused(memory: str) -> None:
    with pytest.raises(ConfigError) as error:
        small_config(memory=memory, minibatch_sampling="steps")
    for words in ("minibatch_sampling", memory, "chunks"):
        assert words in str(error.value)
