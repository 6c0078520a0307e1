"""lab/flops.py: the model's FLOPs per environment step counted from the config, against a hand count and against
torch's FlopCounterMode; lab/benchmark.py's JSON carries them with the matrix-product rates and shares."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import small_config
from torch.utils.flop_counter import FlopCounterMode

from lab.flops import BACKWARD_FACTOR, model_flops
from model import ActorCriticModel


def test_trxl_flops_of_a_tiny_config_by_hand() -> None:
    # Vector observations (3,), D = 16, K = 2 blocks, L = 4, hidden 16, Discrete(3) actions, 1 epoch.
    config = small_config()
    encoder = 2 * 3 * 16  # Linear(3, D)
    embedding = 2 * 16 * 16  # the transformer's input Linear(D, D)
    block = (
        2 * 16 * 16  # query
        + 2 * 16 * 32  # keys and values of the step's own token, once
        + 2 * 4 * 16 * 2  # scores over L = 4 slots, then their weighted sum
        + 2 * 16 * 16  # attention output
        + 2 * 16 * 16  # feed-forward
    )
    heads = (2 * 16 * 16 + 2 * 16 * 3) + (2 * 16 * 16 + 2 * 16 * 1)  # policy, value
    forward = encoder + embedding + 2 * block + heads
    assert forward == 7392
    assert model_flops(config, (3,), [3]) == {
        "forward": forward, "rollout": forward, "train": BACKWARD_FACTOR * forward, "total": 4 * forward,
    }  # fmt: skip
    assert model_flops(small_config(epochs=3), (3,), [3])["train"] == 9 * forward


@pytest.mark.parametrize(
    ("memory", "options", "shape"),
    [("trxl", {}, (3,)), ("trxl", {"transformer": {"gtrxl": True}}, (3, 36, 36)), ("gru", {}, (3, 12, 12)),
     ("none", {}, (5,))],
)  # fmt: skip
def test_flops_match_what_torch_counts_in_a_rollout_step(memory: str, options: dict, shape: tuple) -> None:
    """FlopCounterMode on one step with a full memory (attention weights asked for: its matrix products are then
    counted, the CPU's fused attention kernel is not), per worker."""
    config = small_config(memory=memory, **options)
    model = ActorCriticModel(config, shape, [3, 2])
    state = model.memory.start(2, torch.device("cpu"))
    attention = memory == "trxl"
    with torch.no_grad():
        for _ in range(config.transformer.memory_length + 1):  # the ring is full from step L on
            obs = model.prepare(torch.rand(2, *shape).numpy())
            with FlopCounterMode(display=False) as counter:
                model.act(obs, state, lambda policy: policy.sample(), attention)
    assert counter.get_total_flops() / 2 == model_flops(config, shape, [3, 2])["rollout"]


def test_benchmark_json_has_the_dtype_rates_flops_and_shares(capsys: pytest.CaptureFixture) -> None:
    from lab import benchmark

    code = benchmark.main(
        [
            "--config=configs/poc_memory_env.yaml",
            "--paths=fast",
            "--updates=1",
            "--cpu",
            "--workers=4",
            "--steps=16",
            "--set=n_mini_batch=2",
        ]
    )
    assert code == 0
    fast = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fast"]
    assert fast["compute_dtype"] == "float32" and fast["matmul_gflops"] > 0
    assert "matmul_bf16_gflops" in fast  # null where the machine has no bfloat16 units
    flops = fast["model_mflop_per_step"]
    assert set(flops) == {"rollout", "train", "total"} and flops["total"] == pytest.approx(flops["rollout"] + flops["train"])
    shares = fast["share_of_dtype_matmul"]
    assert set(shares) == {"rollout", "train", "total"} and all(0 < share < 1 for share in shares.values())
