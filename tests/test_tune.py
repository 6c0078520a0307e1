"""lab/tune.py: a tiny search end to end, an interrupted study continued, pruning, and search files answered with clear
errors. Every train.py here takes a few seconds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import optuna
import pytest
import torch
import yaml

from cli import module_environment, parse_args
from config import load_config
from lab import tune
from summaries import console_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = ["n_workers=2", "worker_steps=16", "n_mini_batch=2", "sequence_length=8", "transformer.embed_dim=16",
        "transformer.num_blocks=1", "hidden_layer_size=16", "transformer.memory_length=8",
        "transformer.positional_encoding=relative"]  # fmt: skip
SEARCH = (
    "learning_rate_schedule.initial: {low: 1.0e-4, high: 1.0e-3, log: true}\n"
    "transformer.query_position: {choices: [true, false]}\n"
)


def tune_command(study: str, trials: int, updates: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    command = [sys.executable, "-m", "lab.tune", "--config=configs/poc_memory_env.yaml", "--search=search.yaml"]
    command += [f"--study={study}", f"--trials={trials}", "--cpu", f"--set=updates={updates}"]
    command += [f"--set={s}" for s in SETS] + list(extra)
    return command if any(flag.startswith("--seeds=") for flag in extra) else command + ["--seeds=2"]


def run_tune(
    folder: str, study: str, trials: int, updates: int = 2, search: str = SEARCH, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    with open(os.path.join(folder, "search.yaml"), "w") as file:
        file.write(search)
    command = tune_command(study, trials, updates, extra)
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env=module_environment())


def test_parse_line_reads_the_console_line() -> None:
    stats = {"policy_loss": 0.1, "value_loss": 0.2, "entropy": 1.0, "approx_kl": 0.01, "kl_stop": 0}
    with_success = console_line(3, 10, 96, 100.0, {"reward": 0.5, "length": 9.0, "success": 0.75}, stats)
    assert tune.parse_line(with_success) == (3, 0.75)
    assert tune.parse_line(console_line(4, 10, 128, 100.0, {"reward": -1.25, "length": 9.0}, stats)) == (4, -1.25)
    assert tune.parse_line(console_line(5, 10, 160, 100.0, {}, stats)) == (5, None)
    assert tune.parse_line("  evaluating 10 unseen episodes ... reward 0.3") is None


def test_score_auc_and_final() -> None:
    curve = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert tune.score(curve, "auc") == pytest.approx(5 / 8)
    assert tune.score(curve, "final") == 1.0  # the last quarter, 2 updates


@pytest.mark.slow
def test_tiny_search_end_to_end(tmp_path: str) -> None:
    result = run_tune(str(tmp_path), "tiny", trials=2)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["trials"]["complete"] == 2
    folder = os.path.join(tmp_path, "results", "tune", "tiny")
    for name in ("study.db", "best.yaml", "trials.md", "summary.json"):
        assert os.path.isfile(os.path.join(folder, name)), name
    best = load_config(os.path.join(folder, "best.yaml"))  # a standalone config
    assert best.learning_rate_schedule.initial == pytest.approx(summary["best"]["params"]["learning_rate_schedule.initial"])
    assert best.transformer.query_position == summary["best"]["params"]["transformer.query_position"]
    own = load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"))  # its budget, not the search's
    assert (best.updates, best.eval_interval) == (own.updates, own.eval_interval) and best.transformer.embed_dim == 16
    assert "trial 1: update 2/2: seeds" in result.stdout
    table = open(os.path.join(folder, "trials.md")).read()
    assert "| trial | score |" in table and table.count("\n| ") >= 3
    # The first trial is the config as it is, marked as such.
    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"))
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{folder}/study.db")
    assert study.trials[0].params == {"learning_rate_schedule.initial": config.learning_rate_schedule.initial,
                                      "transformer.query_position": config.transformer.query_position}  # fmt: skip
    assert summary["base"]["trial"] == 0 and summary["base"]["state"] == "complete"
    assert "| 0 (base config) |" in table
    # Both trials trained their two seeds for 2 updates through train.py.
    for trial in (0, 1):
        for seed in (0, 1):
            log = open(os.path.join(tmp_path, "models", "tune", "tiny", f"trial-{trial}", f"seed-{seed}.log")).read()
            assert "update    2/2" in log


@pytest.mark.slow
def test_interrupted_study_continues(tmp_path: str) -> None:
    folder = os.path.join(tmp_path, "results", "tune", "again")
    os.makedirs(folder)
    study = optuna.create_study(study_name="again", storage=f"sqlite:///{folder}/study.db", direction="maximize")
    distributions = {
        "learning_rate_schedule.initial": optuna.distributions.FloatDistribution(1e-4, 1e-3, log=True),
        "transformer.query_position": optuna.distributions.CategoricalDistribution([True, False]),
    }
    left = study.ask(distributions)  # a trial left running by a killed process
    result = run_tune(str(tmp_path), "again", trials=1)
    assert result.returncode == 0, result.stderr
    assert "1 interrupted trial(s) queued again" in result.stdout
    study = optuna.load_study(study_name="again", storage=f"sqlite:///{folder}/study.db")
    states = [trial.state for trial in study.trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]
    assert study.trials[1].params == left.params  # the interrupted trial's values, trained again


@pytest.mark.slow  # trains its seeds as train.py subprocesses
def test_pruning_stops_the_seeds(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open("search.yaml", "w") as file:
        file.write(SEARCH)
    argv = ["--config=configs/poc_memory_env.yaml", "--search=search.yaml", "--study=pruned", "--seeds=2", "--cpu"]
    argv += ["--set=updates=400", *[f"--set={s}" for s in SETS]]  # long enough that the stop lands before the end
    args = parse_args(tune.__doc__, argv)
    base = tune.apply_overrides(
        tune.read_yaml(tune.config_path(args["--config"]), "config"), tune.parse_overrides(args["--set"])
    )
    settings = tune.Study(args, base, tune.load_search("search.yaml", base), tune.config_path(args["--config"]))
    # A pruner no trial can satisfy (the metric never exceeds 10): stops the trial at its first report.
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=10.0))
    study.optimize(settings, n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    for seed in (0, 1):
        log = open(os.path.join("models", "tune", "pruned", "trial-0", f"seed-{seed}.log")).read()
        assert "update    1/400" in log and "update  400/400" not in log


@pytest.mark.slow
@pytest.mark.parametrize(
    "search,expected",
    [
        ("transformer.memory_lenght: {low: 4, high: 16}\n", ["memory_lenght", "unknown key"]),
        ("learning_rate_schedule.initial: {low: 1.0e-3, high: 1.0e-4}\n", ["low < high"]),
        ("transformer.gtrxl: {choices: []}\n", ["non-empty list"]),
        ("transformer.gtrxl: {values: [true]}\n", ["unknown field 'values'"]),
        ("transformer.num_heads: {choices: [3]}\n", ["transformer.num_heads", "divisible"]),
        ("- a list\n", ["must be a mapping"]),
    ],
)
def test_bad_search_file_is_refused(tmp_path: str, search: str, expected: list[str]) -> None:
    result = run_tune(str(tmp_path), "bad", trials=1, search=search)
    assert result.returncode == 2
    assert "error" in result.stderr and "search file" in result.stderr
    for text in expected:
        assert text in result.stderr
    assert not os.path.exists(os.path.join(tmp_path, "results", "tune", "bad"))  # refused before any work


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "configs", "search"))))
def test_shipped_search_files_fit_the_config_they_name(name: str) -> None:
    """Each shipped search file names its command in a comment; every value it can take gives a valid config on top of
    that command's --config."""
    path = os.path.join(ROOT, "configs", "search", name)
    with open(path) as file:
        command = next(line for line in file if "python -m lab.tune" in line)
    config = command.split("--config ")[1].split()[0]
    with open(os.path.join(ROOT, config)) as file:
        base = yaml.safe_load(file)
    assert tune.load_search(path, base)


