"""The fast memory path equals the plain per-window specification.

Rollout: the K/V-cached ring (fast) and the re-projected ring (plain) give the same logits, values and tokens, and
both equal what the trace windows give. Training: the banded chunk attention (fast) and per-window projection (plain)
give the same logits, values, tokens and gradients, and reproduce the rollout's values and log-probabilities.
Random observations and episode ends cover episode ends inside rollouts, rollout boundaries and empty memories.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import small_config

from buffer import Buffer
from memory import RolloutMemory
from model import ActorCriticModel, distributions, log_prob, sample_actions
from trainer import forward_minibatch

OPTIONS = list(itertools.product(["", "relative", "learned"], ["", "pre", "post"], [False, True]))
N, T, L, OBS = 3, 12, 5, 4


def make_model(positional_encoding: str, layer_norm: str, gtrxl: bool) -> ActorCriticModel:
    torch.manual_seed(0)
    options = {"positional_encoding": positional_encoding, "layer_norm": layer_norm, "gtrxl": gtrxl, "gtrxl_bias": 1.0}
    config = small_config({**options, "memory_length": L}, n_workers=N, worker_steps=T, sequence_length=4, n_mini_batch=3)
    return ActorCriticModel(config, (OBS,), [3, 2])


@torch.no_grad()
def rollouts(
    model: ActorCriticModel, cache_kv: bool, n_rollouts: int = 3, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[Buffer, list[torch.Tensor]]:
    """Drive the buffer and the rollout memory as the trainer does, with random observations and episode ends."""
    generator = torch.Generator().manual_seed(seed)
    buffer = Buffer(N, T, L, 2, 16, (OBS,), 2, dtype, torch.device("cpu"))
    memory = RolloutMemory(N, L, 2, 16, dtype, torch.device("cpu"), cache_kv=cache_kv)
    outputs = []
    for _ in range(n_rollouts):
        buffer.start_rollout()
        memory.refresh(model)
        for t in range(T):
            obs = torch.rand(N, OBS, generator=generator)
            keys_values, mask = memory.inputs(model)
            out = model(obs.unsqueeze(1), keys_values, mask)
            actions, log_probs = sample_actions([x[:, 0] for x in out.logits])
            buffer.record_step(
                t, obs, actions, log_probs, out.value[:, 0], out.tokens[:, 0], memory.episode_steps, memory.episode_ids
            )
            outputs.append(torch.cat([x[:, 0] for x in out.logits] + [out.value, out.tokens[:, 0].flatten(1)], dim=1))
            memory.append(model, out.tokens[:, 0])
            memory.end_episodes(torch.rand(N, generator=generator) < 0.15)
        buffer.advantages.normal_(generator=generator)
        buffer.returns.normal_(generator=generator)
    return buffer, outputs


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_rollout_cache_equals_plain_and_trace_windows(positional_encoding: str, layer_norm: str, gtrxl: bool) -> None:
    model = make_model(positional_encoding, layer_norm, gtrxl)
    torch.manual_seed(1)
    fast_buffer, fast = rollouts(model, cache_kv=True)
    torch.manual_seed(1)
    plain_buffer, plain = rollouts(model, cache_kv=False)
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast_buffer.trace_episodes, plain_buffer.trace_episodes)
    # The last rollout's windows cut from the trace give what the rollout computed.
    memory, steps, episodes = fast_buffer.windows()  # (N, T + 1, K, D, L), (N, T + 1, L)
    query_episodes = fast_buffer.trace_episodes[:, L:]
    with torch.no_grad():
        for t in range(T):
            visible = episodes[:, t] == query_episodes[:, t : t + 1]
            out = model.forward_windows(fast_buffer.obs[:, t], memory[:, t].permute(0, 3, 1, 2), steps[:, t], visible)
            torch.testing.assert_close(out.value[:, 0], fast_buffer.values[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_training_fast_path_equals_plain(positional_encoding: str, layer_norm: str, gtrxl: bool) -> None:
    model = make_model(positional_encoding, layer_norm, gtrxl)
    buffer, _ = rollouts(model, cache_kv=True)
    assert (buffer.trace_steps[:, L:] == 0).any(), "the data must contain empty-memory steps"
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        results = {}
        for path in ("fast", "plain"):
            model.zero_grad()
            out = forward_minibatch(model, minibatch, L, path)
            log_probs = log_prob(distributions(out.logits), minibatch.actions)
            (out.value.square().sum() + log_probs.sum()).backward()
            grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
            results[path] = (out, log_probs, grads)
        (fast, fast_lp, fast_grads), (plain, plain_lp, plain_grads) = results["fast"], results["plain"]
        for a, b in zip(fast.logits, plain.logits, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.value, plain.value, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast_lp, plain_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.tokens, plain.tokens, rtol=1e-5, atol=1e-5)
        assert fast_grads.keys() == plain_grads.keys()
        for name in fast_grads:
            torch.testing.assert_close(fast_grads[name], plain_grads[name], rtol=1e-4, atol=1e-5, msg=name)
        # Same weights as in the rollout: training recomputes exactly what the rollout saw.
        torch.testing.assert_close(fast.value.detach(), minibatch.values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast_lp.detach(), minibatch.log_probs, rtol=1e-5, atol=1e-5)


def test_bfloat16_memory_rollout_matches_training() -> None:
    model = make_model("relative", "pre", True)
    buffer, _ = rollouts(model, cache_kv=True, n_rollouts=2, dtype=torch.bfloat16)
    assert buffer.trace.dtype == torch.bfloat16
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(0)):
        with torch.no_grad():
            out = forward_minibatch(model, minibatch, L, "fast")
        torch.testing.assert_close(out.value, minibatch.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional_encoding,layer_norm,gtrxl", OPTIONS)
def test_memory_gradients_same_outputs_and_gradients_reach_earlier_steps(
    positional_encoding: str, layer_norm: str, gtrxl: bool
) -> None:
    model = make_model(positional_encoding, layer_norm, gtrxl)
    buffer, _ = rollouts(model, cache_kv=True)
    c = 4
    for minibatch in buffer.minibatches(3, c, torch.Generator().manual_seed(0)):
        grads = {}
        for memory_gradients in (False, True):
            obs = minibatch.obs.clone().requires_grad_()
            out = forward_minibatch(model, minibatch._replace(obs=obs), L, "fast", memory_gradients)
            out.value[:, -1].sum().backward()  # the loss of each chunk's last step only
            grads[memory_gradients] = obs.grad
            # With the rollout's weights the recomputed in-chunk tokens are the rollout's: same outputs.
            torch.testing.assert_close(out.value.detach(), minibatch.values, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                log_prob(distributions(out.logits), minibatch.actions).detach(), minibatch.log_probs, rtol=1e-5, atol=1e-5
            )
        # Without memory gradients only the last step's own observation gets a gradient; with them, exactly the
        # earlier steps of the chunk that the last step sees (same episode) get one too.
        assert (grads[False][:, :-1] == 0).all()
        visible = minibatch.mask[:, -1, L : L + c - 1]  # (B, C - 1): does the last step see chunk step j?
        reached = grads[True][:, :-1].abs().sum(-1) > 0
        assert torch.equal(reached, visible)
        assert visible.any(), "the data must have chunks whose last step sees earlier steps"
        torch.testing.assert_close(grads[True][:, -1], grads[False][:, -1], rtol=1e-5, atol=1e-6)
