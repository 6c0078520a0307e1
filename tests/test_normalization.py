"""Observation and reward normalisation (normalization.py): the running statistics, what is normalised and what is
left as it is, the warm-up before the first rollout, that training sees the statistics of its rollout and they move
after it, where the running return restarts, and that the statistics travel with checkpoints and model files and stay
frozen in evaluation."""

from __future__ import annotations

import copy

import gymnasium
import numpy as np
import pytest
import torch
from conftest import RandomWorkers, resume_matches_uninterrupted, small_config, train_small

import normalization
from buffer import Buffer
from checkpoint import check_resume, load_model, save_model, write_half_precision
from config import ConfigError
from environments import create_env
from environments.action_spec import ActionSpec
from environments.gymnasium_env import OneHot
from evaluation import evaluate
from model import ActorCriticModel
from normalization import RewardScaler, RunningMeanStd, VectorNormalizers
from rollout import RolloutCollector
from trainer import PPOTrainer

CPU = torch.device("cpu")


def test_running_statistics_of_batches_equal_those_of_their_concatenation() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(5.0, 3.0, size=(n, 3)) for n in (7, 1, 40, 13)]
    statistics = RunningMeanStd((3,))
    for batch in batches:
        statistics.update(torch.as_tensor(batch))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(statistics.mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(statistics.var.numpy(), everything.var(0), rtol=1e-10)
    assert statistics.count.item() == len(everything)


def test_ranks_merge_into_the_statistics_of_all_their_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks with different batches: each all-reduces (count, sum, sum of squares) around the same old mean.
    rng = np.random.default_rng(1)
    first, second = torch.as_tensor(rng.normal(size=(9, 2))), torch.as_tensor(rng.normal(3.0, 2.0, size=(30, 2)))
    history = torch.as_tensor(rng.normal(size=(5, 2)))
    ranks = [RunningMeanStd((2,)) for _ in range(2)]
    for statistics in ranks:
        statistics.update(history)
    sums = {}
    monkeypatch.setattr(normalization, "all_reduce_sum", lambda tensor, _: sums.setdefault("other", tensor.clone()))
    ranks[1].update(second)  # its own sums only, captured
    monkeypatch.setattr(normalization, "all_reduce_sum", lambda tensor, _: tensor + sums["other"])
    ranks[0].update(first)
    monkeypatch.undo()
    together = RunningMeanStd((2,))
    together.update(torch.cat([history, first, second]))
    torch.testing.assert_close(ranks[0].mean, together.mean)
    torch.testing.assert_close(ranks[0].var, together.var)


def test_vectors_are_normalised_and_clipped_and_images_pass_through() -> None:
    normalizers = VectorNormalizers({"image": (3, 8, 8), "vector": (2,)}, clip=2.0)
    normalizers.update({"image": torch.rand(4, 5, 3, 8, 8), "vector": torch.tensor([[0.0, 10.0], [2.0, 30.0]])})
    image = torch.rand(1, 3, 8, 8)
    out = normalizers({"image": image, "vector": torch.tensor([[1.0, 20.0], [3.0, 1000.0]])})
    assert out["image"] is image
    torch.testing.assert_close(out["vector"], torch.tensor([[0.0, 0.0], [2.0, 2.0]]))  # (1 - 1) / 1, (3 - 1) / 1 ...


def test_normalising_observations_without_a_vector_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="normalize_observations false"):
        VectorNormalizers((3, 84, 84), clip=10.0)


def test_rewards_are_divided_by_the_std_of_the_discounted_return_which_restarts_at_episode_ends() -> None:
    scaler = RewardScaler(2, gamma=0.5, clip=100.0, device=torch.device("cpu"))
    rewards = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 4.0]])
    ended = torch.tensor([[False, True, False], [False, False, False]])
    scaled = scaler.scale(rewards, ended)
    returns = np.array([1.0, 1.5, 1.0, 2.0, 1.0, 4.5])  # worker 0 restarts after its step 1
    torch.testing.assert_close(scaled, rewards / np.sqrt(returns.var() + normalization.EPSILON), check_dtype=False)
    torch.testing.assert_close(scaler.returns, torch.tensor([1.0, 4.5], dtype=torch.float64))


