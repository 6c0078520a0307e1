"""Training on several processes with torch.distributed (gloo on the CPU, launched by torchrun): the same update as one
process, exact resume, and a failing rank that stops them all; plus the pieces that make the update the same
(sampling noise by global row, minibatches cut from one permutation of all lanes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import collect_random_rollout, small_config

from buffer import Buffer
from distributed import Ranks, Rows
from heads import MultiCategorical, noise
from model import ActorCriticModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
SMALL = [
    "--config", os.path.join(ROOT, "configs", "poc_memory_env.yaml"), "--cpu", "--set", "n_workers=8",
    "--set", "worker_steps=16", "--set", "sequence_length=8", "--set", "n_mini_batch=2", "--set", "epochs=2",
    "--set", "eval_interval=0", "--set", "hidden_layer_size=16",
    "--set", "transformer={num_blocks: 2, embed_dim: 16, num_heads: 2, memory_length: 8}",
]  # fmt: skip


def run(
    folder: str, args: list[str], processes: int = 1, timeout: int = 240, env: dict | None = None, torchrun: bool = False
) -> subprocess.CompletedProcess:
    """train.py in ``folder``, plainly or under torchrun with ``processes`` processes (one thread each; torchrun for
    one process too with ``torchrun``), with the variables of ``env`` added to the environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if processes == 1 and not torchrun:
        command = [sys.executable, TRAIN, *args]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", TRAIN,
            *args,
        ]  # fmt: skip
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def reports(stdout: str) -> list[str]:
    """The console lines of the updates without their timing: episode means and losses to 2-4 decimals."""
    lines = [line for line in stdout.splitlines() if line.startswith("update ")]
    return [re.sub(r"sps +\d+|\[.*\]", "", line) for line in lines]


def weights(folder: str, run_id: str) -> dict[str, torch.Tensor]:
    """The model weights train.py saved for a run."""
    return torch.load(os.path.join(folder, "models", f"{run_id}.nn"), weights_only=True)["model"]


def test_noise_of_a_share_of_the_rows_is_that_share_of_all_rows() -> None:
    shape = torch.Size((3, 2))
    full = noise(torch.Size((8, 2)), torch.Generator().manual_seed(4), torch.device("cpu"), torch.float32)
    part = noise(shape, torch.Generator().manual_seed(4), torch.device("cpu"), torch.float32, Rows(2, 8))
    assert torch.equal(part, full[2:5])
    assert not torch.equal(part, full[:3])


def test_categorical_sampling_follows_the_probabilities() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    dist = MultiCategorical([probs.log().expand(40000, 4)])
    actions = dist.sample(generator=torch.Generator().manual_seed(0))[:, 0]
    frequencies = torch.bincount(actions, minlength=4).float() / len(actions)
    assert frequencies[1] == 0, "an action of probability 0 is never taken"
    torch.testing.assert_close(frequencies, probs, atol=0.01, rtol=0)


@pytest.mark.parametrize("sampling", ["chunks", "steps"])
def test_the_processes_minibatches_make_up_the_single_process_minibatch(sampling: str) -> None:
    torch.manual_seed(0)
    n, t = 4, 8
    config = small_config(n_workers=n, worker_steps=t, sequence_length=4, n_mini_batch=2)
    model = ActorCriticModel(config, (3,), [2])
    cpu = torch.device("cpu")
    buffer = Buffer(n, t, (3,), torch.float32, 1, model.memory.trace(n, t, cpu), cpu)
    collect_random_rollout(model, buffer, (3,))
    buffer.advantages = torch.randn(n, t)
    whole = list(buffer.minibatches(2, 4, torch.Generator().manual_seed(3), sampling))
    halves = []
    for first in (0, 2):  # each half as a buffer of 2 workers
        half = Buffer(2, t, (3,), torch.float32, 1, model.memory.trace(2, t, cpu), cpu)
        half.advantages, half.actions = buffer.advantages[first : first + 2], buffer.actions[first : first + 2]
        halves.append(list(half.minibatches(2, 4, torch.Generator().manual_seed(3), sampling, Rows(first, n))))
    for k, minibatch in enumerate(whole):
        parts = [half[k] for half in halves if half[k] is not None]
        assert sum(part.share for part in parts) == pytest.approx(1.0)
        if sampling == "steps":
            mine = [part.advantages[part.valid] for part in parts]
            expected = minibatch.advantages[minibatch.valid]
        else:
            mine = [part.advantages.reshape(-1) for part in parts]
            expected = minibatch.advantages.reshape(-1)
        assert sorted(torch.cat(mine).tolist()) == sorted(expected.tolist())


