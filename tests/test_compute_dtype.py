"""compute_dtype: bfloat16 matrix products under torch.autocast, against float32 within a stated tolerance; the
rollout's bfloat16 weight copies (``ActorCriticModel.fixed_weights``); float32 where the CPU has no bfloat16 units."""

from __future__ import annotations

import pytest
import torch
from conftest import collect_random_rollout, small_config, train_small

import encoders
import model as precision
import transformer
from buffer import Buffer
from model import ActorCriticModel, compute_dtype_for
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
    """The uint8-levels convolution's weight gradients, computed in bfloat16 under autocast, come back as float32
    close to float32's."""
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


def test_convolution_on_levels_computes_what_autocast_computes_from_float_images() -> None:
    """Under bfloat16 autocast the uint8 levels go straight to bfloat16 (exact for 0-255): the output and the weight
    and bias gradients are those of autocast's own convolution of the float images in [0, 1]."""
    torch.manual_seed(0)
    levels = torch.randint(0, 256, (4, 3, 36, 36), dtype=torch.uint8)
    conv = torch.nn.Conv2d(3, 8, 4, 2)
    results = []
    for on_levels in (True, False):
        conv.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if on_levels:
                out = encoders._ConvOnLevels.apply(levels, conv.weight, conv.bias, 2)
            else:
                out = conv((levels.float() / 255).contiguous(memory_format=torch.channels_last))
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        results.append((out.float(), conv.weight.grad.clone(), conv.bias.grad.clone()))
    for ours, autocasts in zip(*results, strict=True):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, autocasts, atol=0.01 * autocasts.abs().max().item(), rtol=0)


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


def image_pair() -> tuple[ActorCriticModel, ActorCriticModel]:
    """``pair`` with an image encoder (the convolution on uint8 levels) and a GTrXL memory."""
    torch.manual_seed(0)
    configs = [small_config(transformer={"gtrxl": True}, compute_dtype=dtype) for dtype in ("float32", "bfloat16")]
    float32, bfloat16 = (ActorCriticModel(config, (3, 36, 36), [3]) for config in configs)
    bfloat16.load_state_dict(float32.state_dict())
    return float32, bfloat16