@pytest.mark.slow
def test_resumed_run_with_normalisation_equals_uninterrupted_run(tmp_path: str) -> None:
    checkpoint = resume_matches_uninterrupted(tmp_path, normalize_observations=True, normalize_rewards=True)
    assert checkpoint["rewards"]["count"] > 0 and checkpoint["rewards"]["returns"].shape == (4,)


@pytest.mark.slow
def test_statistics_travel_in_the_model_file_and_stay_frozen_in_evaluation(tmp_path: str) -> None:
    trainer = train_small(tmp_path, "normalised", 2, normalize_observations=True)
    statistics = trainer.model.normalizer.parts[0].statistics
    assert statistics.count.item() == 3 * 4 * 16  # the warm-up and both rollouts, every worker's step
    model, config = load_model(trainer.model_path, torch.device("cpu"))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    before = {name: value.clone() for name, value in model.normalizer.state_dict().items()}
    evaluate(model, config, torch.device("cpu"), episodes=2)
    for name, value in model.normalizer.state_dict().items():
        assert torch.equal(value, before[name]), name


CARTPOLE = {"type": "CartPole", "name": "CartPole-v1", "mask_velocity": False, "reward_scale": 1.0}


def new_trainer(tmp_path: object, name: str, **overrides: object) -> PPOTrainer:
    """A ``small_config`` run (seed 5, no evaluations) in tmp_path/name, built and not yet run."""
    folder = str(tmp_path / name)
    return PPOTrainer(small_config(eval_interval=0, **overrides), name, CPU, 5, models_dir=folder, summaries_dir=folder)


class RecordingWorkers(RandomWorkers):
    """``RandomWorkers`` that keep every step's result, say their action space and restore a checkpoint's state."""

    action_spec = ActionSpec(counts=(3,))

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.results = []

    def step(self, actions: np.ndarray) -> object:
        self.results.append(super().step(actions))
        return self.results[-1]

    def restore(self, states: list[dict]) -> object:
        return self.observations()


def collector_with_reward_scaler(workers: RecordingWorkers) -> RolloutCollector:
    """The collector of a ``small_config`` model with ``normalize_rewards`` on ``workers`` (vector observations)."""
    config = small_config(normalize_rewards=True)
    model = ActorCriticModel(config, workers.obs_shape, [3])
    n, t = config.n_workers, config.worker_steps
    buffer = Buffer(n, t, model.observation_shape, model.storage_dtype, 1, model.memory.trace(n, t, CPU), CPU)
    scaler = RewardScaler(n, config.gamma, config.normalize_clip, CPU)
    collector = RolloutCollector(model, workers, buffer, config.gamma, config.lamda, CPU, reward_scaler=scaler)
    collector.start(workers.reset())
    return collector


def assert_same_statistics(a: RunningMeanStd, b: RunningMeanStd, what: str) -> None:
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(a, name), getattr(b, name)), f"{what}: {name}"


