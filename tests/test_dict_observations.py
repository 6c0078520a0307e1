"""Dict observations (an image and a vector): through workers, buffer, memory, training, checkpoints and a learned
memory task whose cue is only in the vector part."""

from __future__ import annotations

import os

import gymnasium
import numpy as np
import pytest
import torch
from conftest import (
    assert_training_reproduces_the_rollout,
    random_rollout_buffer,
    resume_matches_uninterrupted,
    small_config,
)

import observations
from encoders import DictEncoder, make_encoder
from environments.gymnasium_env import _layout
from model import ActorCriticModel
from trainer import PPOTrainer
from worker import Workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POC_DICT = {"type": "PocMemoryEnv", "dict_observation": True}
SHAPES = {"image": (3, 12, 12), "vector": (4,)}


def test_poc_dict_observation_has_the_cue_only_in_the_vector() -> None:
    with Workers(POC_DICT, 3, 2, seed=0) as workers:  # two processes: dicts cross the pipes and are joined by key
        assert observations.shape_of(workers.observation_space) == {"cue": (2,), "image": (1, 1, 11)}
        obs = workers.reset()
        assert obs["image"].shape == (3, 1, 1, 11) and obs["cue"].shape == (3, 2)
        assert np.all(obs["image"][:, 0, 0, 5] == 1) and np.all(np.abs(obs["cue"]).sum(1) == 2)
        for _ in range(3):
            result = workers.step(np.ones((3, 1), dtype=np.int64))
        assert np.all(result.obs["cue"] == 0), "the cue is hidden after two observations"
        assert np.all(result.obs["image"][:, 0, 0, 6] == 1), "one move right after the two frozen steps"
        state = workers.state()
        with Workers(POC_DICT, 3, 0, seed=0) as copy:
            assert observations.equal(copy.restore(state), result.obs)


def test_dict_encoder_concatenates_the_keys_and_keeps_images_as_uint8() -> None:
    torch.manual_seed(0)
    encoder = DictEncoder(SHAPES, 16)
    assert encoder.storage_dtype == {"image": torch.uint8, "vector": torch.float32}
    obs = encoder.prepare({"image": np.random.rand(2, 5, 3, 12, 12).astype(np.float32), "vector": np.ones((2, 5, 4))})
    assert obs["image"].dtype == torch.uint8 and encoder(obs).shape == (2, 5, 16)
    raw = DictEncoder(SHAPES, None)  # for the recurrent memories: the concatenated raw features
    assert raw.output_dim == 64 * 6 * 6 + 4  # 12x12 images: padded 3x3 convolutions, one of stride 2
    with pytest.raises(ValueError, match=r"lacks the key\(s\) \['vector'\]"):
        encoder.prepare({"image": np.zeros((1, 3, 12, 12))})


def test_dict_encoder_embeds_each_image_before_it_meets_the_vectors() -> None:
    """An image's thousands of raw convolution features are embedded to D on their own, so the shared embedding sees
    D image features beside the vector, not 2304 (results/ablations/dict-cue: a cue in the vector was drowned)."""
    encoder = DictEncoder(SHAPES, 16)
    assert encoder.parts["image"].output_dim == 16 and encoder.embedding.in_features == 16 + 4
    obs = encoder.prepare({"image": np.random.rand(1, 1, 3, 12, 12).astype(np.float32), "vector": np.zeros((1, 1, 4))})
    image_features = encoder.parts["image"](obs["image"])
    assert image_features.shape == (1, 1, 16) and bool((image_features >= 0).all()), "Linear + ReLU to D"


def test_prepare_refuses_observations_the_model_was_not_built_for() -> None:
    with pytest.raises(
        ValueError, match=r"observations of shape \(2, 5\) do not fit the model, which was built for .* \(3,\)"
    ):
        make_encoder((3,), 8).prepare(np.zeros((2, 5), dtype=np.float32))  # not a bare shape error inside the model
    with pytest.raises(ValueError, match=r"shape \(2, 3, 12, 11\) do not fit .* \(3, 12, 12\)"):
        make_encoder((3, 12, 12), 8).prepare(np.zeros((2, 3, 12, 11), dtype=np.float32))
    encoder = DictEncoder(SHAPES, 16)
    image = np.zeros((1, 3, 12, 12), dtype=np.float32)
    with pytest.raises(ValueError, match=r"key 'vector': observations of shape \(1, 5\) do not fit"):
        encoder.prepare({"image": image, "vector": np.zeros((1, 5))})
    with pytest.raises(ValueError, match=r"the key\(s\) \['extra'\], which the model was not built for"):
        encoder.prepare({"image": image, "vector": np.zeros((1, 4)), "extra": np.zeros((1, 4))})


def test_unsupported_dict_spaces_are_refused() -> None:
    nested = gymnasium.spaces.Dict({"a": gymnasium.spaces.Dict({"b": gymnasium.spaces.Discrete(2)})})
    odd_image = gymnasium.spaces.Dict({"image": gymnasium.spaces.Box(0, 255, (7, 7, 7), np.uint8)})
    assert _layout(nested) is None and _layout(odd_image) is None and _layout(gymnasium.spaces.Dict({})) is None


@pytest.mark.parametrize("memory", ["trxl", "gru"])
@pytest.mark.parametrize("sampling", ["chunks", "steps"])
def test_training_reproduces_the_rollout_with_dict_observations(memory: str, sampling: str) -> None:
    torch.manual_seed(0)
    n, t = 3, 12
    config = small_config(memory=memory, n_workers=n, worker_steps=t, sequence_length=4, n_mini_batch=3)
    model = ActorCriticModel(config, SHAPES, [3])
    buffer = random_rollout_buffer(model, SHAPES, n, t)
    assert buffer.obs["image"].dtype == torch.uint8
    assert_training_reproduces_the_rollout(model, buffer, sampling)


@pytest.mark.slow
def test_resumed_dict_run_equals_uninterrupted_run(tmp_path: str) -> None:
    overrides = {"environment": dict(POC_DICT), "worker_steps": 20, "sequence_length": 10}
    checkpoint = resume_matches_uninterrupted(tmp_path, **overrides)
    assert checkpoint["observation_shape"] == {"cue": [2], "image": [1, 1, 11]}


@pytest.mark.slow
def test_dict_proof_of_memory_task_is_learned(tmp_path: str) -> None:
    """The cue is only in the vector part and the position only in the image: success >= 0.9 in 15 updates."""
    from config import load_config

    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env_dict.yaml"), {"updates": 15})
    trainer = PPOTrainer(config, "dict", torch.device("cpu"), 0, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    means = trainer.run(log_every=10)
    assert means["success"] >= 0.9, means