def test_ranks_split_the_lanes() -> None:
    assert list(Ranks(1, 2).lanes(8)) == [4, 5, 6, 7] and Ranks(1, 2).rows(8) == Rows(4, 8)
    assert Ranks().rows(8) is None and not Ranks().distributed


LARGE_RATE = [
    *["--set", "learning_rate_schedule={initial: 0.01, final: 0.01, max_decay_steps: 1}"],
    *["--set", "transformer.max_learning_rate=0.0", "--set", "transformer.warmup_updates=0"],
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        # normalisation statistics merged over the ranks are those of all 8 workers
        ["--set", "normalize_advantages=true", "--set", "normalize_observations=true", "--set", "normalize_rewards=true"],
        ["--set", "memory=gru", "--set", "reconstruction_coefficient=0.1"],
        ["--set", "minibatch_sampling=steps", "--set", "transformer.memory_gradients=false"],
        # target_kl ends update 1 after 3 of its 4 steps and lets update 2 take all 4: every rank must stop together
        # (the large rate on every parameter from the first update: no bound on the transformer's, no warm-up)
        ["--set", "target_kl=0.02", *LARGE_RATE],
        # and with kl_rollback every rank undoes its third step, weights and moments alike
        ["--set", "target_kl=0.02", "--set", "kl_rollback=true", *LARGE_RATE],
    ],
    ids=["trxl-chunks", "gru-reconstruction", "trxl-steps", "trxl-target-kl", "trxl-kl-rollback"],
)
def test_two_processes_end_an_update_with_the_parameters_of_one(tmp_path: str, settings: list[str]) -> None:
    """2 ranks x 4 workers and 1 process x 8 workers, same seed: the same rollouts, minibatches and steps."""
    args = [*SMALL, *settings, "--set", "updates=2"]
    one = run(str(tmp_path), [*args, "--run-id", "one"])
    assert one.returncode == 0, one.stderr
    two = run(str(tmp_path), [*args, "--run-id", "two"], processes=2)
    assert two.returncode == 0, two.stderr
    assert "on 2 processes (4 workers each, gloo)" in two.stdout
    a, b = weights(str(tmp_path), "one"), weights(str(tmp_path), "two")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)
    assert reports(one.stdout) == reports(two.stdout), "the same episodes and losses"
    assert two.stdout.count("update    2/2") == 1, "only rank 0 reports"
    if "target_kl=0.02" in settings:
        undone = ", the last one undone" if "kl_rollback=true" in settings else ""
        assert f"(target_kl: stopped after 3 steps{undone})" in reports(one.stdout)[0], one.stdout