@pytest.mark.slow
def test_each_update_trains_with_its_rollouts_statistics_and_takes_the_rollout_in_after(tmp_path: object) -> None:
    """Training recomputes the rollout's log-probabilities only with the normalisation the rollout used: the statistics
    move after the update, by exactly the rollout's observations."""
    trainer = new_trainer(tmp_path, "order", updates=2, normalize_observations=True)
    statistics = trainer.model.normalizer.parts[0].statistics
    seen: dict[str, list[RunningMeanStd]] = {"rollout": [], "update": [], "rollout taken in": []}
    collect, optimize = trainer.collector.collect, trainer.learner.optimize

    def spy_collect() -> object:
        seen["rollout"].append(copy.deepcopy(statistics))
        return collect()

    def spy_optimize(buffer: Buffer, update: int) -> dict:
        seen["update"].append(copy.deepcopy(statistics))
        taken_in = copy.deepcopy(seen["rollout"][-1])
        taken_in.update(buffer.obs)
        seen["rollout taken in"].append(taken_in)
        return optimize(buffer, update)

    trainer.collector.collect, trainer.learner.optimize = spy_collect, spy_optimize
    trainer.run()
    assert not torch.equal(seen["rollout"][0].mean, seen["rollout"][1].mean), "the statistics must move"
    for k, (rollout, update) in enumerate(zip(seen["rollout"], seen["update"], strict=True)):
        assert_same_statistics(rollout, update, f"update {k + 1} trains with its rollout's statistics")
    after = [*seen["rollout"][1:], statistics]  # what the next rollout sees, or the run ends with
    for k, (expected, found) in enumerate(zip(seen["rollout taken in"], after, strict=True)):
        torch.testing.assert_close(found.mean, expected.mean, msg=f"after update {k + 1}")
        torch.testing.assert_close(found.var, expected.var, msg=f"after update {k + 1}")
        assert found.count == expected.count


def test_a_time_limit_restarts_the_running_return_as_a_termination_does() -> None:
    workers = RecordingWorkers(4, (3,), seed=2, end_rate=0.3, truncate_share=0.5)
    collector = collector_with_reward_scaler(workers)
    torch.manual_seed(0)
    collector.collect()
    returns, last_end = np.zeros(4), ["none"] * 4
    for result in workers.results:
        returns = returns * collector.gamma + result.rewards
        for lane in np.flatnonzero(result.terminated | result.truncated):
            returns[lane], last_end[lane] = 0.0, "truncated" if result.truncated[lane] else "terminated"
    assert "truncated" in last_end, last_end  # a lane whose running return the last time limit restarted
    torch.testing.assert_close(collector.reward_scaler.returns, torch.as_tensor(returns))


def test_a_lane_whose_episode_a_resumed_run_restarts_starts_its_running_return_again() -> None:
    """Fault 10: an episode too long to replay starts anew on resume (rollout.resume), and so must its return."""
    collector = collector_with_reward_scaler(RecordingWorkers(4, (3,)))
    collector.reward_scaler.returns = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    collector.resume([{"episode": 7, "actions": None if lane in (0, 2) else [1, 0]} for lane in range(4)])
    torch.testing.assert_close(collector.reward_scaler.returns, torch.tensor([0.0, 2.0, 0.0, 4.0], dtype=torch.float64))


def test_a_new_run_warms_the_statistics_up_so_that_its_first_rollout_sees_normalised_inputs(tmp_path: object) -> None:
    # CartPole's raw features spread far from 1: under a random policy about 0.05 (position), 0.5, 0.08 (angle), 0.9.
    trainer = new_trainer(tmp_path, "warm", environment=CARTPOLE, normalize_observations=True)
    try:
        statistics = trainer.model.normalizer.parts[0].statistics
        assert statistics.count.item() == 4 * 16, "one rollout's worth of random steps, before the first rollout"
        inputs = []
        trainer.model.encoder.register_forward_pre_hook(lambda module, args: inputs.append(args[0].reshape(-1, 4)))
        trainer.rollout()
        raw_spread, seen_spread = trainer.buffer.obs.reshape(-1, 4).std(0), torch.cat(inputs).std(0)
        assert (raw_spread < 0.3).any(), raw_spread  # raw inputs would be far from normalised
        assert ((seen_spread > 0.3) & (seen_spread < 3.0)).all(), seen_spread
        assert statistics.count.item() == 4 * 16, "the rollout is taken in after its update"
    finally:
        trainer.close()


