"""lab/experiment.py and lab/plot.py end to end on a tiny config: results written, finished seeds skipped, unfinished seeds
resumed, failing seeds reported. Every train.py here takes a few seconds."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import yaml

import checkpoint
import evaluation
from checkpoint import load_file
from cli import module_environment
from lab import experiment, experiment_report, plot, seeds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPDATES = 8  # enough updates left after the first for a SIGINT to land before the run ends
SETS = [
    f"updates={UPDATES}",
    "n_workers=2",
    "worker_steps=16",
    "sequence_length=0",  # the automatic choice, whatever the config sets: 2 x 16 steps must still fill 8 minibatches
    "eval_interval=0",
    "checkpoint_interval=1",  # the same in every run of an experiment: the resumed seed needs it (below)
    "transformer.embed_dim=16",
    "transformer.num_blocks=1",
    "hidden_layer_size=16",
    "transformer.memory_length=8",
]
CONFIG = "configs/poc_memory_env.yaml"
EXPERIMENT = "tiny"


def run_experiment(folder: str, seeds: str, timeout: float = 120, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """lab/experiment.py on the tiny config in ``folder``, two seeds at a time, evaluated on 3 episodes."""
    command = [sys.executable, "-m", "lab.experiment", f"--config={CONFIG}", f"--seeds={seeds}", *flags]
    command += [f"--run-id={EXPERIMENT}", "--jobs=2", "--eval-episodes=3", "--cpu", *[f"--set={s}" for s in SETS]]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout, env=module_environment())


def last_json(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_files(folder: str, seed: int) -> list[str]:
    return [
        os.path.join(folder, "models", EXPERIMENT, f"seed-{seed}.nn"),
        os.path.join(folder, "models", EXPERIMENT, f"seed-{seed}", "checkpoint.pt"),
    ]


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, subprocess.CompletedProcess]:
    """A folder in which the tiny experiment ran with seeds 0 and 1, and that run's result."""
    folder = str(tmp_path_factory.mktemp("experiment"))
    return folder, run_experiment(folder, "0-1")


@pytest.fixture
def copy(tiny_experiment: tuple[str, subprocess.CompletedProcess], tmp_path: str) -> str:
    """A copy of the experiment's folder to change."""
    folder = os.path.join(tmp_path, "work")
    shutil.copytree(tiny_experiment[0], folder)
    return folder


@pytest.mark.slow
def test_experiment_writes_summary_plot_and_a_json_line(tiny_experiment: tuple[str, subprocess.CompletedProcess]) -> None:
    folder, result = tiny_experiment
    assert result.returncode == 0, result.stdout + result.stderr
    for seed in (0, 1):
        assert f"seed {seed}: started" in result.stdout and f"seed {seed}: finished" in result.stdout
        assert all(os.path.isfile(path) for path in run_files(folder, seed))  # run id <id>/seed-k works in train.py
    line = last_json(result)
    assert line["seeds"] == 2 and line["metric"] == "success" and line["config"] == CONFIG
    assert line["plot"] == f"results/{EXPERIMENT}/curves.png"
    assert len(line["final"]["per_seed"]) == 2
    assert line["final"]["ci_low"] <= line["final"]["iqm"] <= line["final"]["ci_high"]
    assert line["steps_to_threshold"]["threshold"] == 0.9 and line["steps_to_threshold"]["runs"] == 2
    assert os.path.getsize(os.path.join(folder, line["plot"])) > 1000
    with open(os.path.join(folder, "results", EXPERIMENT, "summary.json")) as file:
        summary = json.load(file)
    assert summary["seeds"] == [0, 1] and summary["overrides"] == SETS and summary["eval_episodes"] == 3
    assert summary["failures"] == [] and "-m lab.experiment" in summary["command"]
    curves = summary["curves"]
    steps_per_update = 2 * 16
    assert curves["tag"] == "episode/success_mean"
    assert curves["steps"][-1] == UPDATES * steps_per_update
    assert set(curves["steps"]) <= {steps_per_update * (k + 1) for k in range(UPDATES)}
    assert len(curves["iqm"]) == len(curves["ci_low"]) == len(curves["steps"])
    assert [len(values) for values in curves["per_seed"].values()] == [len(curves["steps"])] * 2
    assert [entry["final"] for entry in summary["per_seed"]] == line["final"]["per_seed"]
    assert all(entry["evaluation"]["success"]["episodes"] == 3 for entry in summary["per_seed"])
    falls = summary["falls_after_solving"]
    assert (falls["reach"], falls["floor"]) == (1.0, 0.9) and set(falls["per_seed"]) == {"0", "1"}
    for seed, entry in falls["per_seed"].items():  # the same numbers as the curve gives
        values = [value for value in curves["per_seed"][seed] if value is not None]
        if 1.0 not in values:
            assert entry == {"updates_below": None, "lowest": None}
        else:
            after = values[values.index(1.0) :]
            assert entry == {"updates_below": sum(value < 0.9 for value in after), "lowest": min(after)}
    assert f"seeds fell below 0.9 ({falls['updates_below']} updates in all)" in result.stdout


