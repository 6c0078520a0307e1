"""The fast memory path equals the plain per-window specification.

Rollout: the K/V-cached ring (fast) and the re-projected ring (plain) give the same logits, values and tokens, and
both equal what the trace windows give. Training: the banded chunk attention (fast) and per-window projection (plain)
give the same logits, values, tokens and gradients, and reproduce the rollout's values and log-probabilities.
Rollouts are rollout.RolloutCollector's own, on random observations and episode ends (conftest.RandomWorkers), which
cover episode ends (time limits among them) inside rollouts, rollout boundaries and empty memories.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import collect_random_rollout, small_config

from buffer import Buffer, Minibatch
from model import ActorCriticModel, PolicyOutput
from ppo import forward_minibatch

OPTIONS = list(itertools.product(["", "relative", "learned"], ["", "pre", "post"], [False, True]))
# The distance-only encodings with each layer norm and both joins, not the whole product: they share everything else;
# and ALiBi's bias on top of a token encoding and of rotary ("+bias": recency_bias).
OPTIONS += [(encoding, "pre", False) for encoding in ("rotary", "alibi")] + [
    (encoding, layer_norm, True) for encoding in ("rotary", "alibi") for layer_norm in ("", "post")
]
OPTIONS += [("relative+bias", "pre", False), ("learned+bias", "post", True), ("rotary+bias", "", True)]
OPTIONS += [("relative+norm", "pre", False), ("alibi+norm", "post", True)]  # a LayerNorm on the output: output_norm
OPTIONS += [("relative+bias+slopes", "pre", False), ("alibi+slopes", "post", True)]  # the slopes learned: learned_slopes
N, T, L, OBS = 3, 12, 5, 4


def make_model(
    positional_encoding: str, layer_norm: str, gtrxl: bool, path: str = "fast", memory_dtype: str = "float32",
    memory_gradients: bool = False, query_position: bool = False, positional_values: bool = True,
) -> ActorCriticModel:  # fmt: skip
    """The same weights for every path and option that does not add parameters."""
    torch.manual_seed(0)
    encoding, *extras = positional_encoding.split("+")  # "relative+bias": with recency_bias; "+norm": output_norm
    options = {
        "positional_encoding": encoding,
        "recency_bias": "bias" in extras,
        "learned_slopes": "slopes" in extras,
        "output_norm": "norm" in extras,
        "layer_norm": layer_norm,
        "gtrxl": gtrxl,
    }
    options.update(gtrxl_bias=1.0, memory_length=L, memory_gradients=memory_gradients, query_position=query_position)
    options.update(positional_values=positional_values)
    config = small_config(options, n_workers=N, worker_steps=T, sequence_length=4, n_mini_batch=3, memory_dtype=memory_dtype)
    model = ActorCriticModel(config, (OBS,), [3, 2], path)
    if "slopes" in extras:  # learned slopes away from ALiBi's, one of them negative, so that a path keeping ALiBi's differs
        slopes = model.memory.transformer.alibi_slopes
        with torch.no_grad():
            slopes.copy_(torch.linspace(0.7, -0.2, slopes.numel()).view_as(slopes))
    return model


def rollouts(model: ActorCriticModel, n_rollouts: int = 3, seed: int = 1) -> tuple[Buffer, list[torch.Tensor]]:
    """``n_rollouts`` rollouts of rollout.RolloutCollector on random observations and episode ends (conftest), and
    what the model gave at each step it took: logits, value and the memory's token, side by side (N, ...)."""
    cpu = torch.device("cpu")
    buffer = Buffer(N, T, (OBS,), torch.float32, 2, model.memory.trace(N, T, cpu), cpu)
    outputs = []
    act = model.act

    def recording_act(*args: object, **kwargs: object) -> tuple:
        actions, out, weights = act(*args, **kwargs)
        outputs.append(torch.cat([*out.policy.logits, out.value.unsqueeze(1), out.record.tokens.flatten(1)], dim=1))
        return actions, out, weights

    model.act = recording_act  # the collector's own loop, observed
    try:
        collect_random_rollout(model, buffer, (OBS,), seed, n_rollouts=n_rollouts)
    finally:
        del model.act
    return buffer, outputs