def test_one_hot_codes_and_skipped_keys_pass_as_they_are_while_the_other_vectors_are_normalised() -> None:
    shape = {"code": (4,), "goal": (2,), "image": (3, 2, 2), "position": (2,)}
    space = gymnasium.spaces.Dict(
        {
            "code": OneHot(4),
            "goal": gymnasium.spaces.Box(-100.0, 100.0, (2,)),
            "image": gymnasium.spaces.Box(0.0, 1.0, (3, 2, 2)),
            "position": gymnasium.spaces.Box(-np.inf, np.inf, (2,)),
        }
    )
    batch = {
        "code": torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 2),  # only code 0 so far: codes 1 to 3 have variance 0
        "goal": torch.tensor([[40.0, 0.0], [60.0, 2.0]]),
        "image": torch.rand(2, 3, 2, 2),
        "position": torch.tensor([[40.0, 0.0], [60.0, 2.0]]),  # mean (50, 1), variance (100, 1)
    }
    obs = {
        "code": torch.tensor([[0.0, 0.0, 0.0, 1.0]]),
        "goal": torch.tensor([[60.0, 3.0]]),
        "image": torch.rand(1, 3, 2, 2),
        "position": torch.tensor([[60.0, 3.0]]),
    }
    normalised_everywhere = VectorNormalizers(shape, clip=5.0)
    normalised_everywhere.update(batch)
    assert normalised_everywhere(obs)["code"][0, 3] == 5.0  # a code never seen before jumps to the clip
    normalizers = VectorNormalizers(shape, clip=5.0, skip_keys=["goal"])
    normalizers.leave_one_hot_codes(space)
    normalizers.update(batch)
    out = normalizers(obs)
    assert torch.equal(out["code"], obs["code"]) and torch.equal(out["goal"], obs["goal"])
    assert out["image"] is obs["image"]
    torch.testing.assert_close(out["position"], torch.tensor([[1.0, 2.0]]))