@pytest.mark.slow
def test_two_processes_resume_exactly_and_refuse_another_count(tmp_path: str) -> None:
    folder = str(tmp_path)
    normalised = [*SMALL, "--set", "normalize_observations=true", "--set", "normalize_rewards=true"]
    whole = run(folder, [*normalised, "--set", "updates=3", "--run-id", "whole"], processes=2)
    assert whole.returncode == 0, whole.stderr
    first = run(folder, [*normalised, "--set", "updates=1", "--run-id", "part"], processes=2)
    assert first.returncode == 0, first.stderr
    checkpoint = os.path.join("models", "part", "checkpoint.pt")
    payload = torch.load(os.path.join(folder, checkpoint), weights_only=True)
    assert payload["world_size"] == 2 and len(payload["memory"]) == 2 and len(payload["workers"]) == 8
    assert [len(returns) for returns in payload["rewards"]["returns"]] == [4, 4]  # each rank's workers' returns
    assert any(state["actions"] for state in payload["workers"]), "episodes run across the interruption"
    alone = run(folder, ["--resume", checkpoint, "--set", "updates=3"])
    assert alone.returncode == 2 and "resume with --nproc_per_node=2" in alone.stderr
    resumed = run(folder, ["--resume", checkpoint, "--set", "updates=3"], processes=2)
    assert resumed.returncode == 0, resumed.stderr
    a, b = weights(folder, "whole"), weights(folder, "part")
    assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_one_process_under_torchrun_trains_in_a_group_and_resumes_plainly(tmp_path: str) -> None:
    """torchrun with one process takes the path of several (collectives over one rank: how one GPU checks NCCL), with
    the plain run's update; its checkpoint (a shard per rank) resumes in a plain run and the other way round."""
    folder = str(tmp_path)
    plain = run(folder, [*SMALL, "--set", "updates=2", "--run-id", "plain"])
    assert plain.returncode == 0, plain.stderr
    group = run(folder, [*SMALL, "--set", "updates=1", "--run-id", "group"], torchrun=True)
    assert group.returncode == 0, group.stderr
    assert "on 1 process (8 workers each, gloo)" in group.stdout
    checkpoint = os.path.join("models", "group", "checkpoint.pt")
    assert torch.load(os.path.join(folder, checkpoint), weights_only=True)["world_size"] == 1
    resumed = run(folder, ["--resume", checkpoint, "--set", "updates=2"])
    assert resumed.returncode == 0, resumed.stderr
    a, b = weights(folder, "plain"), weights(folder, "group")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)

    def counted(*outputs: str) -> list[str]:  # the update lines without the number of updates to go ("1/2", "1/1")
        return [re.sub(r"/\d+", "", line) for output in outputs for line in reports(output)]

    assert counted(plain.stdout) == counted(group.stdout, resumed.stdout)
    first = run(folder, [*SMALL, "--set", "updates=1", "--run-id", "first"])
    assert first.returncode == 0, first.stderr
    again = run(folder, ["--resume", os.path.join("models", "first", "checkpoint.pt"), "--set", "updates=2"], torchrun=True)
    assert again.returncode == 0, again.stderr
    assert counted(plain.stdout)[1:] == counted(again.stdout)


def test_a_process_without_a_gpu_of_its_own_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(distributed.LaunchError, match=r"shows 1 GPU\(s\).*--nproc_per_node=1\), or add --cpu"):
        distributed.start("cuda")


@pytest.mark.slow
def test_a_failing_rank_stops_every_rank_with_its_error(tmp_path: str) -> None:
    failing = ["--set", "environment={type: Failing, fail_at_step: 20, rank: 1}", "--set", "updates=5"]
    result = run(str(tmp_path), [*SMALL, *failing, "--run-id", "fails"], processes=2, timeout=120)
    assert result.returncode != 0
    assert "training stopped on rank 1 of 2: an environment worker failed" in result.stderr
    assert "deliberate failure at step 20" in result.stderr
    leftover = subprocess.run(["pgrep", "-f", "run-id fails"], capture_output=True, text=True)
    assert leftover.returncode == 1, f"no training process is left behind, found: {leftover.stdout}"