@pytest.mark.slow
def test_a_second_run_skips_finished_seeds(copy: str) -> None:
    mtimes = {path: os.path.getmtime(path) for seed in (0, 1) for path in run_files(copy, seed)}
    result = run_experiment(copy, "0-1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "started" not in result.stdout and "resumed" not in result.stdout
    assert f"seed 0: skipped: finished earlier (update {UPDATES}/{UPDATES}" in result.stdout
    assert "seed 1: skipped" in result.stdout
    assert {path: os.path.getmtime(path) for path in mtimes} == mtimes, "a finished seed was trained again"
    assert last_json(result)["seeds"] == 2


@pytest.mark.slow
def test_a_summary_of_some_seeds_names_the_records_it_leaves_out(copy: str) -> None:
    result = run_experiment(copy, "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seed 1: skipped" in result.stdout and "seed 0: " not in result.stdout
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        summary = json.load(file)
    assert summary["seeds"] == [1] and summary["other_recorded_seeds"] == [0]
    assert f"results/{EXPERIMENT} also holds the record of seed 0, which this summary leaves out" in result.stdout
    result = run_experiment(copy, "0-1")  # every recorded seed named: nothing left out, nothing said
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        assert json.load(file)["other_recorded_seeds"] == []
    assert "leaves out" not in result.stdout


@pytest.mark.slow
def test_deterministic_evaluation_is_recorded_and_not_mixed_with_sampled(copy: str) -> None:
    result = run_experiment(copy, "0-1", flags=("--deterministic",))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seed 0: skipped" in result.stdout and "evaluating 3 unseen episodes, most likely actions" in result.stdout
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        assert json.load(file)["deterministic"] is True
    with open(os.path.join(copy, "results", EXPERIMENT, "seed-0.json")) as file:
        record = json.load(file)
    assert record["deterministic"] is True
    model, config = checkpoint.load_model(run_files(copy, 0)[0], torch.device("cpu"))
    greedy = evaluation.evaluate(model, config, torch.device("cpu"), 3, seed=seeds.EVALUATION_SEED, deterministic=True)
    assert record["evaluation"] == greedy  # the recorded episodes are those of the most likely actions
    for path in run_files(copy, 0) + run_files(copy, 1):
        os.remove(path)
    result = run_experiment(copy, "0-1")  # sampled again, but the models that could play it are gone
    assert result.returncode == 1 and "its model is gone: use --eval-episodes 3 --deterministic" in result.stdout


@pytest.mark.slow
def test_records_let_a_folder_without_models_and_summaries_skip_finished_seeds(
    tiny_experiment: tuple[str, subprocess.CompletedProcess], copy: str
) -> None:
    """As on a new clone with the committed results/: the seeds count from their records, nothing is trained or
    evaluated again, and the summary is the same."""
    for seed in (0, 1):
        assert os.path.isfile(os.path.join(copy, "results", EXPERIMENT, f"seed-{seed}.json"))
    shutil.rmtree(os.path.join(copy, "models"))
    shutil.rmtree(os.path.join(copy, "summaries"))
    result = run_experiment(copy, "0-1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "started" not in result.stdout and "evaluating" not in result.stdout
    assert f"seed 0: skipped: finished earlier (update {UPDATES}/{UPDATES}, results/{EXPERIMENT}/seed-0.json)" in result.stdout
    assert f"seed 1: evaluation from results/{EXPERIMENT}/seed-1.json" in result.stdout
    assert not os.path.exists(os.path.join(copy, "models"))
    with open(os.path.join(tiny_experiment[0], "results", EXPERIMENT, "summary.json")) as file:
        before = json.load(file)
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        after = json.load(file)
    assert after["final"] == before["final"] and after["curves"] == before["curves"]
    assert [entry["status"] for entry in after["per_seed"]] == ["skipped", "skipped"]


@pytest.mark.slow
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_an_interrupted_experiment_keeps_the_seeds_it_finished(copy: str, inherited: str) -> None:
    """Seed 3 is evaluated and recorded as soon as it finishes, before seed 4 (trained after it) is interrupted; also
    when lab/experiment.py started with SIGINT ignored, as a background job of a script starts it."""
    command = [sys.executable, "-m", "lab.experiment", f"--config={CONFIG}", "--seeds=3-4", "--cpu"]
    command += [f"--run-id={EXPERIMENT}", "--jobs=1", "--eval-episodes=3", *[f"--set={s}" for s in SETS]]
    setup = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if inherited == "ignored" else None
    process = subprocess.Popen(
        command,
        cwd=copy,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=setup,
        env=module_environment(),
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("seed 4: started"):
                process.send_signal(signal.SIGINT)
                break
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    output = "".join(lines) + output
    assert process.returncode == 130, output
    assert output.index("seed 3: evaluating 3 unseen episodes") < output.index("seed 4: started")
    assert os.path.isfile(os.path.join(copy, "results", EXPERIMENT, "seed-3.json"))
    assert not os.path.exists(os.path.join(copy, "results", EXPERIMENT, "seed-4.json"))


@pytest.mark.slow
def test_a_record_of_another_config_is_refused(copy: str) -> None:
    shutil.rmtree(os.path.join(copy, "models"))
    command = [sys.executable, "-m", "lab.experiment", f"--config={CONFIG}", "--seeds=0", "--cpu"]
    command += [f"--run-id={EXPERIMENT}", *[f"--set={s}" for s in SETS], "--set=gamma=0.9"]
    result = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=60, env=module_environment())
    assert result.returncode == 1
    assert f"seed 0: cannot run: its record results/{EXPERIMENT}/seed-0.json was trained with another config" in result.stdout
    assert "gamma 0.99 -> 0.9" in result.stdout


@pytest.mark.slow
def test_an_unfinished_seed_is_resumed_not_restarted(copy: str) -> None:
    """Seed 2 is interrupted after its first checkpoint (as tests/test_reliability.py does), then the experiment over
    seeds 0-2 skips 0 and 1 and continues seed 2 from its checkpoint."""
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--cpu", f"--config={CONFIG}", f"--run-id={EXPERIMENT}/seed-2"]
    command += ["--seed=2", *[f"--set={s}" for s in SETS]]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # as lab/experiment.py's children: tiny models run slower on more threads
    process = subprocess.Popen(command, cwd=copy, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in process.stdout:
            if line.startswith("update    1/"):  # printed after the checkpoint of update 1 was written
                process.send_signal(signal.SIGINT)
                break
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    checkpoint = load_file(run_files(copy, 2)[1])
    stopped_at, summary_dir = checkpoint["update"], checkpoint["summary_dir"]
    assert 1 <= stopped_at < UPDATES, "the run ended before the SIGINT: nothing left to resume"

    result = run_experiment(copy, "0-2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seed 0: skipped" in result.stdout and "seed 1: skipped" in result.stdout
    assert f"seed 2: resumed from update {stopped_at}" in result.stdout and "seed 2: finished" in result.stdout
    with open(os.path.join(copy, "models", EXPERIMENT, "seed-2", "train.log")) as file:
        assert f"(update {stopped_at})" in file.read()  # train.py said it continued from the checkpoint
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        summary = json.load(file)
    seed_2 = summary["per_seed"][2]
    assert seed_2["status"] == "resumed" and seed_2["updates"] == UPDATES
    assert seed_2["summary_dir"] == summary_dir  # the same run's summaries, continued
    steps, values = summary["curves"]["steps"], summary["curves"]["per_seed"]["2"]
    after = [value for step, value in zip(steps, values, strict=True) if step > stopped_at * 32]
    assert after and any(value is not None for value in after)  # the curve goes on after the interruption
    assert last_json(result)["seeds"] == 3


@pytest.mark.slow
def test_a_failing_seed_is_reported_and_the_others_count(copy: str) -> None:
    blocker = os.path.join(copy, "models", EXPERIMENT, "seed-2")
    with open(blocker, "w") as file:  # a file where seed 2's checkpoint folder must go: its train.py fails
        file.write("in the way")
    result = run_experiment(copy, "0-2")
    assert result.returncode == 1
    assert "seed 2: failed: train.py exited with code 1" in result.stdout
    line = last_json(result)
    assert line["seeds"] == 2 and line["failures"] == [2]
    with open(os.path.join(copy, "results", EXPERIMENT, "summary.json")) as file:
        summary = json.load(file)
    assert [failure["seed"] for failure in summary["failures"]] == [2]
    assert summary["failures"][0]["stage"] == "training"
    assert summary["finished_seeds"] == [0, 1]


@pytest.mark.slow
def test_plot_overlays_experiments(tiny_experiment: tuple[str, subprocess.CompletedProcess], tmp_path: str) -> None:
    folder = tiny_experiment[0]
    other = os.path.join(folder, "results", "other")
    shutil.copytree(os.path.join(folder, "results", EXPERIMENT), other, dirs_exist_ok=True)
    command = [sys.executable, "-m", "lab.plot", f"results/{EXPERIMENT}", "results/other/summary.json"]
    run = functools.partial(subprocess.run, cwd=folder, capture_output=True, text=True, timeout=60, env=module_environment())
    result = run(command)
    assert result.returncode == 0, result.stderr
    assert os.path.getsize(os.path.join(folder, "plots", "compare.png")) > 1000  # scratch output, git-ignored
    out = os.path.join(tmp_path, "figure.svg")
    result = run([*command, f"--out={out}", "--title=T"])
    assert result.returncode == 0 and os.path.isfile(out)
    result = run([*command[:3], "results/missing"])
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.slow
def test_plot_rebuilds_the_curves_of_another_metric(tiny_experiment: tuple[str, subprocess.CompletedProcess]) -> None:
    folder = os.path.join(tiny_experiment[0], "results", EXPERIMENT)
    summary = plot.load_summary(folder)
    lengths = plot.with_metric(summary, folder, "length")
    assert lengths["metric"] == "length" and lengths["curves"]["tag"] == "episode/length_mean"
    for seed in summary["finished_seeds"]:
        with open(os.path.join(folder, f"seed-{seed}.json")) as file:
            logged = dict(json.load(file)["curves"]["episode/length_mean"])
        rebuilt = dict(zip(lengths["curves"]["steps"], lengths["curves"]["per_seed"][str(seed)], strict=True))
        assert {step: value for step, value in rebuilt.items() if step in logged} == logged
    kl = plot.with_metric(summary, folder, "training/approx_kl")  # a tag as it is: the policy's step per update
    assert kl["curves"]["tag"] == "training/approx_kl" and all(value >= 0 for value in kl["curves"]["iqm"])
    steps = plot.with_metric(summary, folder, "training/gradient_steps")  # target_kl off: every minibatch stepped
    with open(os.path.join(ROOT, CONFIG)) as file:
        config = yaml.safe_load(file)
    assert set(steps["curves"]["iqm"]) == {config["epochs"] * config["n_mini_batch"]}
    assert plot.with_metric(summary, folder, summary["metric"]) is summary
    with pytest.raises(ValueError, match="has no 'episode/colour_mean'"):
        plot.with_metric(summary, folder, "colour")


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--seeds=0-1", "--run-id=x"], ["--config missing"]),
        ([f"--config={CONFIG}", "--seeds=3-1", "--run-id=x"], ["3-1", "empty"]),
        ([f"--config={CONFIG}", "--seeds=0,0", "--run-id=x"], ["seed 0 more than once"]),
        ([f"--config={CONFIG}", "--seeds=a-b", "--run-id=x"], ["range like 0-4"]),
        ([f"--config={CONFIG}", "--seeds=0", "--run-id=../x"], ["--run-id", "relative"]),
        ([f"--config={CONFIG}", "--seeds=0", "--run-id=x", "--jobs=0"], ["--jobs", "at least 1"]),
        ([f"--config={CONFIG}", "--seeds=0", "--run-id=x", "--threshold=high"], ["--threshold", "a number"]),
        ([f"--config={CONFIG}", "--seeds=0", "--run-id=x", "--set=updatez=3"], ["config error", "updatez"]),
        ([f"--config={CONFIG}", "--sedes=0", "--run-id=x"], ["did you mean --seeds"]),
    ],
    ids=["missing", "empty range", "duplicate", "not a number", "run id", "jobs", "threshold", "bad key", "misspelt"],
)
def test_bad_command_lines_stop_before_anything_starts(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, argv: list[str], words: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code = experiment.main(argv)
    except SystemExit as error:  # cli.parse_args exits for flags that do not fit the usage
        code = error.code
    stderr = capsys.readouterr().err
    assert code == 2
    for word in words:
        assert word in stderr, stderr
    assert os.listdir(tmp_path) == []  # nothing started


def test_config_changes_ignore_how_often_a_checkpoint_is_written() -> None:
    # A model trained with checkpoints every 2 updates is its config's model; another learning setting is not.
    from conftest import small_config

    base = small_config().to_dict()
    assert seeds.config_changes(small_config(checkpoint_interval=2).to_dict(), base) == []
    assert seeds.config_changes(small_config(gamma=0.9).to_dict(), base) == ["gamma 0.9 -> 0.99"]


def test_config_changes_ignore_the_section_of_an_unused_memory() -> None:
    from conftest import small_config

    gru = small_config(memory="gru").to_dict()
    changed = small_config({"memory_gradients": True}, memory="gru").to_dict()
    assert seeds.config_changes(gru, changed) == []
    wider = small_config(memory="gru", recurrence={"hidden_state_size": 8}).to_dict()
    assert seeds.config_changes(gru, wider) == ["recurrence.hidden_state_size 256 -> 8"]
    trxl, trxl_changed = small_config().to_dict(), small_config({"memory_gradients": True}).to_dict()
    assert seeds.config_changes(trxl, trxl_changed) == ["transformer.memory_gradients False -> True"]


@pytest.mark.parametrize("reached,expected", [(0, "no seed reached success 1.00 in training"), (2, "0 of 2 seeds fell below")])
def test_report_of_falls_after_solving(capsys: pytest.CaptureFixture, reached: int, expected: str) -> None:
    summary = {
        "metric": "success", "eval_episodes": 10, "per_seed": [], "failures": [],
        "final": {"iqm": 0.5, "mean": 0.5, "ci_low": 0.4, "ci_high": 0.6},
        "steps_to_threshold": {"threshold": 0.9, "reached": 0, "runs": 2, "median": None},
        "falls_after_solving": {"reach": 1.0, "floor": 0.9, "runs_reached": reached, "runs_below": 0, "updates_below": 0},
    }  # fmt: skip
    experiment_report.print_report([], summary)
    out = capsys.readouterr().out
    assert expected in out and ("0 of 0" not in out)


def finished_seed(seed: int, evaluation: list[dict[str, float]], success_curve: list[list[float]]) -> seeds.Seed:
    """A finished seed with its record: its evaluation episodes and its training's success curve."""
    run = seeds.Seed(seed, f"{EXPERIMENT}/seed-{seed}", action="finished", evaluation=evaluation)
    run.checkpoint = {"summary_dir": f"summaries/{EXPERIMENT}/seed-{seed}/0"}
    run.record = {"summary_dir": run.checkpoint["summary_dir"], "curves": {seeds.SUCCESS_CURVE: success_curve}}
    return run


CUT = {"reward": -1.0, "length": 64.0, "evaluation_cut": 1.0}


def test_a_seed_with_every_evaluation_episode_cut_keeps_the_success_metric() -> None:
    """One seed's episodes all ran into the step limit: the experiment still reports success, that seed's 0."""
    ended = finished_seed(0, [{"reward": 1.0, "length": 5.0, "success": 1.0, "evaluation_cut": 0.0}], [[32, 1.0]])
    stuck = finished_seed(1, [dict(CUT), dict(CUT)], [])  # its training ended no episode either
    assert experiment.evaluation_metric([ended, stuck]) == "success"
    assert [result["success"] for result in stuck.evaluation] == [0.0, 0.0]
    assert experiment.evaluation_metric([finished_seed(2, [{"reward": 3.0, "length": 5.0}], [])]) == "reward"


def test_a_seed_whose_training_reported_success_counts_its_cut_episodes_as_failures() -> None:
    assert seeds.reports_success(finished_seed(0, [dict(CUT)], [[32, 0.5]]))
    assert not seeds.reports_success(finished_seed(0, [dict(CUT)], []))


def test_threads_per_seed(tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--threads is each seed's, shown in --help; without it train.py's load-aware rule shares the free cores among the
    seeds that train at once."""
    with pytest.raises(SystemExit):
        experiment.main(["--help"])
    assert "--threads=<n>" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    given, shares = [], []
    monkeypatch.setattr(experiment, "run_seeds", lambda runs, path, sets, updates, jobs, threads, *rest: given.append(threads))
    monkeypatch.setattr(experiment, "default_threads", lambda trainings: shares.append(trainings) or 5)
    argv = [f"--config={CONFIG}", "--run-id=x", "--cpu"]
    experiment.main([*argv, "--seeds=0-2", "--threads=3"])
    experiment.main([*argv, "--seeds=0-2", "--jobs=2"])
    experiment.main([*argv, "--seeds=0", "--jobs=2"])  # one seed to train: all the free cores
    assert given == [3, 5, 5] and shares == [2, 1]
