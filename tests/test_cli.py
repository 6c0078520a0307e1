"""Tests of the command lines of train.py and enjoy.py (cli.py): refusals that come before anything starts, messages
that name the fix, and paths found from any folder.

Most tests call ``train.main(argv)`` / ``enjoy.main(argv)`` in this process with PPOTrainer replaced by a stand-in that
only records how it was built, so they take milliseconds; two run a real (tiny) training.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import small_config

import cli
import enjoy
import train
from checkpoint import load_file
from lab import benchmark
from trainer import PPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--cpu", "--set=updates=1", "--set=n_workers=2", "--set=worker_steps=16", "--set=n_mini_batch=1"]
TINY += ["--set=epochs=1", "--set=eval_interval=0"]


class FakeTrainer:
    """Stands in for PPOTrainer: records its arguments, trains nothing."""

    calls: list[dict] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        bound = inspect.signature(PPOTrainer).bind(*args, **kwargs)
        bound.apply_defaults()
        FakeTrainer.calls.append(dict(bound.arguments))
        run_id = bound.arguments["run_id"]
        self.summary_dir = os.path.join("summaries", run_id, "20240101-000000")
        self.model_path = os.path.join("models", f"{run_id}.nn")
        self.checkpoint_path = os.path.join("models", run_id, "checkpoint.pt")

    def run(self, **_: object) -> dict:
        return {}


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace train.py's PPOTrainer by FakeTrainer; returns the list of its constructions."""
    FakeTrainer.calls = []
    monkeypatch.setattr(train, "PPOTrainer", FakeTrainer)
    return FakeTrainer.calls


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with models/tiny.nn and models/tiny/checkpoint.pt of one tiny update on the plain memory path."""
    folder = str(tmp_path_factory.mktemp("trained"))
    config = small_config(n_workers=2, worker_steps=16, updates=1, eval_interval=0)
    previous = os.getcwd()
    os.chdir(folder)  # relative models/ and summaries/, as train.py writes them
    try:
        PPOTrainer(config, "tiny", torch.device("cpu"), memory_path="plain").run()
    finally:
        os.chdir(previous)
    return folder


@pytest.fixture
def run_folder(trained_run: str, tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A copy of ``trained_run`` to work in (the current folder during the test)."""
    folder = os.path.join(tmp_path, "work")
    shutil.copytree(trained_run, folder)
    monkeypatch.chdir(folder)
    return folder


CHECKPOINT = os.path.join("models", "tiny", "checkpoint.pt")


def poc_config(tmp_path: str) -> str:
    path = os.path.join(tmp_path, "poc.yaml")
    shutil.copy(os.path.join(ROOT, "configs", "poc_memory_env.yaml"), path)
    return path


# 1. A new run does not overwrite an existing one.


@pytest.mark.parametrize("existing", ["models/old.nn", "models/old/checkpoint.pt"])
def test_new_run_refuses_to_overwrite_an_existing_run(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list, capsys: pytest.CaptureFixture, existing: str
) -> None:
    monkeypatch.chdir(tmp_path)
    os.makedirs(os.path.dirname(existing), exist_ok=True)
    with open(existing, "w") as file:
        file.write("earlier run")
    assert train.main([f"--config={poc_config(tmp_path)}", "--run-id=old", *TINY]) == 2
    error = capsys.readouterr().err
    assert "--resume=models/old/checkpoint.pt" in error and "--overwrite" in error and existing in error
    assert fake_trainer == [], "training must not start"
    assert open(existing).read() == "earlier run"
    assert not os.path.exists("summaries"), "nothing may be written"


def test_overwrite_starts_the_run_over(tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list) -> None:
    monkeypatch.chdir(tmp_path)
    os.makedirs("models")
    open(os.path.join("models", "old.nn"), "w").close()
    assert train.main([f"--config={poc_config(tmp_path)}", "--run-id=old", "--overwrite", *TINY]) == 0
    assert len(fake_trainer) == 1 and fake_trainer[0]["run_id"] == "old"


# A run that one train.py trains is locked (models/<id>.lock): no second one writes over it.

HOLDER = (
    "import sys, time; sys.path.insert(0, {root!r}); from cli import RunLock; "
    "RunLock('models', 'busy', 'python train.py --run-id=busy').acquire(); print('locked', flush=True); time.sleep(120)"
)