def compare_paths(
    models: dict[str, ActorCriticModel], minibatch: Minibatch, valid: torch.Tensor | None = None
) -> tuple[PolicyOutput, torch.Tensor, PolicyOutput, torch.Tensor]:
    """Run the minibatch through the fast and the plain model (same weights) and assert that logits, values, tokens and
    gradients agree; the loss counts the ``valid`` (B, C) entries (all by default). Returns each path's output and
    log-probabilities."""
    results = {}
    for path, model in models.items():
        model.zero_grad()
        out = forward_minibatch(model, minibatch)
        log_probs = out.policy.log_prob(minibatch.actions)
        mask = torch.ones_like(log_probs, dtype=torch.bool) if valid is None else valid
        (out.value[mask].square().sum() + log_probs[mask].sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results[path] = (out, log_probs, grads)
    (fast, fast_lp, fast_grads), (plain, plain_lp, plain_grads) = results["fast"], results["plain"]
    for a, b in zip(fast.policy.logits, plain.policy.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.value, plain.value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_lp, plain_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.record, plain.record, rtol=1e-5, atol=1e-5)  # the tokens of the steps
    assert fast_grads.keys() == plain_grads.keys()
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], plain_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    return fast, fast_lp, plain, plain_lp


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_rollout_cache_equals_plain_and_trace_windows(positional_encoding: str, layer_norm: str, gtrxl: bool) -> None:
    model = make_model(positional_encoding, layer_norm, gtrxl)
    fast_buffer, fast = rollouts(model)
    plain_buffer, plain = rollouts(make_model(positional_encoding, layer_norm, gtrxl, "plain"))
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast_buffer.trace.episodes, plain_buffer.trace.episodes)
    # The last rollout's windows cut from the trace give what the rollout computed.
    memory, steps, episodes = fast_buffer.trace.windows()  # (N, T + 1, K, D, L), (N, T + 1, L)
    query_episodes = fast_buffer.trace.episodes[:, L:]
    with torch.no_grad():
        for t in range(T):
            visible = episodes[:, t] == query_episodes[:, t : t + 1]
            h = model.encoder(fast_buffer.obs[:, t].unsqueeze(1))[:, 0]
            query_steps = fast_buffer.trace.steps[:, L + t]  # (N,) each worker's own episode step
            window = memory[:, t].permute(0, 3, 1, 2)  # (N, L, K, D)
            out = model.memory.forward_windows(h, window, steps[:, t], visible, query_steps=query_steps)
            torch.testing.assert_close(model.value(out.features), fast_buffer.values[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_training_fast_path_equals_plain(positional_encoding: str, layer_norm: str, gtrxl: bool) -> None:
    models = {path: make_model(positional_encoding, layer_norm, gtrxl, path) for path in ("fast", "plain")}
    buffer, _ = rollouts(models["fast"])
    assert (buffer.trace.steps[:, L:] == 0).any(), "the data must contain empty-memory steps"
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        fast, fast_lp, plain, plain_lp = compare_paths(models, minibatch)
        # Same weights as in the rollout: training recomputes exactly what the rollout saw.
        torch.testing.assert_close(fast.value.detach(), minibatch.values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast_lp.detach(), minibatch.log_probs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("memory_gradients", [False, True])
def test_bfloat16_memory_rollout_matches_training(memory_gradients: bool) -> None:
    # With memory_gradients the chunk's own tokens are recomputed in float32; rounded as the rollout stored them, the
    # PPO ratios still start at exactly 1.
    model = make_model("relative", "pre", True, memory_dtype="bfloat16", memory_gradients=memory_gradients)
    buffer, _ = rollouts(model, n_rollouts=2)
    assert buffer.trace.trace.dtype == torch.bfloat16
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        with torch.no_grad():
            out = model(minibatch.obs, minibatch.memory)
        torch.testing.assert_close(out.value, minibatch.values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.policy.log_prob(minibatch.actions), minibatch.log_probs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_memory_gradients_same_outputs_and_gradients_reach_earlier_steps(
    positional_encoding: str, layer_norm: str, gtrxl: bool
) -> None:
    models = {flag: make_model(positional_encoding, layer_norm, gtrxl, memory_gradients=flag) for flag in (False, True)}
    buffer, _ = rollouts(models[False])
    c = 4
    for minibatch in buffer.minibatches(3, c, torch.Generator().manual_seed(0)):
        grads = {}
        for memory_gradients, model in models.items():
            obs = minibatch.obs.clone().requires_grad_()
            out = model(obs, minibatch.memory)
            out.value[:, -1].sum().backward()  # the loss of each chunk's last step only
            grads[memory_gradients] = obs.grad
            # With the rollout's weights the recomputed in-chunk tokens are the rollout's: same outputs.
            torch.testing.assert_close(out.value.detach(), minibatch.values, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                out.policy.log_prob(minibatch.actions).detach(), minibatch.log_probs, rtol=1e-5, atol=1e-5
            )
        # Without memory gradients only the last step's own observation gets a gradient; with them, exactly the
        # earlier steps of the chunk that the last step sees (same episode) get one too.
        assert (grads[False][:, :-1] == 0).all()
        visible = minibatch.memory.mask[:, -1, L : L + c - 1]  # (B, C - 1): does the last step see chunk step j?
        reached = grads[True][:, :-1].abs().sum(-1) > 0
        assert torch.equal(reached, visible)
        assert visible.any(), "the data must have chunks whose last step sees earlier steps"
        torch.testing.assert_close(grads[True][:, -1], grads[False][:, -1], rtol=1e-5, atol=1e-6)


def rollouts_and_training_agree(models: dict[str, ActorCriticModel]) -> list[torch.Tensor]:
    """Assert that the fast and the plain model (same weights) give the same rollouts, and that training on both paths
    agrees and reproduces the rollout; returns the fast rollout's per-step outputs."""
    buffer, fast = rollouts(models["fast"])
    _, plain = rollouts(models["plain"])
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        out, log_probs, _, _ = compare_paths(models, minibatch)
        torch.testing.assert_close(out.value.detach(), minibatch.values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(log_probs.detach(), minibatch.log_probs, rtol=1e-5, atol=1e-5)
    return fast


@pytest.mark.parametrize("positional_encoding,layer_norm", itertools.product(["relative", "learned"], ["", "pre", "post"]))
def test_query_position_paths_agree_and_change_the_output(positional_encoding: str, layer_norm: str) -> None:
    # The query's own step reaches the rollout's cached path, the plain windows and both training paths alike.
    models = {path: make_model(positional_encoding, layer_norm, True, path, query_position=True) for path in ("fast", "plain")}
    fast = rollouts_and_training_agree(models)
    # Same weights without the query's position: the same first steps (nothing visible), other values later.
    _, without = rollouts(make_model(positional_encoding, layer_norm, True))
    torch.testing.assert_close(fast[0], without[0])
    assert not torch.allclose(torch.stack(fast[1:]), torch.stack(without[1:]))


def test_query_position_with_memory_gradients_reproduces_the_rollout() -> None:
    model = make_model("relative", "pre", False, memory_gradients=True, query_position=True)
    buffer, _ = rollouts(model)
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        with torch.no_grad():
            out = model(minibatch.obs, minibatch.memory)
        torch.testing.assert_close(out.value, minibatch.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional_encoding,layer_norm", [("relative", "pre"), ("learned", "post"), ("relative", "")])
def test_positions_in_keys_only_paths_agree_and_change_the_output(positional_encoding: str, layer_norm: str) -> None:
    def model(path: str, positional_values: bool = False) -> ActorCriticModel:
        return make_model(
            positional_encoding, layer_norm, False, path, query_position=True, positional_values=positional_values
        )

    fast = rollouts_and_training_agree({path: model(path) for path in ("fast", "plain")})
    _, with_values = rollouts(model("fast", positional_values=True))
    assert not torch.allclose(torch.stack(fast[1:]), torch.stack(with_values[1:]))
