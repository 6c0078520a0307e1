"""The direction of the recency bias (issue 65): a head with ALiBi's bias weighs newer steps more than older ones, by
the slopes ALiBi defines.

Equality of the fast and the plain path (tests/test_equivalence.py) cannot see a sign both share: attention that
prefers the oldest steps passes it. Here the memory holds the same token in every ring slot, so that the tokens'
content cannot decide, and the weights of a rollout step (``TrXLMemory.step``, read as ``attention_over_steps``:
oldest first) are compared with -slope x distance.
"""

from __future__ import annotations

import pytest
import torch
from conftest import small_config

from checkpoint import check_resume, load_model, save_model
from config import Config, ConfigError
from memories.trxl import TrXLState
from model import ActorCriticModel
from transformer import alibi_slopes

L, STEP, HEADS, DIM = 6, 9, 4, 16  # a wrapped ring: episode step 9 sees steps 3..8, in ring slots step % 6
DISTANCE = torch.arange(L, 0, -1).float()  # (L,) how long ago each visible step was, oldest first


def make_config(positional_encoding: str, recency_bias: bool, learned_slopes: bool = False) -> Config:
    options = {"positional_encoding": positional_encoding, "recency_bias": recency_bias, "query_position": True}
    options["learned_slopes"] = learned_slopes
    options.update(num_heads=HEADS, embed_dim=DIM, memory_length=L)
    return small_config(options)


def make_model(positional_encoding: str, recency_bias: bool, learned_slopes: bool = False) -> ActorCriticModel:
    torch.manual_seed(0)
    return ActorCriticModel(make_config(positional_encoding, recency_bias, learned_slopes), (3,), [3])


def same_token_ring(model: ActorCriticModel, step: int = STEP) -> TrXLState:
    """One worker at episode step ``step`` whose L ring slots hold one and the same token (per block)."""
    state = model.memory.start(1, torch.device("cpu"))
    saved = state.state_dict()
    torch.manual_seed(1)
    saved["tokens"][:] = torch.randn(saved["tokens"].shape[2:])  # (K, D) in every slot
    steps = torch.arange(step - L, step)
    saved["token_steps"][0, steps % L] = steps
    saved["episode_steps"][:] = step
    state.load_state_dict(saved)
    return state


def step_attention(model: ActorCriticModel, step: int = STEP) -> torch.Tensor:
    """(K, H, L) attention of a rollout step over its visible past steps, oldest first, on ``same_token_ring``."""
    state = same_token_ring(model, step)
    with torch.no_grad():
        out = model.memory.step(torch.randn(1, DIM, generator=torch.Generator().manual_seed(2)), state, return_attention=True)
    return torch.stack([torch.as_tensor(w) for w in model.memory.attention_over_steps(state, out.attention)])


def test_alibi_weighs_newer_steps_more_by_its_slopes() -> None:
    # Same tokens, no position added to them: the scores differ by ALiBi's bias alone.
    weights = step_attention(make_model("alibi", False))
    assert (weights[..., 1:] > weights[..., :-1]).all(), "newer steps must weigh more, for every block and head"
    expected = torch.softmax(-alibi_slopes(HEADS).unsqueeze(1) * DISTANCE, dim=-1)  # (H, L)
    torch.testing.assert_close(weights, expected.expand_as(weights))


@pytest.mark.parametrize("positional_encoding", ["relative", "learned", "rotary"])
def test_recency_bias_on_an_encoding_weighs_newer_steps_more(positional_encoding: str) -> None:
    # The encoding makes the same token's keys differ by step; the bias multiplies each weight by
    # exp(-slope x distance) (and renormalises), so the ratio to the unbiased weights falls with the distance.
    unbiased, biased = make_model(positional_encoding, False), make_model(positional_encoding, True)
    biased.load_state_dict(unbiased.state_dict())  # the bias has no parameters
    ratio = step_attention(biased) / step_attention(unbiased)  # (K, H, L)
    assert (ratio[..., 1:] > ratio[..., :-1]).all(), "the bias must favour newer steps, for every block and head"
    expected = torch.exp(-alibi_slopes(HEADS).unsqueeze(1) * (DISTANCE - 1))  # relative to the newest step
    torch.testing.assert_close(ratio / ratio[..., -1:], expected.expand_as(ratio))


def test_rotary_attention_depends_on_the_distance_alone() -> None:
    # Rotary turns the query by its episode step and each key by its own, so that their dot product sees only the
    # distance: the same ring at episode step 9 and at step 409 gives the same weights. Keys turned but not the query
    # would see the keys' absolute steps.
    model = make_model("rotary", False)
    torch.testing.assert_close(step_attention(model, STEP + 400), step_attention(model, STEP), rtol=1e-4, atol=1e-5)
    relative = make_model("relative", False)  # an encoding of the absolute step tells the two apart
    assert not torch.allclose(step_attention(relative, STEP + 400), step_attention(relative, STEP), atol=1e-3)