def test_base_values_are_the_configs_own_or_none_outside_the_space() -> None:
    with open(os.path.join(ROOT, "configs", "poc_memory_env.yaml")) as file:
        base = yaml.safe_load(file)
    config = load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"))
    space = {"learning_rate_schedule.initial": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
             "epochs": {"low": 1, "high": 16}, "transformer.query_position": {"choices": [True, False]}}  # fmt: skip
    assert tune.base_values(base, space) == {
        "learning_rate_schedule.initial": config.learning_rate_schedule.initial,
        "epochs": config.epochs,
        "transformer.query_position": config.transformer.query_position,  # a default counts
    }
    assert tune.base_values(base, space | {"epochs": {"low": config.epochs + 1, "high": 32}}) is None
    assert tune.base_values(base, space | {"transformer.query_position": {"choices": [None]}}) is None


@pytest.mark.parametrize(
    "flags,warmup", [([], 0.25), (["--objective=final"], 1.0), (["--objective=final", "--warmup=0.5"], 0.5)]
)
def test_warmup_defaults_to_no_pruning_for_the_final_objective(flags: list[str], warmup: float) -> None:
    args = parse_args(tune.__doc__, ["--config=configs/poc_memory_env.yaml", "--search=s.yaml", "--study=w", *flags])
    base = tune.read_yaml(tune.config_path(args["--config"]), "config")
    assert tune.Study(args, base, {}, tune.config_path(args["--config"])).warmup == warmup