def lock_holder(folder: str) -> subprocess.Popen:
    """A process in ``folder`` that holds the lock of run 'busy' (as a train.py of it would) until it is killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=ROOT)], cwd=folder, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_run_in_training_refuses_a_second_run_even_with_overwrite(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    holder = lock_holder(tmp_path)
    try:
        assert train.main([f"--config={poc_config(tmp_path)}", "--run-id=busy", "--overwrite", *TINY]) == 2
        error = capsys.readouterr().err
        assert f"run 'busy' is being trained by process {holder.pid} on host" in error
        assert "(python train.py --run-id=busy)" in error and f"kill {holder.pid}" in error and "--run-id" in error
        assert fake_trainer == [], "training must not start"
        assert not os.path.exists("summaries"), "nothing may be written"
        assert os.path.isfile(os.path.join("models", "busy.lock")), "the holder's lock stays"
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_run_is_taken_over_with_a_note(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    holder = lock_holder(tmp_path)
    holder.kill()  # SIGKILL: no chance to remove its lock file
    holder.wait()
    assert os.path.isfile(os.path.join("models", "busy.lock"))
    assert train.main([f"--config={poc_config(tmp_path)}", "--run-id=busy", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"took over the lock of run 'busy' (models/busy.lock) from process {holder.pid} on host" in out
    assert len(fake_trainer) == 1


@pytest.mark.parametrize("ending", ["end", "error"])
def test_the_lock_is_held_while_training_and_gone_after(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list, ending: str
) -> None:
    monkeypatch.chdir(tmp_path)
    lock = os.path.join("models", "held.lock")
    seen = []

    def run(self: FakeTrainer, **_: object) -> dict:
        with pytest.raises(cli.RunInUse, match=f"process {os.getpid()} "):
            cli.RunLock("models", "held", "a second command").acquire()
        seen.append(os.path.isfile(lock))
        if ending == "error" and len(seen) == 1:
            raise RuntimeError("a bug in training")
        return {}

    monkeypatch.setattr(FakeTrainer, "run", run)
    argv = [f"--config={poc_config(tmp_path)}", "--run-id=held", *TINY]
    if ending == "error":
        with pytest.raises(RuntimeError, match="a bug in training"):
            train.main(argv)
    else:
        assert train.main(argv) == 0
    assert seen == [True] and not os.path.exists(lock)
    assert train.main([*argv, "--overwrite"]) == 0 and seen == [True, True], "a new command gets the lock"


# 2. Misspelt flags are named, with the closest real one.


@pytest.mark.parametrize(
    "script,argument,suggestion",
    [
        ("train", "--confg=configs/poc_memory_env.yaml", "--config"),
        ("train", "--run_id=x", "--run-id"),
        ("enjoy", "--modle=models/poc.nn", "--model"),
        ("benchmark", "--confg=configs/poc_memory_env.yaml", "--config"),
    ],
)
def test_misspelt_flag_is_named_with_the_closest_flag(
    script: str, argument: str, suggestion: str, capsys: pytest.CaptureFixture, fake_trainer: list
) -> None:
    module = {"train": train, "enjoy": enjoy, "benchmark": benchmark}[script]
    with pytest.raises(SystemExit) as exit_info:
        module.main([argument, "--cpu"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    flag = argument.split("=")[0]
    assert f"unknown flag '{flag}'" in error and f"did you mean {suggestion}?" in error
    assert fake_trainer == []


def test_flags_come_from_the_usage_text() -> None:
    assert cli.usage_flags(train.__doc__) == [
        "--config", "--run-id", "--resume", "--overwrite", "--cpu", "--seed", "--memory-path", "--set", "--track", "--threads",
        "--help",
    ]  # fmt: skip
    assert cli.unknown_flags(["--conf=x", "--c", "--cpu", "--nope", "--", "--later"], cli.usage_flags(train.__doc__)) == [
        "--nope"
    ]  # prefixes are docopt's: unique ones are flags, ambiguous ones get docopt's message


def test_other_usage_errors_exit_2_with_the_reason(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--seed"])
    assert exit_info.value.code == 2
    assert "error: --seed requires argument" in capsys.readouterr().err


# 3. Shipped files are found from any folder; a missing default model lists the models there are.


def test_shipped_config_is_found_from_another_folder(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config=configs/poc_memory_env.yaml", "--run-id=elsewhere", *TINY]) == 0
    assert fake_trainer[0]["config"].environment["type"] == "PocMemoryEnv"


def test_missing_config_says_where_relative_paths_are_read(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config=configs/nope.yaml", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert "does not exist" in error and "repository root" in error


def empty_root(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make an empty folder the repository root of cli.py and enjoy.py (the real one may hold models)."""
    root = os.path.join(tmp_path, "repo")
    os.makedirs(root)
    monkeypatch.setattr(cli, "ROOT", root)
    monkeypatch.setattr(enjoy, "ROOT", root)
    return root


