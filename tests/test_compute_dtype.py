"""compute_dtype: bfloat16 matrix products under torch.autocast, against float32 within a stated tolerance."""

from __future__ import annotations

import pytest
import torch
from conftest import collect_random_rollout, small_config, train_small

from buffer import Buffer
from model import ActorCriticModel
from ppo import forward_minibatch

# bfloat16 keeps 8 bits of mantissa (a relative error of about 0.4% per rounding); through a few small layers the
# log-probabilities and values of these tiny models stay within 0.03 of float32's.
TOLERANCE = 0.03


def pair(memory: str) -> tuple[ActorCriticModel, ActorCriticModel]:
    """The same weights with float32 and with bfloat16 compute."""
    torch.manual_seed(0)
    float32 = ActorCriticModel(small_config(memory=memory), (3,), [3])
    bfloat16 = ActorCriticModel(small_config(memory=memory, compute_dtype="bfloat16"), (3,), [3])
    bfloat16.load_state_dict(float32.state_dict())
    return float32, bfloat16


@pytest.mark.parametrize("memory", ["trxl", "gru", "none"])
def test_bfloat16_rollout_steps_stay_close_to_float32(memory: str) -> None:
    models = pair(memory)
    states = [model.memory.start(4, torch.device("cpu")) for model in models]
    generator = torch.Generator().manual_seed(1)
    for _ in range(10):
        obs = torch.rand(4, 3, generator=generator)
        outs = [model.act(obs, state, lambda policy: policy.sample())[1] for model, state in zip(models, states, strict=True)]
        actions = torch.zeros(4, 1, dtype=torch.long)
        assert outs[1].value.dtype == torch.float32, "the heads run in float32"
        torch.testing.assert_close(outs[1].value, outs[0].value, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(outs[1].policy.log_prob(actions), outs[0].policy.log_prob(actions), atol=TOLERANCE, rtol=0)
    assert not torch.equal(outs[1].value, outs[0].value) or memory == "none", "bfloat16 really computes in bfloat16"


@pytest.mark.parametrize("memory", ["trxl", "gru"])
def test_bfloat16_training_forward_stays_close_to_its_rollout(memory: str) -> None:
    _, model = pair(memory)
    n, t = 3, 12
    cpu = torch.device("cpu")
    buffer = Buffer(n, t, (3,), torch.float32, 1, model.memory.trace(n, t, cpu), cpu)
    collect_random_rollout(model, buffer, (3,), n_rollouts=2)
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(1)):
        out = forward_minibatch(model, minibatch)
        torch.testing.assert_close(out.policy.log_prob(minibatch.actions), minibatch.log_probs, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(out.value, minibatch.values, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
def test_bfloat16_training_runs(tmp_path: str) -> None:
    trainer = train_small(tmp_path, "bf16", 2, compute_dtype="bfloat16")
    assert trainer.update == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_bfloat16_gradients_of_an_image_encoder_stay_close_to_float32() -> None:
    """The uint8-levels convolution computes its weight gradients in float32 also under autocast."""
    torch.manual_seed(0)
    models = [ActorCriticModel(small_config(compute_dtype=dtype), (3, 36, 36), [3]) for dtype in ("float32", "bfloat16")]
    models[1].load_state_dict(models[0].state_dict())
    obs = models[0].prepare(torch.rand(2, 4, 3, 36, 36).numpy())
    grads = []
    for model in models:
        with model.autocast():  # the encoder alone, in the context the model runs it in
            h = model.encoder(obs)
        h.float().square().mean().backward()
        grads.append(model.encoder.conv[0].weight.grad)
    assert grads[1].dtype == torch.float32 and torch.isfinite(grads[1]).all()
    torch.testing.assert_close(grads[1], grads[0], atol=0.05 * grads[0].abs().max().item(), rtol=0)


def test_bfloat16_attention_weights_for_figures() -> None:
    # The attention strips of eval_video and enjoy.py --attention are numpy arrays, which have no bfloat16.
    float32, bfloat16 = pair("trxl")
    strips = []
    for model in (float32, bfloat16):
        state = model.memory.start(1, torch.device("cpu"))
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _ in range(4):
                _, _, weights = model.act(torch.rand(1, 3, generator=generator), state, lambda p: p.sample(), True)
        strips.append(weights)
    for exact, rounded in zip(*strips, strict=True):
        assert rounded.dtype == exact.dtype and rounded.shape == exact.shape == (2, 3)  # (H, visible steps)
        assert abs(rounded - exact).max() < TOLERANCE


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_recurrent_layer_runs_in_float32_under_bfloat16(memory: str) -> None:
    # autocast would run the recurrent layer in reduced precision (float16 in cuDNN, bfloat16 in oneDNN's LSTM).
    float32, bfloat16 = pair(memory)
    x = torch.randn(4, 6, bfloat16.memory.recurrent.input_size)
    state = torch.randn(4, 1, bfloat16.memory.width)
    with bfloat16.autocast():
        out, final = bfloat16.memory._run(x, state)
    expected, expected_final = float32.memory._run(x, state)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(final, expected_final)