@pytest.mark.slow
def test_values_sampled_again_are_not_trained_again(tmp_path: str) -> None:
    """A space of one value: the base config is trial 0, trial 1 samples the same values and takes its score."""
    result = run_tune(str(tmp_path), "again", trials=2, search="transformer.query_position: {choices: [true]}\n")
    assert result.returncode == 0, result.stderr
    assert "trial 1: " in result.stdout and "the values of trial 0: not trained again" in result.stdout
    study = optuna.load_study(study_name="again", storage=f"sqlite:///{tmp_path}/results/tune/again/study.db")
    first, second = study.trials
    assert second.value == first.value and second.user_attrs["repeat_of"] == 0
    assert second.user_attrs["per_seed"] == first.user_attrs["per_seed"]
    assert not os.path.exists(os.path.join(tmp_path, "models", "tune", "again", "trial-1"))
    table = open(os.path.join(tmp_path, "results", "tune", "again", "trials.md")).read()
    assert "(1 more trials repeated values scored before)" in table and "| 1 |" not in table


@pytest.mark.slow
def test_a_study_continued_under_other_settings_is_refused(tmp_path: str) -> None:
    """A study records its settings when it starts; another --set, --seeds, --objective or
    search space is refused with each difference named, and --force-continue continues it, recording the change."""
    assert run_tune(str(tmp_path), "kept", trials=1).returncode == 0
    same = run_tune(str(tmp_path), "kept", trials=1)  # the same settings: nothing left to run
    assert same.returncode == 0 and "1 of 1 trials done" in same.stdout, same.stderr
    other = ("--seeds=3", "--objective=final")
    search = SEARCH.replace("1.0e-3", "2.0e-3")
    refused = run_tune(str(tmp_path), "kept", trials=1, updates=3, search=search, extra=other)
    assert refused.returncode == 2
    for text in ("study 'kept' was started with other settings", "config key 'updates': 2 then, 3 now",
                 "search key 'learning_rate_schedule.initial'", "--seeds: 2 then, 3 now", "--objective: 'auc' then",
                 "--study=<new id>", "--force-continue"):  # fmt: skip
        assert text in refused.stderr, (text, refused.stderr)
    forced = run_tune(str(tmp_path), "kept", trials=1, updates=3, search=search, extra=(*other, "--force-continue"))
    assert forced.returncode == 0 and "continues under other settings (--force-continue)" in forced.stdout
    study = optuna.load_study(study_name="kept", storage=f"sqlite:///{tmp_path}/results/tune/kept/study.db")
    assert study.user_attrs["settings"]["seeds"] == 3 and study.user_attrs["settings"]["base"]["updates"] == 3
    assert len(study.user_attrs["forced_continue"]) == 1
    assert (
        "Continued under other settings (--force-continue) after 1 trials"
        in open(os.path.join(tmp_path, "results", "tune", "kept", "best.yaml")).read()
    )
    assert run_tune(str(tmp_path), "kept", trials=1, updates=3, search=search, extra=other).returncode == 0  # the new ones


