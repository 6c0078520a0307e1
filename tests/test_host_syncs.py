"""The TrXL rollout asks the device nothing but the actions (issue 53, item 7).

On a GPU every read of a tensor's value on the host (``int(t)``, ``bool(t)``, ``t.item()``, ``t.cpu()``, a boolean
mask index, ...) waits for the device to finish what was queued before it; one between the encoder and the
attention stalls every rollout step. The memory knows on the host what it needs (the episode steps, kept there as
the rollout ends episodes: ``TrXLState.host_steps``). On the CPU nothing waits, so the tests count the calls that
would: only the copy of the actions to the environments may remain.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import RandomWorkers, small_config

from buffer import Buffer
from model import ActorCriticModel
from rollout import RolloutCollector
from transformer import LEARNED_POSITIONS

# Tensor methods that hand a value to the host: on a GPU each waits for the device.
READS = ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__int__", "__float__", "__index__", "__array__")
N, T, OBS = 3, 10, 4


@contextlib.contextmanager
def counted_host_reads() -> Iterator[collections.Counter]:
    """Count, by (method, calling function), the host reads of tensors inside the block: the methods in ``READS``, and
    indexing or assigning with a boolean tensor mask (its size is read on the host first). Reads made inside another
    counted read are not counted again."""
    counts: collections.Counter = collections.Counter()
    inside = [False]

    def counting(name: str, original: object, when: object = None) -> object:
        def read(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            if inside[0] or (when is not None and not when(*args)):
                return original(self, *args, **kwargs)
            counts[name, sys._getframe(1).f_code.co_name] += 1
            inside[0] = True
            try:
                return original(self, *args, **kwargs)
            finally:
                inside[0] = False

        return read

    def masked(index: object, *_: object) -> bool:
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in parts)

    patched = {name: counting(name, getattr(torch.Tensor, name)) for name in READS}
    patched["__getitem__"] = counting("mask index", torch.Tensor.__getitem__, masked)
    patched["__setitem__"] = counting("mask assignment", torch.Tensor.__setitem__, masked)
    originals = {name: getattr(torch.Tensor, name) for name in patched}
    try:
        for name, method in patched.items():
            setattr(torch.Tensor, name, method)
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def make_collector(positional_encoding: str, path: str = "fast", truncate_share: float = 0.5) -> RolloutCollector:
    """A rollout collector of a small TrXL model (the query's position on, as by default) on random workers whose
    episodes end often, half of them by a time limit (so the bootstrap values of a few workers are asked for)."""
    torch.manual_seed(0)
    options = {"memory_length": 4, "query_position": True}
    if positional_encoding != "default":
        options["positional_encoding"] = positional_encoding
    model = ActorCriticModel(small_config(options, n_workers=N, worker_steps=T), (OBS,), [3, 2], path)
    cpu = torch.device("cpu")
    buffer = Buffer(N, T, (OBS,), torch.float32, 2, model.memory.trace(N, T, cpu), cpu)
    workers = RandomWorkers(N, (OBS,), seed=1, end_rate=0.2, truncate_share=truncate_share)
    collector = RolloutCollector(model, workers, buffer, 0.99, 0.95, cpu)
    collector.start(workers.reset())
    return collector


def test_the_counter_sees_the_reads_of_a_step() -> None:
    x = torch.arange(4)
    with counted_host_reads() as counts:
        int(x.max()), bool(x.any()), x[x > 1], x.cpu().numpy()
        x[torch.tensor([1, 2])]  # an index by positions reads nothing
    assert counts == {
        ("__int__", "test_the_counter_sees_the_reads_of_a_step"): 1,
        ("__bool__", "test_the_counter_sees_the_reads_of_a_step"): 1,
        ("mask index", "test_the_counter_sees_the_reads_of_a_step"): 1,
        ("cpu", "test_the_counter_sees_the_reads_of_a_step"): 1,
        ("numpy", "test_the_counter_sees_the_reads_of_a_step"): 1,
    }


@pytest.mark.parametrize(
    "positional_encoding,path", [("default", "fast"), ("learned", "fast"), ("learned", "plain"), ("alibi", "fast")]
)
def test_a_rollout_reads_nothing_but_the_actions(positional_encoding: str, path: str) -> None:
    collector = make_collector(positional_encoding, path)
    collector.collect()  # episodes of all lengths, ring wraps, ends by time limits
    with counted_host_reads() as counts:
        collector.collect()
    buffer = collector.buffer
    assert buffer.truncated.any() and buffer.terminated.any(), "the rollout must end episodes both ways"
    # rollout.py's collect copies each step's actions to the environments, and nothing else leaves the device.
    assert counts == {("cpu", "collect"): T, ("numpy", "collect"): T}


def test_host_steps_follow_the_device_steps() -> None:
    collector = make_collector("default")
    state = collector.state
    reached = 0
    for _ in range(3):
        collector.collect()
        assert np.array_equal(state.host_steps, state.episode_steps.numpy())
        reached = max(reached, int(collector.buffer.trace.steps.max()) + 1)
    assert (state.host_steps < reached).any(), "some episodes must have ended"
    assert state.largest_step == reached  # the largest step any worker has been at
    state.end_episodes(torch.tensor([True, False, True]))  # a tensor (evaluation, a resumed run) works too
    assert np.array_equal(state.host_steps, state.episode_steps.numpy()) and state.host_steps[0] == 0
    resumed = collector.model.memory.start(N, torch.device("cpu"))
    resumed.load_state_dict(state.state_dict())
    assert np.array_equal(resumed.host_steps, state.host_steps)
    assert resumed.largest_step == max(state.token_steps.max(), state.episode_steps.max())  # what the state still holds


@pytest.mark.parametrize("path", ["fast", "plain"])
def test_a_rollout_past_the_learned_table_is_the_specification(path: str) -> None:
    # Steps beyond the learned table take the sinusoid: the rollout knows that from its host steps, and gives what
    # the plain windows give, which ask the device.
    collector = make_collector("learned", path)
    model, state = collector.model, collector.state
    start = LEARNED_POSITIONS - 3
    ring = torch.arange(start - 4, start)  # the last L = 4 steps, each in ring slot step % 4
    saved = state.state_dict()
    saved["episode_steps"] = torch.full((N,), start)
    saved["token_steps"][:, ring % 4] = ring
    saved["tokens"] = torch.randn_like(saved["tokens"])
    state.load_state_dict(saved)
    model.eval()
    with torch.no_grad():
        model.memory.sync(state)
        for _ in range(6):
            obs = torch.rand(N, OBS)
            h = model.encode(obs.unsqueeze(1))[:, 0]
            visible = torch.ones(N, 4, dtype=torch.bool)
            spec = model.memory.forward_windows(h, state.tokens, state.token_steps, visible, query_steps=state.episode_steps)
            _, out, _ = model.act(obs, state, lambda policy: policy.sample())
            torch.testing.assert_close(out.value, model.value(spec.features), rtol=1e-5, atol=1e-5)
    assert state.largest_step == start + 6 > LEARNED_POSITIONS
