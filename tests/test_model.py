"""Model output shapes for every option combination, and the empty-memory step."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import random_rollout_buffer, small_config

import encoders
from config import with_saved_defaults
from memories.trxl import TrXLContext, ring_mask
from model import ActorCriticModel, PolicyOutput
from ppo import forward_minibatch
from transformer import LEARNED_POSITIONS, alibi_slopes, rotary_angles, rotate, sinusoidal_encoding

OPTIONS = list(itertools.product(["", "relative", "learned"], ["", "pre", "post"], [False, True]))
# The distance-only encodings with each layer norm and both joins, not the whole product: they share everything else;
# and ALiBi's bias on top of a token encoding and of rotary ("+bias": recency_bias).
OPTIONS += [(encoding, "pre", False) for encoding in ("rotary", "alibi")] + [
    (encoding, layer_norm, True) for encoding in ("rotary", "alibi") for layer_norm in ("", "post")
]
OPTIONS += [("relative+bias", "pre", False), ("learned+bias", "post", True), ("rotary+bias", "", True)]
OPTIONS += [("relative+norm", "pre", False)]  # a LayerNorm on the output: output_norm
OPTIONS += [("relative+bias+slopes", "post", True)]  # the slopes learned: learned_slopes


def window_output(
    model: ActorCriticModel, obs: torch.Tensor, memory: torch.Tensor, steps: torch.Tensor, visible: torch.Tensor
) -> PolicyOutput:
    """Policy and value of observations (B, *obs_shape) with their memory windows (B, L, K, D), on the plain path."""
    features = model.encoder(obs.unsqueeze(1))[:, 0]
    query_steps = steps.max(dim=1).values + 1  # (B,) the step after the window's newest slot
    out = model.memory.forward_windows(features, memory, steps, visible, return_attention=True, query_steps=query_steps)
    return PolicyOutput(model.policy(out.features), model.value(out.features), out.record, out.attention)


def transformer_options(positional_encoding: str, layer_norm: str, gtrxl: bool) -> dict:
    encoding, *extras = positional_encoding.split("+")  # "relative+bias": with recency_bias; "+norm": output_norm
    options = {"positional_encoding": encoding, "recency_bias": "bias" in extras, "output_norm": "norm" in extras}
    options["learned_slopes"] = "slopes" in extras
    return {**options, "layer_norm": layer_norm, "gtrxl": gtrxl, "gtrxl_bias": 1.0}


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
@pytest.mark.parametrize("obs_shape,action_dims", [((5,), [3]), ((3, 84, 84), [2, 3, 4])])
def test_output_shapes(positional_encoding: str, layer_norm: str, gtrxl: bool, obs_shape: tuple, action_dims: list) -> None:
    config = small_config(transformer_options(positional_encoding, layer_norm, gtrxl))
    model = ActorCriticModel(config, obs_shape, action_dims)
    b, q, length, k, d = 3, 2, config.transformer.memory_length, 2, 16
    s = q + length - 1
    memory = torch.randn(b, s, k, d)
    steps = torch.arange(s).expand(b, s)
    mask = torch.rand(b, q, s) < 0.5
    context = TrXLContext(memory, steps, mask, model.memory.layout.chunk_windows(mask[:, 0]), query_steps=steps[:, -q:])
    out = model(torch.rand(b, q, *obs_shape), context)
    assert [tuple(x.shape) for x in out.policy.logits] == [(b, q, n) for n in action_dims]
    assert out.value.shape == (b, q)
    assert out.record.shape == (b, q, k, d)  # the memory tokens of these steps
    actions = out.policy.sample()
    assert actions.shape == (b, q, len(action_dims)) and out.policy.log_prob(actions).shape == (b, q)
    assert out.policy.entropy().shape == (b, q)
    state = model.memory.start(b, torch.device("cpu"))
    step = model.step(torch.rand(b, *obs_shape), state, return_attention=True)
    assert step.value.shape == (b,) and step.record.tokens.shape == (b, k, d)
    assert [tuple(w.shape) for w in step.attention] == [(b, 2, 1, 1)] * k  # one ring slot passed on at step 0
    window = model.memory.forward_windows(
        torch.rand(b, d), memory[:, :length], steps[:, :length], mask[:, 0, :length], query_steps=steps[:, length]
    )
    assert window.features.shape == (b, d) and window.record.shape == (b, k, d)


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_empty_memory_ignores_padding(positional_encoding: str, layer_norm: str, gtrxl: bool) -> None:
    torch.manual_seed(0)
    config = small_config(transformer_options(positional_encoding, layer_norm, gtrxl))
    model = ActorCriticModel(config, (5,), [3])
    length = config.transformer.memory_length
    obs = torch.rand(4, 5)
    visible = ring_mask(torch.zeros(4, dtype=torch.long), length)  # episode step 0: nothing visible
    assert not visible.any()
    outputs = []
    for padding in (torch.zeros(4, length, 2, 16), torch.randn(4, length, 2, 16) * 100, torch.full((4, length, 2, 16), 1e6)):
        steps = torch.randint(0, 50, (4, length))
        out = window_output(model, obs, padding, steps, visible)
        assert torch.isfinite(out.value).all() and all(torch.isfinite(x).all() for x in out.policy.logits)
        assert all((w == 0).all() for w in out.attention)
        outputs.append(out)
    for out in outputs[1:]:
        assert torch.equal(out.value, outputs[0].value)
        assert all(torch.equal(a, b) for a, b in zip(out.policy.logits, outputs[0].policy.logits, strict=True))


def test_empty_memory_has_finite_zero_gradients_through_attention() -> None:
    config = small_config(transformer_options("", "pre", False))
    model = ActorCriticModel(config, (5,), [3])
    memory = torch.randn(2, 4, 2, 16)
    steps, visible = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool)
    out = window_output(model, torch.rand(2, 5), memory, steps, visible)
    out.value.sum().backward()
    for block in model.memory.transformer.blocks:
        grad = block.attention.key_value.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and (grad == 0).all()


def test_memory_changes_the_output_when_visible() -> None:
    # The memory must matter: the same observation with different visible memory gives a different value.
    torch.manual_seed(1)
    model = ActorCriticModel(small_config(), (5,), [3])
    obs, steps, visible = torch.rand(1, 5), torch.arange(4).unsqueeze(0), torch.ones(1, 4, dtype=torch.bool)
    a = window_output(model, obs, torch.randn(1, 4, 2, 16), steps, visible).value
    b = window_output(model, obs, torch.randn(1, 4, 2, 16), steps, visible).value
    assert not torch.allclose(a, b)


def test_learned_positions_beyond_the_table_use_the_sinusoid() -> None:
    torch.manual_seed(0)
    model = ActorCriticModel(small_config(transformer_options("learned", "pre", False)), (5,), [3])
    transformer = model.memory.transformer
    steps = torch.tensor([[0, LEARNED_POSITIONS - 1, LEARNED_POSITIONS, LEARNED_POSITIONS + 1, 10_000]])
    encoding = transformer.position_encoding(steps)  # (1, 5, K, D)
    assert torch.equal(
        encoding[0, :2], transformer.learned_positions[[0, LEARNED_POSITIONS - 1]].unsqueeze(1).expand(-1, 2, -1)
    )
    beyond = sinusoidal_encoding(steps[0, 2:], 16).unsqueeze(1).expand(-1, 2, -1)  # the same for both blocks
    assert torch.equal(encoding[0, 2:], beyond)
    assert not torch.equal(encoding[0, 2], encoding[0, 3])  # later steps stay apart instead of sharing the last row


def test_agent_is_initialised_as_the_reference() -> None:
    torch.manual_seed(0)
    model = ActorCriticModel(small_config(transformer_options("", "pre", True)), (5,), [7])
    branch = model.policy.branches[0].weight  # (7, hidden): orthogonal rows of norm sqrt(0.01)
    torch.testing.assert_close(branch @ branch.T, torch.eye(7) * 0.01, atol=1e-6, rtol=0)
    transformer = model.memory.transformer
    embedding = transformer.embedding.weight  # the reference's second input layer, orthogonal with gain sqrt(2)
    torch.testing.assert_close(embedding @ embedding.T, torch.eye(16) * 2, atol=1e-5, rtol=0)
    gate = transformer.blocks[0].gates[0]
    assert isinstance(gate.bias, torch.nn.Parameter) and torch.equal(gate.bias.detach(), torch.full((16,), 1.0))
    bound = (6 / (16 + 16)) ** 0.5  # Xavier-uniform of each D x D matrix, not of the fused (3D, D) one
    for weight in (gate.w.weight, gate.u_rz.weight, gate.u_g.weight):
        for block in weight.split(16):
            assert block.abs().max() <= bound and block.abs().max() > 0.8 * bound
    x = torch.randn(4, 16)
    model.zero_grad()
    gate(x, torch.randn(4, 16)).sum().backward()
    assert gate.bias.grad is not None and gate.bias.grad.abs().sum() > 0  # the gate bias is learned


@pytest.mark.parametrize("positional_encoding", ["", "relative", "rotary", "alibi"])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_memory_length_one_reaches_back_one_step_per_block(positional_encoding: str, blocks: int) -> None:
    # As in Transformer-XL, block i's memory holds block i's inputs, which saw the step before them: with L = 1 a
    # step's output depends on exactly the K steps before it (K blocks), and on nothing earlier.
    transformer = {
        "memory_length": 1,
        "positional_encoding": positional_encoding,
        "query_position": True,
        "num_blocks": blocks,
    }
    torch.manual_seed(0)
    model = ActorCriticModel(small_config(transformer), (3,), [3])
    steps = 5
    base = torch.rand(steps, 1, 3, generator=torch.Generator().manual_seed(1))

    def last_value(observations: torch.Tensor) -> torch.Tensor:
        state = model.memory.start(1, torch.device("cpu"))
        with torch.no_grad():
            for t in range(steps):
                _, out, _ = model.act(observations[t], state, lambda policy: policy.sample())
        return out.value

    for back in range(1, steps):
        changed = base.clone()
        changed[steps - 1 - back] += 1.0
        same = torch.allclose(last_value(changed), last_value(base))
        assert same == (back > blocks), f"a change {back} steps back, {blocks} blocks"


def test_recency_bias_is_the_default_changes_relative_and_is_alibi_alone_with_alibi() -> None:
    assert (
        small_config().transformer.recency_bias and not with_saved_defaults({"transformer": {}})["transformer"]["recency_bias"]
    )  # models saved before it was the default load without it
    torch.manual_seed(0)
    options = {"positional_encoding": "relative", "num_heads": 2}
    plain = ActorCriticModel(small_config({**options, "recency_bias": False}), (3,), [3])
    biased = ActorCriticModel(small_config(options), (3,), [3])
    biased.load_state_dict(plain.state_dict())  # the bias has no parameters
    memory, steps, visible = torch.rand(2, 4, 2, 16), torch.arange(3, 7).expand(2, 4), torch.ones(2, 4, dtype=torch.bool)
    outputs = [
        model.memory.forward_windows(torch.ones(2, 16), memory, steps, visible, query_steps=torch.full((2,), 7)).features
        for model in (plain, biased)
    ]
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-4)
    alibi = [small_config({"positional_encoding": "alibi", "recency_bias": flag}) for flag in (False, True)]
    models = [ActorCriticModel(config, (3,), [3]) for config in alibi]
    models[1].load_state_dict(models[0].state_dict())
    outputs = [
        model.memory.forward_windows(torch.ones(2, 16), memory, steps, visible, query_steps=torch.full((2,), 7)).features
        for model in models
    ]
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("positional_encoding", ["rotary", "alibi"])
def test_distance_encodings_see_how_long_ago_not_when(positional_encoding: str) -> None:
    # Rotary and ALiBi attention depend on the distance between the query's and each memory token's episode steps:
    # the same window 400 steps later in an episode gives the same output; the same tokens in another order do not.
    torch.manual_seed(0)
    config = small_config({"positional_encoding": positional_encoding, "num_heads": 2, "memory_length": 4})
    model = ActorCriticModel(config, (3,), [3])
    h = torch.rand(2, 16)
    memory = torch.rand(2, 4, 2, 16)
    steps = torch.arange(3, 7).expand(2, 4)  # (2, 4): steps 3..6, the query at step 7
    visible = torch.ones(2, 4, dtype=torch.bool)
    with torch.no_grad():
        early = model.memory.forward_windows(h, memory, steps, visible, query_steps=torch.full((2,), 7)).features
        late = model.memory.forward_windows(h, memory, steps + 400, visible, query_steps=torch.full((2,), 407)).features
        reordered = model.memory.forward_windows(h, memory, steps.flip(1), visible, query_steps=torch.full((2,), 7)).features
    torch.testing.assert_close(late, early, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(reordered, early, atol=1e-3)


def test_alibi_slopes_are_the_papers_geometric_sequence() -> None:
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2**-8]))


def test_rotary_keeps_the_norm_and_turns_by_the_distance() -> None:
    x, y = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    turned = rotate(x, rotary_angles(torch.tensor([[5]]), 8))
    torch.testing.assert_close(turned.norm(), x.norm())
    dot = (rotate(x, rotary_angles(torch.tensor([[9]]), 8)) * rotate(y, rotary_angles(torch.tensor([[4]]), 8))).sum()
    torch.testing.assert_close(dot, (turned * y).sum())  # steps 9 and 4 as steps 5 and 0


def test_query_position_without_query_steps_is_a_clear_error() -> None:
    model = ActorCriticModel(small_config({"positional_encoding": "relative", "query_position": True}), (3,), [3])
    memory, steps, visible = torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="query_steps"):
        model.memory.forward_windows(torch.rand(2, 16), memory, steps, visible)


@pytest.mark.parametrize("memory", ["trxl", "gru"])
def test_value_trains_memory_false_keeps_the_value_gradient_out_of_the_shared_layers(memory: str) -> None:
    values = {}
    for value_trains_memory in (True, False):
        config = small_config(memory=memory, value_trains_memory=value_trains_memory)
        torch.manual_seed(0)
        model = ActorCriticModel(config, (4,), [3])
        buffer = random_rollout_buffer(model, (4,), config.n_workers, config.worker_steps)
        minibatch = next(buffer.minibatches(1, config.worker_steps, torch.Generator().manual_seed(0)))
        out = forward_minibatch(model, minibatch)
        values[value_trains_memory] = out.value.detach()
        out.value.sum().backward()
        shared = [p.grad for p in [*model.encoder.parameters(), *model.memory.parameters()] if p.requires_grad]
        reaches_shared = any(g is not None and g.abs().sum() > 0 for g in shared)
        assert reaches_shared == value_trains_memory
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.value.parameters())
        model.zero_grad()
        out = forward_minibatch(model, minibatch)
        out.policy.log_prob(torch.zeros_like(out.value, dtype=torch.long).unsqueeze(-1)).sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.memory.parameters())
    # the option changes where gradients flow, not what the model computes
    torch.testing.assert_close(values[True], values[False])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_image_encoder_in_chunks_computes_what_it_does_at_once(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """A minibatch of more images than ``IMAGE_CHUNK`` goes through the convolutions a chunk at a time (to bound the
    float copy of the images): the same features and gradients as in one piece, in float32 and under autocast."""
    torch.manual_seed(0)
    encoder = encoders.ImageEncoder((3, 36, 36), 16)
    levels = torch.randint(0, 256, (2, 5, 3, 36, 36), dtype=torch.uint8)
    results = []
    for chunk in (10, 3):  # one piece; chunks of 3, 3, 3 and 1
        monkeypatch.setattr(encoders, "IMAGE_CHUNK", chunk)
        encoder.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = encoder(levels)
        out.float().square().mean().backward()
        results.append([out.float()] + [p.grad.clone() for p in encoder.parameters()])
    for chunked, whole in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(chunked, whole, atol=0.01 * whole.abs().max().item(), rtol=0)