def seed_processes(study: str, marker: str = "--run-id=tune/{study}/") -> dict[int, str]:
    """The live train.py children of a study and their environment workers (their command line names the study's
    runs), or the live processes whose command line holds ``marker``: {pid: command line}."""
    marker = marker.format(study=study)
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as file:
                zombie = file.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:  # ended meanwhile
            continue
        if marker in command and not zombie:
            found[int(pid)] = command
    return found


def seed_runs(study: str) -> dict[str, int]:
    """{run id: how many train.py processes train it} of a study's live seeds."""
    runs: dict[str, int] = {}
    for command in seed_processes(study).values():
        if "train.py" in command:
            run_id = re.search(r"--run-id=(\S+)", command)[1]
            runs[run_id] = runs.get(run_id, 0) + 1
    return runs


@contextlib.contextmanager
def long_study(folder: str, study: str) -> Iterator[subprocess.Popen]:
    """A study of 2 trials at a time, 2 seeds each, too long to finish during the test, once all 4 seeds train, each
    run once (two parallel trials once both took the base config's queued trial: 2 run ids, each trained twice);
    killed afterwards whatever the test did."""
    with open(os.path.join(folder, "search.yaml"), "w") as file:
        file.write(SEARCH)
    command = tune_command(study, trials=4, updates=10_000, extra=("--jobs=2",))
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=module_environment())  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:
            run_ids = seed_runs(study)
            assert all(count == 1 for count in run_ids.values()), f"a seed trains twice: {run_ids}"
            if len(run_ids) == 4:
                break
            assert process.poll() is None, process.communicate()
            assert time.time() < deadline, f"in 2 minutes only these seeds started: {run_ids}"
            time.sleep(0.2)
        yield process
    finally:
        process.kill()  # its seeds die with it (PR_SET_PDEATHSIG)
        process.communicate()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_study_of_parallel_trials_within_seconds(tmp_path: str, sig: signal.Signals) -> None:
    """Ctrl-C or SIGTERM with --jobs 2: no waiting for the running trials, no seed left training; the interrupted
    trials are queued again by the next invocation, the base config's still marked."""
    study = f"stop-{sig.name.lower()}"
    with long_study(str(tmp_path), study) as process:
        started = time.time()
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
        assert time.time() - started < 15 and process.returncode == 130, stderr
    assert "run the same command again to continue the study" in stderr
    assert seed_processes(study) == {}
    storage = f"sqlite:///{tmp_path}/results/tune/{study}/study.db"
    stopped = optuna.load_study(study_name=study, storage=storage)
    trials = stopped.trials
    assert {trial.state for trial in trials} == {optuna.trial.TrialState.FAIL}
    assert all(trial.user_attrs["interrupted"] for trial in trials)
    assert tune.requeue_unfinished(stopped) == len(trials)  # what the same command does first when run again
    waiting = stopped.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting[0].user_attrs.get("base") and not any(trial.user_attrs.get("base") for trial in waiting[1:])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG")
def test_a_killed_study_leaves_no_seed_training(tmp_path: str) -> None:
    """A scheduler's SIGKILL reaches tune.py only: its seeds, in process groups of their own, end with it."""
    with long_study(str(tmp_path), "killed"):
        pass  # leaving the block kills tune.py
    deadline = time.time() + 10
    while seed_processes("killed") and time.time() < deadline:
        time.sleep(0.2)
    assert seed_processes("killed") == {}