@pytest.mark.parametrize(
    ("shape", "skip_keys", "message"),
    [
        ({"image": (3, 8, 8), "vector": (2,)}, ["vectr"], r"names \['vectr'\], .*whose keys are \['image', 'vector'\]"),
        ((3,), ["vector"], "one array, not a dict"),
        ({"image": (3, 8, 8), "vector": (2,)}, ["vector"], "leaves none of the observations' vectors"),
    ],
    ids=["unknown-key", "not-a-dict", "nothing-left"],
)
def test_skip_keys_that_do_not_fit_the_observations_are_refused(shape: object, skip_keys: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VectorNormalizers(shape, clip=10.0, skip_keys=skip_keys)


def test_skip_keys_are_checked_against_the_environments_keys_when_training_starts(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"names \['cues'\], .*whose keys are \['cue', 'image'\]"):
        new_trainer(
            tmp_path, "skip", environment={"type": "PocMemoryEnv", "dict_observation": True},
            normalize_observations=True, normalize_skip_keys=["cues"],
        )  # fmt: skip
    with pytest.raises(ConfigError, match="set normalize_observations true, or leave out normalize_skip_keys"):
        small_config(normalize_skip_keys=["cue"])


def test_a_resumed_run_keeps_the_skip_keys_its_checkpoint_was_trained_with() -> None:
    dict_poc = {"type": "PocMemoryEnv", "dict_observation": True}
    saved = small_config(environment=dict_poc, normalize_observations=True, normalize_skip_keys=["cue"]).to_dict()
    with pytest.raises(ValueError, match=r"normalize_skip_keys \['cue'\] -> \[\] \(the saved model was trained"):
        check_resume({"config": saved}, {**saved, "normalize_skip_keys": []})


def test_discrete_observations_and_the_symbolic_minigrid_view_are_declared_one_hot() -> None:
    env = create_env({"type": "Gymnasium", "id": "toy_env:ToyTupleObs-v0"})  # a Tuple of Discretes, as POPGym's
    assert all(isinstance(part, OneHot) for part in env.observation_space.values()), env.observation_space
    env.close()
    env = create_env({"type": "MiniGrid", "name": "MiniGrid-MemoryS7-v0", "view_size": 3, "observation": "symbolic"})
    assert isinstance(env.observation_space, OneHot), env.observation_space
    env.close()


def test_a_run_on_one_hot_observations_leaves_them_as_they_are(tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    trainer = new_trainer(
        tmp_path, "codes", environment={"type": "Gymnasium", "id": "toy_env:ToyTupleObs-v0"}, normalize_observations=True
    )
    try:
        assert "nothing is normalised (normalize_one_hot: true" in capsys.readouterr().err, "the user is told"
        assert not trainer.model.normalizer.normalises_anything()
        assert all(part.statistics.count == 0 for part in trainer.model.normalizer.parts), "no warm-up"
        obs = trainer.collector.obs
        assert all(torch.equal(value, obs[key]) for key, value in trainer.model.normalized(obs).items())
    finally:
        trainer.close()


def test_normalize_one_hot_normalises_the_one_hot_codes_too(tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    """The warm-up fills statistics for the codes, and the model sees them shifted and scaled, not as they are."""
    trainer = new_trainer(
        tmp_path, "codes-normalised", environment={"type": "Gymnasium", "id": "toy_env:ToyTupleObs-v0"},
        normalize_observations=True, normalize_one_hot=True,
    )  # fmt: skip
    try:
        assert all(bool(part.active.all()) for part in trainer.model.normalizer.parts)
        assert "nothing is normalised" not in capsys.readouterr().err
        assert all(part.statistics.count > 0 for part in trainer.model.normalizer.parts), "the warm-up took them in"
        obs = trainer.collector.obs
        assert not all(torch.equal(value, obs[key]) for key, value in trainer.model.normalized(obs).items())
    finally:
        trainer.close()


def test_normalize_one_hot_needs_normalize_observations_and_a_resume_keeps_it() -> None:
    with pytest.raises(ConfigError, match="set normalize_observations true, or leave out normalize_one_hot"):
        small_config(normalize_one_hot=True)
    saved = small_config(normalize_observations=True, normalize_one_hot=True).to_dict()
    with pytest.raises(ValueError, match=r"normalize_one_hot True -> False \(the saved statistics normalise"):
        check_resume({"config": saved}, {**saved, "normalize_one_hot": False})


def test_observations_and_rewards_are_clipped_at_both_ends() -> None:
    normalizers = VectorNormalizers((2,), clip=2.0)
    normalizers.update(torch.tensor([[-1.0, 10.0], [1.0, 30.0]]))  # mean (0, 20), std (1, 10)
    normalised = normalizers(torch.tensor([[-100.0, 20.0], [100.0, -1000.0]]))
    torch.testing.assert_close(normalised, torch.tensor([[-2.0, 0.0], [2.0, -2.0]]))
    scaler = RewardScaler(1, gamma=0.0, clip=1.0, device=CPU)  # gamma 0: the returns are the rewards, std about 70.7
    scaled = scaler.scale(torch.tensor([[1.0, -1.0, 100.0, -100.0]]), torch.zeros(1, 4, dtype=torch.bool))
    std = np.sqrt(np.var([1.0, -1.0, 100.0, -100.0]) + normalization.EPSILON)
    torch.testing.assert_close(scaled, torch.tensor([[1 / std, -1 / std, 1.0, -1.0]], dtype=torch.float32))


def test_observations_with_any_leading_axes_are_taken_in_as_rows_of_features() -> None:
    for leading in [(), (3, 5)]:  # one observation (F,), or workers x steps (N, T, F)
        obs = torch.randn(*leading, 4) * torch.tensor([1.0, 10.0, 100.0, 1000.0])
        normalizers = VectorNormalizers((4,), clip=10.0)
        normalizers.update(obs)
        expected = RunningMeanStd((4,))
        expected.update(obs.reshape(-1, 4))
        assert_same_statistics(normalizers.parts[0].statistics, expected, f"observations {tuple(obs.shape)}")


def test_the_statistics_are_summed_over_the_ranks_they_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under torchrun every rank takes the sums of all ranks in (all_reduce_sum with the run's Ranks); a part that fell
    # back to the default (one process) would leave each rank with statistics of its own.
    ranks, seen = object(), []
    monkeypatch.setattr(normalization, "all_reduce_sum", lambda tensor, given: seen.append(given) or tensor)
    VectorNormalizers({"a": (2,), "b": (3,), "image": (3, 4, 4)}, clip=5.0).update(
        {"a": torch.zeros(4, 2), "b": torch.ones(4, 3), "image": torch.zeros(4, 3, 4, 4)}, ranks
    )
    RewardScaler(2, gamma=0.9, clip=10.0, device=CPU).scale(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), ranks)
    assert len(seen) == 3 and all(given is ranks for given in seen), seen


def test_the_reward_scaler_keeps_its_state_on_the_device_it_is_given() -> None:
    meta = torch.device("meta")  # a device other than the CPU that needs no GPU
    scaler = RewardScaler(3, gamma=0.9, clip=10.0, device=meta)
    assert scaler.returns.device == meta and all(value.device == meta for value in scaler.statistics.state_dict().values())


def test_the_reward_scalers_state_restores_its_statistics_and_running_returns() -> None:
    scaler = RewardScaler(2, gamma=0.9, clip=10.0, device=CPU)
    scaler.scale(torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]]), torch.tensor([[False, True, False], [False] * 3]))
    state = scaler.state_dict()
    restored = RewardScaler(2, gamma=0.9, clip=10.0, device=CPU)
    restored.load_state_dict(state)
    assert_same_statistics(restored.statistics, scaler.statistics, "restored")
    assert torch.equal(restored.returns, scaler.returns) and restored.returns.abs().min() > 0
    scaler.scale(torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.bool))
    assert torch.equal(state["returns"], restored.returns), "the state is a copy, not the running tensors"


