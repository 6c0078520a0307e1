"""compile: true compiles the encoder, the transformer blocks and the heads with torch.compile; the outputs stay those
of the plain modules (to float rounding), and the weights keep their names."""

from __future__ import annotations

import pytest
import torch
from conftest import collect_random_rollout, small_config

from buffer import Buffer
from model import ActorCriticModel
from ppo import forward_minibatch


@pytest.mark.slow  # torch.compile takes some 20 s on a 2-core CPU
def test_compiled_model_gives_the_plain_models_outputs() -> None:
    torch.manual_seed(0)
    plain = ActorCriticModel(small_config(), (3,), [2])
    compiled = ActorCriticModel(small_config(compile=True), (3,), [2])
    compiled.load_state_dict(plain.state_dict())
    compiled.compile_modules()
    assert list(compiled.state_dict()) == list(plain.state_dict()), "checkpoints keep the same keys"
    n, t = 3, 8
    cpu = torch.device("cpu")
    buffers = [Buffer(n, t, (3,), torch.float32, 1, model.memory.trace(n, t, cpu), cpu) for model in (plain, compiled)]
    for model, buffer in zip((plain, compiled), buffers, strict=True):
        collect_random_rollout(model, buffer, (3,))
    torch.testing.assert_close(buffers[1].values, buffers[0].values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(buffers[1].log_probs, buffers[0].log_probs, rtol=1e-5, atol=1e-5)
    minibatch = next(buffers[1].minibatches(1, 4, torch.Generator().manual_seed(0)))
    outs = [forward_minibatch(model, minibatch) for model in (plain, compiled)]
    torch.testing.assert_close(outs[1].value, outs[0].value, rtol=1e-5, atol=1e-5)
