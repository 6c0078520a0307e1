"""Minibatches of single steps (``minibatch_sampling: steps``): composition, equivalence of the paths, the loss.

Each epoch shuffles all N * T steps and cuts them into n_mini_batch minibatches; a minibatch holds one row per worker
in it, padded to the longest row (``Minibatch.valid``). The fast path projects each row's whole trace once, the
plain path every step's window on its own; both must give what the rollout gave, and padding must not count.
"""

from __future__ import annotations

import pytest
import torch
from conftest import small_config
from test_equivalence import OPTIONS, L, N, T, compare_paths, make_model, rollouts

from buffer import Buffer, Minibatch
from config import ConfigError
from model import ActorCriticModel
from ppo import PPOLearner, forward_minibatch, ppo_loss

MINIBATCHES = 3  # M = N * T / 3 = 12 steps per minibatch


def step_minibatches(buffer: Buffer, seed: int = 0) -> list[Minibatch]:
    """One epoch of single-step minibatches."""
    return list(buffer.minibatches(MINIBATCHES, 0, torch.Generator().manual_seed(seed), "steps"))


def locate(buffer: Buffer, obs: torch.Tensor) -> tuple[int, int]:
    """(worker, rollout step) of a stored observation (OBS,): the random observations are unique."""
    matches = (buffer.obs == obs).all(-1).nonzero()
    assert len(matches) == 1
    return int(matches[0, 0]), int(matches[0, 1])