def test_the_running_returns_and_their_statistics_are_kept_in_float64() -> None:
    # Float32 returns would round each return to 7 digits before it reaches the float64 statistics.
    rewards = torch.rand(3, 50, generator=torch.Generator().manual_seed(0)) * 10
    scaler = RewardScaler(3, gamma=0.99, clip=10.0, device=CPU)
    scaler.scale(rewards, torch.zeros(3, 50, dtype=torch.bool))
    returns = np.zeros((3, 50))
    running = np.zeros(3)
    for t in range(50):
        running = running * 0.99 + rewards[:, t].double().numpy()
        returns[:, t] = running
    np.testing.assert_allclose(scaler.statistics.var.item(), returns.var(), rtol=1e-12)
    np.testing.assert_allclose(scaler.returns.numpy(), running, rtol=1e-14)


def test_a_model_written_in_half_precision_keeps_its_statistics_exact(tmp_path: object) -> None:
    # checkpoint.write_half_precision halves the float32 tensors: the statistics are float64, so a count past
    # float16's largest number (65504) and a mean with more digits than float16's 3 survive it.
    config = small_config(normalize_observations=True)
    model = ActorCriticModel(config, (3,), [3])
    model.normalizer.update(torch.randn(70_000, 3, generator=torch.Generator().manual_seed(0)) * 1000 + 12345.678)
    save_model(model, config, str(tmp_path / "full.pt"))
    write_half_precision(str(tmp_path / "full.pt"), str(tmp_path / "half.pt"))
    half, _ = load_model(str(tmp_path / "half.pt"), CPU)
    assert_same_statistics(half.normalizer.parts[0].statistics, model.normalizer.parts[0].statistics, "half precision")
    assert half.normalizer.parts[0].statistics.count.item() == 70_000