def test_a_crashed_seed_fails_its_trial_at_once(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 0 crashes at once; seed 1 would run for a minute: it is killed and the trial fails in seconds."""
    monkeypatch.chdir(tmp_path)
    args = parse_args(tune.__doc__, ["--config=configs/poc_memory_env.yaml", "--search=s.yaml", "--study=crash"])
    base = tune.read_yaml(tune.config_path(args["--config"]), "config")
    space = {"transformer.query_position": {"choices": [True]}}
    settings = tune.Study(args, base, space, tune.config_path(args["--config"]))
    scripts = ["import sys; print('boom'); sys.exit(3)", "import time; time.sleep(60)  # the sibling"]
    monkeypatch.setattr(settings, "command", lambda trial, seed, values: [sys.executable, "-c", scripts[seed]])
    study = optuna.create_study(direction="maximize")
    started = time.time()
    study.optimize(settings, n_trials=1, catch=(RuntimeError,))
    assert time.time() - started < 15
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert "seed 0 failed (exit code 3): boom" in study.trials[0].system_attrs.get(
        "fail_reason", "seed 0 failed (exit code 3): boom"
    )
    assert seed_processes("crash", marker="# the sibling") == {}


def test_a_trial_of_a_live_tune_is_not_requeued() -> None:
    """A second tune.py on the same study leaves the first one's running trials alone; a dead owner's are queued
    again, with the base mark."""
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"x": 1}, user_attrs={"base": True})
    distributions = {"x": optuna.distributions.IntDistribution(0, 2)}
    dead, live = study.ask(distributions), study.ask(distributions)  # the first takes the queued base config
    live.set_user_attr("owner", {"host": tune.socket.gethostname(), "pid": os.getppid()})  # pytest's parent: alive
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead.set_user_attr("owner", {"host": tune.socket.gethostname(), "pid": int(ended.stdout)})
    assert tune.requeue_unfinished(study) == 1
    states = {trial.number: trial.state for trial in study.trials}
    assert states[live.number] == optuna.trial.TrialState.RUNNING and states[dead.number] == optuna.trial.TrialState.FAIL
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [(trial.system_attrs["fixed_params"], trial.user_attrs.get("base")) for trial in waiting] == [({"x": 1}, True)]


SPACE = {"transformer.query_position": {"choices": [True, False]}}
STATS = {"policy_loss": 0.1, "value_loss": 0.2, "entropy": 1.0, "approx_kl": 0.01, "kl_stop": 0}


def study_settings(*flags: str) -> tune.Study:
    """A study's settings as tune.main builds them (without the search's eval_interval 0), over SPACE."""
    args = parse_args(tune.__doc__, ["--config=configs/poc_memory_env.yaml", "--search=s.yaml", "--study=s", *flags])
    path = tune.config_path(args["--config"])
    raw = tune.read_yaml(path, "config")
    return tune.Study(args, tune.apply_overrides(raw, tune.parse_overrides(args["--set"])), SPACE, path, raw)


def fake_seed(lines: list[str]) -> list[str]:
    """The command of a stand-in for a seed's train.py that prints ``lines`` and ends."""
    return [sys.executable, "-c", f"import sys; sys.stdout.write({''.join(line + chr(10) for line in lines)!r})"]


def test_a_changed_default_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same YAML and --sets resolve to another config once a default changed (transformer.recency_bias did):
    continuing the study is refused, naming the key; --force-continue continues it."""
    import config

    study = optuna.create_study(direction="maximize")
    tune.check_settings(study, study_settings(), force=False)
    assert study.user_attrs["settings"]["resolved"]["transformer"]["recency_bias"] is True
    meaning = config.TRANSFORMER_SCHEMA["recency_bias"][3]
    monkeypatch.setitem(config.TRANSFORMER_SCHEMA, "recency_bias", (bool, False, None, meaning))
    with pytest.raises(tune.SettingsError) as refused:
        tune.check_settings(study, study_settings(), force=False)
    assert "config key 'transformer.recency_bias': True then, False now" in str(refused.value)
    tune.check_settings(study, study_settings(), force=True)
    assert study.user_attrs["settings"]["resolved"]["transformer"]["recency_bias"] is False


def test_another_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A study started on CUDA, continued with --cpu (or on a machine without CUDA), would mix the devices' scores."""
    monkeypatch.setattr(tune.torch.cuda, "is_available", lambda: True)
    study = optuna.create_study(direction="maximize")
    tune.check_settings(study, study_settings(), force=False)
    with pytest.raises(tune.SettingsError, match="device: 'cuda' then, 'cpu' now"):
        tune.check_settings(study, study_settings("--cpu"), force=False)