@pytest.mark.parametrize("memory", ["trxl", "gru", "none", "image"])
def test_fixed_weights_give_what_autocast_gives(memory: str) -> None:
    """A rollout's steps with the bfloat16 copies of ``fixed_weights`` give autocast's outputs: the same bfloat16
    weights in the same products (the uint8 convolution divides its bfloat16 weight by 255 in bfloat16, one
    rounding apart, hence a tolerance of a bfloat16 rounding or two)."""
    model = image_pair()[1] if memory == "image" else pair(memory)[1]
    shape = (3, 36, 36) if memory == "image" else (3,)
    states = [model.memory.start(4, torch.device("cpu")) for _ in range(2)]
    parameters = {name: p for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    actions = torch.zeros(4, 1, dtype=torch.long)
    with torch.no_grad():
        for state in states:
            model.memory.sync(state)
        for _ in range(8):
            obs = model.prepare(torch.rand(4, *shape, generator=generator).numpy())
            with model.fixed_weights():
                copies = {name: p for name, p in model.named_parameters()}
                fixed = model.act(obs, states[0], lambda policy: policy.sample(True))[1]
            per_call = model.act(obs, states[1], lambda policy: policy.sample(True))[1]
            torch.testing.assert_close(fixed.value, per_call.value, atol=0.01, rtol=0)
            torch.testing.assert_close(fixed.policy.log_prob(actions), per_call.policy.log_prob(actions), atol=0.01, rtol=0)
    copied = [name for name, p in copies.items() if p.dtype == torch.bfloat16]
    assert copied and all(name.startswith(("encoder.", "memory.")) for name in copied), "only encoder and memory copied"
    assert not any(name.startswith(("policy.", "value.")) for name in copied), "the heads stay float32"
    assert all(p is parameters[name] for name, p in model.named_parameters()), "the optimizer's parameters are back"


def test_each_rollout_uses_the_weights_of_its_update() -> None:
    """The bfloat16 copies are made at every rollout's start: after the weights change (as an optimizer step changes
    them, in place), the next rollout's values are those of the new weights, not of copies of the old ones."""
    float32, model = pair("trxl")
    n, t = 3, 12
    cpu = torch.device("cpu")
    buffer = Buffer(n, t, (3,), torch.float32, 1, model.memory.trace(n, t, cpu), cpu)
    collector = collect_random_rollout(model, buffer, (3,))
    old = ActorCriticModel(small_config(compute_dtype="bfloat16"), (3,), [3])
    old.load_state_dict(model.state_dict())
    with torch.no_grad():  # an update that moves the encoder's and the memory's weights, in place
        generator = torch.Generator().manual_seed(2)
        for part in (model.encoder, model.memory):
            for parameter in part.parameters():
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    collector.collect()
    for minibatch in buffer.minibatches(3, 4, torch.Generator().manual_seed(1)):
        with torch.no_grad():
            fresh = forward_minibatch(model, minibatch).value
            stale = forward_minibatch(old, minibatch).value
        torch.testing.assert_close(minibatch.values, fresh, atol=TOLERANCE, rtol=0)
        assert (minibatch.values - stale).abs().max() > 3 * TOLERANCE, "the change of weights is large enough to tell"


def test_bfloat16_runs_as_float32_on_a_cpu_without_bfloat16_units() -> None:
    dtype, message = compute_dtype_for("bfloat16", "cpu", [])
    assert dtype == "float32"
    assert "amx_bf16" in message and "avx512_bf16" in message and "float32" in message


@pytest.mark.parametrize(
    ("requested", "device_type", "units"),
    [("bfloat16", "cpu", ["amx_bf16"]), ("bfloat16", "cpu", ["avx512_bf16"]), ("bfloat16", "cuda", []),
     ("float32", "cpu", []), ("float32", "cpu", ["amx_bf16"])],
)  # fmt: skip
def test_compute_dtype_runs_as_asked_where_it_pays(requested: str, device_type: str, units: list[str]) -> None:
    assert compute_dtype_for(requested, device_type, units) == (requested, None)


@pytest.mark.parametrize(("units", "ran"), [([], "float32"), (["amx_bf16"], "bfloat16")])
def test_the_trainer_runs_and_records_the_dtype_the_cpu_supports(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, units: list[str], ran: str
) -> None:
    import glob
    import os

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from trainer import PPOTrainer

    monkeypatch.setattr(precision, "cpu_bfloat16_units", lambda: units)
    config = small_config(compute_dtype="bfloat16", eval_interval=0)
    trainer = PPOTrainer(config, "ran", torch.device("cpu"), models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    trainer.close()
    assert trainer.model.compute_dtype == ran and trainer.model.bfloat16 == (ran == "bfloat16")
    assert ("has no bfloat16 matrix unit" in capsys.readouterr().out) == (ran == "float32")
    texts = [
        value.tensor.string_val[0].decode()
        for file in glob.glob(os.path.join(trainer.summary_dir, "**", "events.out.tfevents.*"), recursive=True)
        for event in EventFileLoader(file).Load()
        for value in event.summary.value
        if value.tag.startswith("ran")
    ]
    assert texts == [f"    compute_dtype: {ran}\n    "]


def test_attention_runs_in_float32_on_the_cpu_under_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the attention itself (scores, recency bias, softmax, weighted sum) computes in float32 also under
    bfloat16 autocast, in rollouts and in training."""
    seen = []
    sdpa = transformer.F.scaled_dot_product_attention

    def recording(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        seen.append((q.dtype, k.dtype, v.dtype, attn_mask.dtype))
        return sdpa(q, k, v, attn_mask=attn_mask)

    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", recording)
    _, model = pair("trxl")
    n, t = 3, 12
    cpu = torch.device("cpu")
    buffer = Buffer(n, t, (3,), torch.float32, 1, model.memory.trace(n, t, cpu), cpu)
    collect_random_rollout(model, buffer, (3,), n_rollouts=1)
    rollout_calls = len(seen)
    for minibatch in buffer.minibatches(3, 1, torch.Generator().manual_seed(1)):
        out = forward_minibatch(model, minibatch)
    assert 0 < rollout_calls < len(seen), "both the rollout and the training attend"
    for q, k, v, mask in seen:
        assert q == k == v == torch.float32 and mask in (torch.float32, torch.bool)
    assert out.value.dtype == torch.float32 and torch.isfinite(out.value).all()


def test_the_rollout_cache_holds_the_bfloat16_keys_in_the_attention_dtype() -> None:
    """Under bfloat16 on the CPU the fast path's key/value cache is kept in float32, the dtype attention computes in,
    holding exactly the bfloat16 projections (so a step converts no cached window); the keys written step by step
    (``commit``) are those a fresh projection of the ring's tokens gives."""
    model = pair("trxl")[1]
    state = model.memory.start(4, torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(6):
            model.act(torch.rand(4, 3, generator=generator), state, lambda policy: policy.sample())
        stepped = [(k.clone(), v.clone()) for k, v in state.keys_values]
        with model.memory.autocast():
            projected = model.memory.transformer.project_memory(state.tokens, state.token_steps)
        model.memory.sync(state)
    assert projected[0][0].dtype == torch.bfloat16, "the projection itself computes in bfloat16"
    for (k, v), (k_fresh, v_fresh), (k_step, v_step) in zip(projected, state.keys_values, stepped, strict=True):
        assert k_fresh.dtype == v_fresh.dtype == torch.float32
        assert torch.equal(k_fresh, k.float()) and torch.equal(v_fresh, v.float())
        written = slice(0, 6)  # the ring slots of the 6 steps taken
        assert torch.equal(k_step[:, :, written], k_fresh[:, :, written])
        assert torch.equal(v_step[:, :, written], v_fresh[:, :, written])