@pytest.mark.parametrize(
    "positional_encoding,layer_norm,gtrxl,query_position",
    [(*options, False) for options in OPTIONS] + [("relative", "pre", True, True), ("learned", "post", False, True)],
)
def test_fast_path_equals_plain_and_reproduces_the_rollout(
    positional_encoding: str, layer_norm: str, gtrxl: bool, query_position: bool
) -> None:
    models = {
        path: make_model(positional_encoding, layer_norm, gtrxl, path, query_position=query_position)
        for path in ("fast", "plain")
    }
    buffer, _ = rollouts(models["fast"])
    assert (buffer.trace.steps[:, L:] == 0).any(), "the data must contain episode starts inside the rollout"
    seen_carried = padded = False
    for minibatch in step_minibatches(buffer):
        valid = minibatch.valid
        padded |= bool((~valid).any())
        # A step of an episode that began in an earlier rollout sees slots carried in from before this one.
        seen_carried |= bool(minibatch.memory.mask[..., :L].any())
        fast, fast_lp, plain, plain_lp = compare_paths(models, minibatch, valid)
        # Same weights as in the rollout: every sampled step gets exactly what the rollout computed for it.
        for out, log_probs in ((fast, fast_lp), (plain, plain_lp)):
            torch.testing.assert_close(out.value.detach()[valid], minibatch.values[valid], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(log_probs.detach()[valid], minibatch.log_probs[valid], rtol=1e-5, atol=1e-5)
    assert seen_carried, "the data must contain steps that remember across the rollout boundary"
    assert padded, "the data must contain padded rows"


def test_every_step_appears_exactly_once_per_epoch() -> None:
    buffer, _ = rollouts(make_model("", "pre", False))
    epochs = [step_minibatches(buffer, seed) for seed in (0, 1)]
    for minibatches in epochs:
        assert len(minibatches) == MINIBATCHES
        seen = []
        for minibatch in minibatches:
            assert int(minibatch.valid.sum()) == N * T // MINIBATCHES
            for row, column in minibatch.valid.nonzero().tolist():
                worker, t = locate(buffer, minibatch.obs[row, column])
                seen.append((worker, t))
                # Every per-step field and the memory's query belong to that same step.
                assert int(minibatch.memory.starts[row, column]) == t
                for field in ("log_probs", "values", "advantages", "returns"):
                    assert getattr(minibatch, field)[row, column] == getattr(buffer, field)[worker, t], field
                assert torch.equal(minibatch.actions[row, column], buffer.actions[worker, t])
            # One row per worker present, and padding repeats a real step of its own row.
            for row in range(len(minibatch.valid)):
                workers = {locate(buffer, minibatch.obs[row, column])[0] for column in range(minibatch.valid.shape[1])}
                assert len(workers) == 1
        assert sorted(seen) == [(worker, t) for worker in range(N) for t in range(T)]
    # The steps are shuffled anew each epoch, across workers and times.
    first = [{locate(buffer, o)[1] for o in mb.obs[mb.valid]} for mb in (epochs[0][0], epochs[1][0])]
    assert first[0] != first[1]


def loss_of(model: ActorCriticModel, minibatch: Minibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of a minibatch and the gradients it gives."""
    model.zero_grad()
    loss, _ = ppo_loss(forward_minibatch(model, minibatch), minibatch, clip_range=0.1, beta=0.01, value_coefficient=0.5)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_padding_does_not_change_the_loss() -> None:
    model = make_model("relative", "pre", True)
    buffer, _ = rollouts(model)
    with torch.no_grad():  # away from the rollout's weights, so that ratios and value clipping matter
        generator = torch.Generator().manual_seed(3)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    minibatch = next(mb for mb in step_minibatches(buffer) if (~mb.valid).any())
    loss, grads = loss_of(model, minibatch)
    # The same steps alone: each valid step in a row of its own, nothing padded.
    rows, columns = minibatch.valid.nonzero(as_tuple=True)
    workers = torch.tensor([locate(buffer, minibatch.obs[r, c])[0] for r, c in zip(rows, columns, strict=True)])
    times = minibatch.memory.starts[rows, columns].unsqueeze(1)  # (M, 1)
    alone = Minibatch(
        *(x[rows, columns].unsqueeze(1) for x in minibatch[:6]),
        memory=buffer.trace.single_steps(workers, times),
        valid=torch.ones(len(rows), 1, dtype=torch.bool),
    )
    alone_loss, alone_grads = loss_of(model, alone)
    torch.testing.assert_close(loss, alone_loss, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], alone_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # Whatever the padding holds, the loss and its gradients stay the same.
    pad = ~minibatch.valid
    garbage = minibatch._replace(
        obs=torch.where(pad.unsqueeze(-1), torch.rand(minibatch.obs.shape), minibatch.obs),
        **{name: getattr(minibatch, name).masked_fill(pad, 1e3) for name in ("log_probs", "values", "advantages", "returns")},
    )
    garbage_loss, garbage_grads = loss_of(model, garbage)
    torch.testing.assert_close(loss, garbage_loss, rtol=1e-6, atol=1e-7)
    for name in grads:
        torch.testing.assert_close(grads[name], garbage_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_optimize_with_step_minibatches() -> None:
    model = make_model("", "pre", False)
    buffer, _ = rollouts(model)
    config = small_config(
        {"memory_length": L, "memory_gradients": False},
        n_workers=N,
        worker_steps=T,
        n_mini_batch=MINIBATCHES,
        minibatch_sampling="steps",
        epochs=2,
    )
    before = [p.detach().clone() for p in model.parameters()]
    stats = PPOLearner(model, config, torch.Generator().manual_seed(0)).optimize(buffer, 0)
    assert all(torch.isfinite(torch.tensor(value)) for value in stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_steps_config() -> None:
    assert small_config().minibatch_sampling == "chunks"
    # sequence_length is unused with single steps: a value that divides nothing is no error.
    steps = small_config({"memory_gradients": False}, minibatch_sampling="steps", sequence_length=3)
    assert steps.minibatch_sampling == "steps"
    with pytest.raises(ConfigError) as error:
        small_config({"memory_gradients": True}, minibatch_sampling="steps")
    for words in ("minibatch_sampling", "transformer.memory_gradients", "chunks", "false"):
        assert words in str(error.value)
    with pytest.raises(ConfigError, match="minibatch_sampling.*episodes"):
        small_config(minibatch_sampling="episodes")