@pytest.mark.slow
def test_the_other_ranks_wait_for_an_evaluation_longer_than_the_collective_timeout(tmp_path: str) -> None:
    # Rank 0 evaluates alone (8 steps x 0.5 s per episode, twice) while the collectives time out after 2 s: the other
    # rank waits in distributed.wait_for_main's barrier, not in its next training collective.
    slow = ["--set", "environment={type: Failing, fail_at_step: 1000000000, evaluation_step_seconds: 0.5}"]
    settings = ["--set", "updates=2", "--set", "eval_interval=1", "--set", "eval_episodes=2"]
    env = {"TRXL_COLLECTIVE_TIMEOUT_S": "2"}
    result = run(str(tmp_path), [*SMALL, *slow, *settings, "--run-id", "slow"], processes=2, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("evaluating 2 unseen episodes ... reward 8.000") == 2


@pytest.mark.slow
def test_every_checkpoint_comes_with_its_model_file(tmp_path: str) -> None:
    # A run killed while blocked (a rank stuck in a CUDA synchronisation under NCCL ignores SIGTERM) keeps the model
    # file of its last checkpoint, not only the checkpoint: rank 0 writes both at every checkpoint.
    from conftest import small_config

    from checkpoint import load_file
    from trainer import PPOTrainer

    config = small_config(updates=3, eval_interval=0, checkpoint_interval=2)
    trainer = PPOTrainer(config, "run", torch.device("cpu"), 5, models_dir=str(tmp_path), summaries_dir=str(tmp_path))
    seen = {}
    optimize = trainer.learner.optimize

    def spy(buffer: object, update: int) -> dict:
        if update == 2:  # in the third update: the checkpoint of update 2 is on disk
            seen.update(model=load_file(trainer.model_path), checkpoint=load_file(trainer.checkpoint_path))
        return optimize(buffer, update)

    trainer.learner.optimize = spy
    trainer.run()
    assert seen["checkpoint"]["update"] == 2 and seen["model"]["kind"] == "model"
    for key, value in seen["checkpoint"]["model"].items():
        assert torch.equal(seen["model"]["model"][key], value), key


@pytest.mark.slow
def test_worker_counts_must_split_over_the_processes(tmp_path: str) -> None:
    result = run(str(tmp_path), [*SMALL, "--set", "n_workers=6", "--set", "n_mini_batch=2", "--run-id", "odd"], 4)
    assert result.returncode != 0  # torchrun exits with 1 whatever its processes' codes (2 here)
    assert "'n_workers' (6) must split evenly over the 4 processes: use a multiple of 4" in result.stderr


@pytest.mark.slow
def test_leave_ends_the_process_with_its_code_and_flushes_what_it_printed(tmp_path: str) -> None:
    # train.py's torchrun processes end through distributed.leave, which skips the interpreter's shutdown: what they
    # printed last must still arrive, and torchrun must see their exit code.
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import distributed; "
        "print('saved', end=''); print('last words', end='', file=sys.stderr); distributed.leave(3)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a plain run's pipes are
    result = subprocess.run([sys.executable, "-c", script, ROOT], env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (3, "saved", "last words")


def test_each_rank_restores_its_own_cuda_generator() -> None:
    # Only rank 0 wrote the checkpoint, but each rank's GPU generator state is its own (gathered with its shard).
    from distributed import Ranks
    from trainer import shard_of

    states = [torch.full((4,), rank, dtype=torch.uint8) for rank in range(2)]
    checkpoint = {"world_size": 2, "workers": [{"e": 0}, {"e": 1}], "memory": ["m0", "m1"], "trace": ["t0", "t1"],
                  "rng": {"torch": "cpu", "cuda_device": "rank 0's", "minibatch": "g"}, "cuda_rng": states}  # fmt: skip
    for rank in range(2):
        shard = shard_of(checkpoint, Ranks(rank, 2), 1, 2)
        assert shard["memory"] == f"m{rank}" and torch.equal(shard["rng"]["cuda_device"], states[rank])
        assert shard["rng"]["torch"] == "cpu" and shard["rng"]["minibatch"] == "g"
    cpu_only = {**checkpoint, "rng": {"torch": "cpu", "cuda_device": None, "minibatch": "g"}, "cuda_rng": [None, None]}
    assert shard_of(cpu_only, Ranks(1, 2), 1, 2)["rng"]["cuda_device"] is None