@pytest.mark.parametrize("positional_encoding, recency_bias", [("rotary", False), ("alibi", False), ("relative", True)])
def test_attention_by_distance_without_the_steps_is_a_clear_error(positional_encoding: str, recency_bias: bool) -> None:
    transformer = make_model(positional_encoding, recency_bias).memory.transformer
    mask = torch.ones(1, 1, L, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs the episode steps of the queries and memory slots: pass query_steps"):
        transformer.attention_mask(mask, None, None)
    if recency_bias or positional_encoding == "alibi":  # the bias needs the slots' steps as well
        with pytest.raises(ValueError, match="pass query_steps and key_steps"):
            transformer.attention_mask(mask, torch.tensor([[STEP]]), None)


# ALiBi's slopes as exponents of 2 (Press et al. 2022): for H a power of two -8 i / H, i = 1..H; otherwise those of the
# largest power of two P below H, then every other slope of 2 P (its 1st, 3rd, ...) until there are H.
SLOPE_EXPONENTS = {
    1: [-8],
    2: [-4, -8],
    3: [-4, -8, -2],
    4: [-2, -4, -6, -8],
    5: [-2, -4, -6, -8, -1],
    6: [-2, -4, -6, -8, -1, -3],
    7: [-2, -4, -6, -8, -1, -3, -5],
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],
    16: [-0.5 * i for i in range(1, 17)],
}


@pytest.mark.parametrize("heads", sorted(SLOPE_EXPONENTS))
def test_alibi_slopes_are_the_papers(heads: int) -> None:
    torch.testing.assert_close(alibi_slopes(heads), torch.pow(2.0, torch.tensor(SLOPE_EXPONENTS[heads])))


def test_learned_slopes_start_at_alibis_belong_to_the_memory_and_decide_the_weights() -> None:
    fixed, learned = make_model("alibi", False), make_model("alibi", False, learned_slopes=True)
    slopes = learned.memory.transformer.alibi_slopes
    assert isinstance(slopes, torch.nn.Parameter) and not isinstance(fixed.memory.transformer.alibi_slopes, torch.nn.Parameter)
    assert any(p is slopes for p in learned.memory.parameters()), "the memory's parameter group must hold the slopes"
    torch.testing.assert_close(slopes.detach().flatten(), alibi_slopes(HEADS))
    torch.testing.assert_close(step_attention(learned), step_attention(fixed))  # ALiBi's weights at the start
    chosen = torch.tensor([1.0, 0.25, 0.0, -0.5])  # steeper, flat, and one preferring older steps
    with torch.no_grad():
        slopes.copy_(chosen.view_as(slopes))
    weights = step_attention(learned)
    torch.testing.assert_close(weights, torch.softmax(-chosen.unsqueeze(1) * DISTANCE, dim=-1).expand_as(weights))
    assert (weights[:, 3, 1:] < weights[:, 3, :-1]).all(), "a negative slope weighs older steps more"


def test_learned_slopes_get_gradients_from_the_loss() -> None:
    # A training window (the rollout steps without gradients) of distinct tokens, so that the weights matter.
    model = make_model("relative", True, learned_slopes=True)
    steps = torch.arange(STEP - L, STEP).unsqueeze(0)  # (1, L) oldest first
    tokens = torch.randn(1, L, 2, DIM, generator=torch.Generator().manual_seed(3))  # (1, L, K, D)
    visible = torch.ones(1, L, dtype=torch.bool)
    out = model.memory.forward_windows(torch.randn(1, DIM), tokens, steps, visible, query_steps=steps[:, -1] + 1)
    model.value(out.features).sum().backward()
    grad = model.memory.transformer.alibi_slopes.grad
    assert grad is not None and torch.isfinite(grad).all() and (grad.abs() > 1e-6).all(), grad


def test_learned_slopes_need_a_bias() -> None:
    with pytest.raises(
        ConfigError, match="learned_slopes' learns the recency bias's slopes.*set transformer.recency_bias=true"
    ):
        small_config({"positional_encoding": "relative", "recency_bias": False, "learned_slopes": True})


def test_learned_slopes_are_kept_in_the_model_file(tmp_path: object) -> None:
    config = make_config("alibi", False, learned_slopes=True)
    model = make_model("alibi", False, learned_slopes=True)
    chosen = torch.tensor([0.5, 0.125, 0.0, -0.25]).view_as(model.memory.transformer.alibi_slopes)
    with torch.no_grad():
        model.memory.transformer.alibi_slopes.copy_(chosen)
    path = f"{tmp_path}/slopes.nn"
    save_model(model, config, path)
    loaded, loaded_config = load_model(path, torch.device("cpu"))
    assert loaded_config.transformer.learned_slopes
    torch.testing.assert_close(loaded.memory.transformer.alibi_slopes.detach(), chosen)
    torch.testing.assert_close(step_attention(loaded), step_attention(model))


@pytest.mark.parametrize("saved_learned", [True, False])
def test_a_resume_that_turns_learned_slopes_on_or_off_is_refused(saved_learned: bool) -> None:
    # Off -> on would start the slopes at ALiBi's under a model trained with them fixed; on -> off would drop the
    # learned ones. Either changes the memory's parameters, which the saved optimizer state must match.
    config = make_config("relative", True, learned_slopes=saved_learned).to_dict()
    checkpoint = {
        "config": config, "model": make_model("relative", True, learned_slopes=saved_learned).state_dict(),
        "observation_shape": [3], "action_dims": [3],
    }  # fmt: skip
    new = {**config, "transformer": {**config["transformer"], "learned_slopes": not saved_learned}}
    with pytest.raises(ValueError, match=rf"transformer.learned_slopes {saved_learned} -> {not saved_learned}.*alibi_slopes"):
        check_resume(checkpoint, new)
    check_resume(checkpoint, config)  # the same config resumes