def test_settings_recorded_before_the_resolved_config_take_the_current_one(capsys: pytest.CaptureFixture) -> None:
    study = optuna.create_study(direction="maximize")
    old = {key: value for key, value in tune.recorded_settings(study_settings()).items() if key not in tune.RECORDED_SINCE}
    study.set_user_attr("settings", old)
    tune.check_settings(study, study_settings(), force=False)
    assert "recorded no resolved and no device" in capsys.readouterr().out
    assert set(tune.RECORDED_SINCE) <= set(study.user_attrs["settings"])
    with pytest.raises(tune.SettingsError, match="config key 'gamma': 0.99 then, 0.9 now"):
        tune.check_settings(study, study_settings("--set=gamma=0.9"), force=False)


def test_a_second_main_after_an_interrupt_runs(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted main() leaves the stop flag set; the next main() in the same process must clear it, not return 130
    at once."""
    monkeypatch.chdir(tmp_path)
    with open("search.yaml", "w") as file:
        file.write("transformer.query_position: {choices: [true]}\n")
    line = console_line(1, 1, 32, 100.0, {"reward": 1.0, "length": 5.0, "success": 1.0}, STATS)
    monkeypatch.setattr(tune.Study, "command", lambda self, trial, seed, values: fake_seed([line]))
    tune.STOPPING.set()  # as _raise_interrupt leaves it
    argv = ["--config=configs/poc_memory_env.yaml", "--search=search.yaml", "--study=again", "--trials=1", "--seeds=1"]
    assert tune.main([*argv, "--set=updates=1", "--cpu"]) == 0
    assert not tune.STOPPING.is_set()


def test_a_trial_prints_its_progress_per_update(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = study_settings("--seeds=2", "--set=updates=2")
    episodes = [{"reward": 1.0, "length": 5.0, "success": value} for value in (0.5, 1.0, 0.25, 0.75)]
    lines = [[console_line(update + 1, 2, 32, 100.0, episodes[2 * seed + update], STATS) for update in (0, 1)]
             for seed in (0, 1)]  # fmt: skip
    monkeypatch.setattr(settings, "command", lambda trial, seed, values: fake_seed(lines[seed]))
    study = optuna.create_study(direction="maximize")
    study.optimize(settings, n_trials=1)
    out = capsys.readouterr().out
    assert "trial 0: update 1/2: seeds 0.500, 0.250, running score 0.3750" in out
    assert "trial 0: update 2/2: seeds 1.000, 0.750, running score 0.6250" in out


def test_a_seed_log_is_written_while_the_seed_runs(tmp_path: str) -> None:
    """The log of a seed that printed a line and trains on holds that line (it was 0 bytes until the seed ended)."""
    go = os.path.join(tmp_path, "go")
    script = f"import os, time; print('update    1/9', flush=True)\nwhile not os.path.exists({go!r}): time.sleep(0.05)"
    log = os.path.join(tmp_path, "seed-0.log")
    run = tune.SeedRun([sys.executable, "-c", script], 1, log)
    try:
        deadline = time.time() + 20
        while not os.path.exists(log) or "update    1/9" not in open(log).read():
            assert time.time() < deadline, "the seed's first line did not reach its log while it ran"
            time.sleep(0.05)
        assert run.process.poll() is None
    finally:
        open(go, "w").close()
        run.process.wait(timeout=20)
        run.reader.join(timeout=10)


def test_best_yaml_keeps_the_base_configs_budget() -> None:
    """The trials train with the search's updates and eval_interval 0; best.yaml is the config to train, with the
    file's own budget (and the other --sets and the best values)."""
    settings = study_settings("--set=updates=2", "--set=eval_interval=0", "--set=gamma=0.9")
    best = tune.best_config(settings, {"transformer.query_position": False})
    own = load_config(os.path.join(ROOT, "configs", "poc_memory_env.yaml"))
    config = tune.validate_config(best)
    assert (config.updates, config.eval_interval) == (own.updates, own.eval_interval) != (2, 0)
    assert config.gamma == 0.9 and config.transformer.query_position is False
    note = tune.budget_note(settings, best)
    assert "trained with updates 2, eval_interval 0" in note and f"own: updates {own.updates}," in note


def test_importance_from_few_trials_is_marked_a_rough_guess(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = study_settings("--set=updates=2")
    settings.space = {"learning_rate_schedule.initial": {"low": 1e-4, "high": 1e-3}, **SPACE}
    distributions = {
        "learning_rate_schedule.initial": optuna.distributions.FloatDistribution(1e-4, 1e-3),
        "transformer.query_position": optuna.distributions.CategoricalDistribution([True, False]),
    }
    study = optuna.create_study(direction="maximize")
    for k in range(4):
        params = {"learning_rate_schedule.initial": 1e-4 * (k + 1), "transformer.query_position": k % 2 == 0}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=float(k)))
    os.makedirs(settings.folder)
    summary = tune.report(study, settings)
    assert summary["importance"] is not None
    assert "from 4 finished trials only (fewer than 10)" in summary["importance_warning"]
    assert "warning: importance: from 4 finished trials" in capsys.readouterr().out
    assert "fewer than 10" in open(os.path.join(settings.folder, "trials.md")).read()
    assert tune.importance_warning(tune.MIN_IMPORTANCE_TRIALS) is None
    assert "eval_interval" in open(os.path.join(settings.folder, "best.yaml")).read()