@pytest.mark.slow
def test_missing_default_model_lists_the_models_there_are(
    run_folder: str, tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    empty_root(tmp_path, monkeypatch)
    os.rename(os.path.join("models", "tiny.nn"), os.path.join("models", "poc.nn"))
    assert enjoy.main(["--no-render", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert "models/run.nn" in error and "--model=models/poc.nn" in error


def test_missing_default_model_without_models_says_how_to_train(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    empty_root(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert enjoy.main(["--no-render", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert "models/run.nn" in error and "make train" in error and "python train.py" in error


@pytest.mark.slow
def test_model_is_found_in_the_repository_from_another_folder(
    trained_run: str, tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    root = empty_root(tmp_path, monkeypatch)
    shutil.copytree(os.path.join(trained_run, "models"), os.path.join(root, "models"))
    elsewhere = os.path.join(tmp_path, "elsewhere")
    os.makedirs(elsewhere)
    monkeypatch.chdir(elsewhere)
    assert enjoy.main(["--model=models/tiny.nn", "--no-render", "--cpu"]) == 0
    assert os.path.join(root, "models", "tiny.nn") in capsys.readouterr().err


@pytest.mark.slow
def test_json_quiet_prints_the_json_line_alone(
    trained_run: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(trained_run)
    assert enjoy.main(["--model=models/tiny.nn", "--no-render", "--cpu", "--episodes=2", "--json", "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["summary"]["reward"]["episodes"] == 2


# 4. No display: a window is refused up front.


def fail_if_evaluating(*args: object, **kwargs: object) -> None:
    raise AssertionError("no episode may run")


@pytest.mark.slow
@pytest.mark.parametrize("situation", ["dummy video driver", "linux without a display"])
def test_window_without_a_display_is_refused(
    run_folder: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, situation: str
) -> None:
    if situation == "dummy video driver":
        monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    else:
        if not sys.platform.startswith("linux"):
            pytest.skip("Linux only")
        for name in ("SDL_VIDEODRIVER", "DISPLAY", "WAYLAND_DISPLAY"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(enjoy, "evaluate", fail_if_evaluating)
    assert enjoy.main(["--model=models/tiny.nn", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert "no display" in error and "--record=<file.gif>" in error and "--no-render" in error


# 5. Foreign files in one line; a video without ffmpeg is refused before the episodes.


def test_foreign_file_is_one_line_without_torch_internals(capsys: pytest.CaptureFixture) -> None:
    path = os.path.join(ROOT, "configs", "poc_memory_env.yaml")
    assert enjoy.main([f"--model={path}", "--no-render", "--cpu"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0, error
    assert f"'{path}' is not a model or checkpoint written by train.py" in error
    for internal in ("Unpickl", "weights_only", "torch", "pickle"):
        assert internal not in error


@pytest.mark.slow
def test_video_without_ffmpeg_is_refused_before_the_episodes(
    run_folder: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails, whether or not it is installed
    monkeypatch.setattr(enjoy, "evaluate", fail_if_evaluating)
    assert enjoy.main(["--model=models/tiny.nn", "--record=out.mp4", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert error.count("pip install") == 1 and "pip install imageio-ffmpeg" in error and ".gif" in error
    assert not os.path.exists("out.mp4")


# 6. Resume: no --config; a finished run has nothing to do.


@pytest.mark.slow
def test_resume_refuses_a_config(run_folder: str, capsys: pytest.CaptureFixture, fake_trainer: list) -> None:
    assert train.main([f"--resume={CHECKPOINT}", "--config=configs/poc_memory_env.yaml", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert "--config" in error and "--set still applies" in error
    assert fake_trainer == []


@pytest.mark.slow
def test_resuming_a_finished_run_has_nothing_to_do(run_folder: str, capsys: pytest.CaptureFixture, fake_trainer: list) -> None:
    assert load_file(CHECKPOINT)["update"] == 1
    assert train.main([f"--resume={CHECKPOINT}", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "--set updates=N" in out
    assert fake_trainer == [], "no worker may start"


# 7. The memory path of the checkpoint, unless --memory-path says otherwise.


@pytest.mark.slow
@pytest.mark.parametrize("flag,expected", [(None, "plain"), ("--memory-path=fast", "fast")])
def test_resume_keeps_the_checkpoints_memory_path(
    run_folder: str, fake_trainer: list, flag: str | None, expected: str
) -> None:
    assert load_file(CHECKPOINT)["memory_path"] == "plain"
    assert train.main([f"--resume={CHECKPOINT}", "--set=updates=2", "--cpu", *([flag] if flag else [])]) == 0
    assert fake_trainer[0]["memory_path"] == expected


def test_new_run_uses_the_fast_memory_path_by_default(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train.main([f"--config={poc_config(tmp_path)}", *TINY]) == 0
    assert fake_trainer[0]["memory_path"] == "fast"


def test_threads_sets_torchs_threads_and_refuses_a_bad_count(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, fake_trainer: list, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert train.main([f"--config={poc_config(tmp_path)}", *TINY, "--threads=1"]) == 0
        assert torch.get_num_threads() == 1
        for bad in ("0", "two"):
            assert train.main([f"--config={poc_config(tmp_path)}", *TINY, f"--threads={bad}"]) == 2
            assert f"--threads must be a whole number >= 1, got '{bad}'" in capsys.readouterr().err
    finally:
        torch.set_num_threads(previous)


def test_default_threads_leave_the_busy_cores_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "usable_cores", lambda: 2)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (2.1, 2.0, 1.0))  # two busy cores: one thread anyway
        assert train.default_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (0.9, 0.5, 0.2))
        assert train.default_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.5, 0.2))  # an idle machine: torch's own count
        assert train.default_threads() == 2
    finally:
        torch.set_num_threads(previous)


# 8. Changes of the saved shapes are refused before any worker starts.


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,key",
    [
        ("transformer.memory_length=8", "transformer.memory_length"),
        ("transformer.embed_dim=32", "transformer.embed_dim"),
        ("transformer.num_blocks=3", "transformer.num_blocks"),
        ("transformer.gtrxl=true", "transformer.gtrxl"),
        ("hidden_layer_size=32", "hidden_layer_size"),
        ("n_workers=4", "n_workers"),
        ("memory_dtype=bfloat16", "memory_dtype"),
        ("environment={type: CartPole}", "environment.type"),
        ("memory=gru", "memory 'trxl' -> 'gru'"),
        ("reconstruction_coefficient=0.1", "reconstruction_coefficient 0.0 -> 0.1"),
        ("transformer.positional_encoding=", "transformer.positional_encoding"),
        ("transformer.positional_values=true", "transformer.positional_values"),
        ("transformer.num_heads=4", "transformer.num_heads"),
    ],
)
def test_resume_refuses_changed_shapes(
    run_folder: str, capsys: pytest.CaptureFixture, fake_trainer: list, override: str, key: str
) -> None:
    assert train.main([f"--resume={CHECKPOINT}", "--set=updates=2", f"--set={override}", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert key in error and "shapes" in error and "Traceback" not in error
    assert fake_trainer == [], "no worker may start"


@pytest.fixture(scope="module")
def normalized_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with models/norm/checkpoint.pt of one tiny update with observation and reward normalisation on."""
    folder = str(tmp_path_factory.mktemp("normalized"))
    config = small_config(n_workers=2, worker_steps=16, updates=1, eval_interval=0, normalize_observations=True,
                          normalize_rewards=True)  # fmt: skip
    PPOTrainer(config, "norm", torch.device("cpu"), models_dir=os.path.join(folder, "models"), summaries_dir=folder).run()
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,change",
    [
        ("normalize_rewards=false", "normalize_rewards True -> False (the saved return statistics would be dropped)"),
        ("normalize_observations=false", "normalize_observations True -> False (the saved observation statistics"),
        ("normalize_clip=5", "normalize_clip 10.0 -> 5.0 (the saved statistics were applied clipped to 10.0)"),
        ("gamma=0.5", "gamma 0.99 -> 0.5 (the saved reward scale is the spread of returns discounted with gamma 0.99)"),
    ],
)
def test_resume_refuses_to_drop_or_invalidate_normalisation_statistics(
    normalized_run: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_trainer: list,
    override: str, change: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(normalized_run)
    checkpoint = os.path.join("models", "norm", "checkpoint.pt")
    assert train.main([f"--resume={checkpoint}", "--set=updates=2", f"--set={override}", "--cpu"]) == 2
    error = capsys.readouterr().err
    assert change in error and "train a new run" in error and "Traceback" not in error
    assert fake_trainer == [], "no worker may start"


@pytest.mark.slow
def test_resume_without_normalisation_may_change_gamma_and_the_clip(run_folder: str, fake_trainer: list) -> None:
    # Nothing saved depends on them there: the statistics rule is no blanket ban on these keys.
    assert load_file(CHECKPOINT)["config"]["normalize_rewards"] is False
    assert train.main([f"--resume={CHECKPOINT}", "--set=updates=2", "--set=gamma=0.5", "--set=normalize_clip=5", "--cpu"]) == 0
    assert fake_trainer[0]["config"].gamma == 0.5


@pytest.mark.slow
def test_resume_with_other_worker_steps_trains(run_folder: str, capsys: pytest.CaptureFixture) -> None:
    """worker_steps only sizes the rollout buffer; the checkpoint carries the last memory_length steps of the trace."""
    code = train.main([f"--resume={CHECKPOINT}", "--set=updates=2", "--set=worker_steps=32", "--cpu"])
    assert code == 0, capsys.readouterr()
    checkpoint = load_file(CHECKPOINT)
    assert checkpoint["update"] == 2 and checkpoint["config"]["worker_steps"] == 32


# 9. The summaries folder is printed at the start and at the end.


def test_summaries_folder_is_printed_at_start_and_end(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_trainer: list
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train.main([f"--config={poc_config(tmp_path)}", "--run-id=logged", *TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    folder = os.path.join("summaries", "logged", "20240101-000000")
    assert folder in lines[1] and folder in lines[-1], lines  # right after the start line, and in the last line


def test_tiny_run_from_another_folder_end_to_end(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config=configs/poc_memory_env.yaml", "--run-id=tiny", *TINY]) == 0
    out = capsys.readouterr().out
    folders = os.listdir(os.path.join("summaries", "tiny"))
    assert len(folders) == 1 and out.count(os.path.join("summaries", "tiny", folders[0])) == 2
    assert os.path.isfile(os.path.join("models", "tiny.nn")) and os.path.isfile(CHECKPOINT)


# 10. .gitignore


def test_gitignore_ignores_virtual_environments_and_scratch_output() -> None:
    lines = [line.strip() for line in open(os.path.join(ROOT, ".gitignore"))]
    assert ".venv/" in lines
    # lab/plot.py's default figure and enjoy.py --record=out.gif in the repository root leave git status clean; figures
    # under results/ (committed with their experiments) do not.
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    scratch = ["plots/compare.png", "out.gif", "run.mp4", "figure.png"]
    ignored = subprocess.run(["git", "check-ignore", *scratch], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == scratch
    kept = subprocess.run(["git", "check-ignore", "results/x/curves.png", "docs/figure.png"], cwd=ROOT)
    assert kept.returncode == 1, "nothing of these is ignored"


# 6. enjoy.py --random: the chance level of a config's environment, on the evaluation seeds.


def random_summary(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    """enjoy.py --random's --json summary."""
    assert enjoy.main(["--random", "--config=configs/poc_memory_env.yaml", "--episodes=30", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]


def test_random_play_repeats_with_its_seed_and_does_not_solve_the_task(capsys: pytest.CaptureFixture) -> None:
    first, again, other = random_summary(capsys), random_summary(capsys), random_summary(capsys, "--seed=1")
    assert first == again and first != other
    assert first["success"]["episodes"] == 30
    # A random walk reaches the end the cue points to at most half the time (which end is rewarded is a coin flip).
    assert 0 < first["success"]["mean"] <= 0.6 and first["reward"]["mean"] < 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--random"], "add --config=<path>"),
        (["--random", "--config=configs/poc_memory_env.yaml", "--deterministic"], "leave out --deterministic"),
        (["--random", "--config=configs/poc_memory_env.yaml", "--model=models/poc.nn"], "leave out --model"),
        (["--config=configs/poc_memory_env.yaml"], "--config goes with --random"),
        (["--random", "--config=configs/poc_memory_env.yaml", "--set", "gamma=2"], "gamma"),
    ],
)
def test_random_play_refuses_what_it_cannot_use(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert enjoy.main([*argv, "--no-render"]) == 2
    assert message in capsys.readouterr().err


def test_help_hides_internal_flags(capsys: pytest.CaptureFixture) -> None:
    from cli import parse_args
    from lab import benchmark

    with pytest.raises(SystemExit) as exit_code:
        parse_args(benchmark.__doc__, ["--help"])
    shown = capsys.readouterr().out
    assert exit_code.value.code == 0
    assert "--child" not in shown and "--overrides" not in shown and "(internal)" not in shown
    assert "--gpu-check" in shown and "--cpu" in shown and "Each path runs in its own process" in shown
    assert parse_args(benchmark.__doc__, ["--child=fast"])["--child"] == "fast"  # still accepted


def test_help_into_a_closed_pipe_exits_quietly() -> None:
    # `python -m lab.panel --help | head -3`: the reader closes the pipe before the usage text is written.
    script = "import cli; cli.parse_args('Usage:\\n  tool.py [--flag]\\n\\nOptions:\\n  --flag  A flag.\\n', ['--help'])"
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child.stdout.close()
    error = child.stderr.read()
    assert child.wait(timeout=60) == 0
    assert "Traceback" not in error and "BrokenPipe" not in error, error