def test_threads_per_seed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--threads is each seed's, shown in --help; without it the load-aware rule of train.py shares the free cores
    among the jobs x seeds trainings."""
    with pytest.raises(SystemExit):
        parse_args(tune.__doc__, ["--help"])
    assert "--threads=<n>" in capsys.readouterr().out
    assert study_settings("--threads=3").threads == 3
    shares = []
    monkeypatch.setattr(tune, "default_threads", lambda trainings: shares.append(trainings) or 1)
    assert study_settings("--jobs=2", "--seeds=3").threads == 1 and shares == [6]


def test_a_training_gives_up_threads_to_trainings_started_beside_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """train.py's load-aware threads (the rule lab.tune and lab.experiment share), decided again between updates: the
    load of other processes (the load average less the training's own CPU use) takes threads away, and gives them back
    up to the first choice once it falls."""
    import train

    clock = {"wall": 0.0, "cpu": 0.0, "load": 0.1}
    monkeypatch.setattr(train, "usable_cores", lambda: 2)
    monkeypatch.setattr(train, "load_average", lambda: clock["load"])
    monkeypatch.setattr(train, "time", SimpleNamespace(monotonic=lambda: clock["wall"], process_time=lambda: clock["cpu"]))
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        threads = train.LoadThreads()

        def step() -> int:
            """What the next update trains with: the threads after train.py's look before it."""
            threads.look()
            return torch.get_num_threads()

        assert threads.threads == 2 and step() == 2

        def later(load: float, own: float) -> int:
            """An update after LOAD_CHECK_SECONDS in which the training used ``own`` cores and the load was ``load``."""
            clock["wall"] += train.LOAD_CHECK_SECONDS
            clock["cpu"] += own * train.LOAD_CHECK_SECONDS
            clock["load"] = load
            return step()

        assert later(load=2.0, own=2.0) == 2  # its own load alone
        assert later(load=3.0, own=1.6) == 1  # a sibling started: 1.4 cores busy besides
        assert "threads 2 -> 1" in capsys.readouterr().out
        assert later(load=2.0, own=1.0) == 1
        assert later(load=1.2, own=1.0) == 2  # the sibling ended
    finally:
        torch.set_num_threads(previous)
