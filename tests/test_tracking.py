"""Experiment tracking with Weights & Biases (``track``, ``train.py --track``) and videos during training
(``video_interval``). W&B runs in its offline mode: nothing leaves the machine, and each run writes a folder
offline-run-<time>-<id>/ whose run-<id>.wandb file holds the run's records, read back here."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
from conftest import small_config
from tensorboard.backend.event_processing import event_accumulator

import summaries
import train
from config import ConfigError, validate_config, with_saved_defaults
from trainer import PPOTrainer, video_due

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POC = os.path.join(ROOT, "configs", "poc_memory_env.yaml")
TINY = [
    f"--config={POC}", "--cpu", "--seed=3", "--set=updates=1", "--set=n_workers=2", "--set=worker_steps=16",
    "--set=n_mini_batch=1", "--set=epochs=1", "--set=eval_interval=0", "--set=hidden_layer_size=16",
    "--set=transformer={num_blocks: 1, embed_dim: 16, num_heads: 2, memory_length: 4}",
    "--set=environment.max_episode_steps=8",  # episodes end within the update: their means and the final ones are logged
]  # fmt: skip
BOOKKEEPING = {"_step", "_runtime", "_timestamp", summaries.STEP}  # what W&B adds to every row, and our x-axis


def wandb_records(path: str) -> list:
    """The records of a .wandb file, read with wandb's own protobuf definitions. The file is a ':W&B' header of 7
    bytes, then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header (checksum, length, type:
    1 a whole record, 2/3/4 its first, middle and last piece); a block's tail shorter than a header is padding."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    records, position, pieces = [], 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def offline_run(folder: str) -> dict:
    """What the offline run in ``folder`` holds: its id and name, its config, and its history rows."""
    [path] = glob.glob(os.path.join(folder, "run-*.wandb"))
    run, config, history = None, {}, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            items = record.history.item
            history.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in items})
    return {"id": run.run_id, "name": run.display_name, "config": config, "history": history}


def offline_runs(wandb_dir: str) -> list[dict]:
    """The offline runs under W&B's folder ``wandb_dir``, oldest first."""
    return [offline_run(folder) for folder in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*")))]


@pytest.fixture
def offline(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """W&B offline with its folder in tmp_path/wandb-dir, the current folder tmp_path; returns W&B's folder."""
    pytest.importorskip("wandb")
    folder = os.path.join(tmp_path, "wandb-dir")
    os.makedirs(folder)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", folder)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    return folder


def tensorboard_scalars(summary_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a summary folder -> its (step, value) points."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in glob.glob(os.path.join(summary_dir, "events.out.tfevents.*")):
        accumulator = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            points.setdefault(tag, []).extend((event.step, event.value) for event in accumulator.Scalars(tag))
    return points


@pytest.mark.slow
def test_a_tracked_run_logs_the_tensorboard_scalars_config_commit_and_seed(offline: str) -> None:
    assert train.main([*TINY, "--run-id=tracked/a", "--track"]) == 0
    [run] = offline_runs(offline)
    [summary_dir] = glob.glob(os.path.join("summaries", "tracked", "a", "2*"))
    assert run["name"] == "tracked/a" and run["id"] == f"tracked-a-{os.path.basename(summary_dir)}"
    rows = [row for row in run["history"] if "losses/policy" in row]
    assert len(rows) == 1 and rows[0][summaries.STEP] == 32  # the update's row, at its environment steps
    logged: dict[str, list[tuple[int, float]]] = {}
    for row in run["history"]:
        for tag in set(row) - BOOKKEEPING:
            logged.setdefault(tag, []).append((row[summaries.STEP], pytest.approx(row[tag])))
    assert logged == tensorboard_scalars(summary_dir)  # the same scalars at the same steps as TensorBoard
    assert "episode/success_mean" in logged and "final/success_mean" in logged
    config = run["config"]
    assert config["n_workers"] == 2 and config["transformer"]["memory_length"] == 4 and config["track"] is True
    assert config["seed"] == 3 and config["run_id"] == "tracked/a"
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert config["git"]["commit"] == head and isinstance(config["git"]["dirty"], bool)


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_run(offline: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    starts = []

    def init(**settings: object) -> object:
        starts.append(settings)
        return real_init(**settings)

    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", init)
    assert train.main([*TINY, "--run-id=again", "--track"]) == 0
    assert train.main(["--resume=models/again/checkpoint.pt", "--set=updates=2", "--cpu"]) == 0  # tracks as it did
    first, resumed = offline_runs(offline)  # offline, each process writes its own folder of the one run
    assert first["id"] == resumed["id"] and resumed["name"] == "again"
    assert [start["resume"] for start in starts] == ["allow", "allow"]  # online, W&B appends to the run where it exists
    steps = [row[summaries.STEP] for run in (first, resumed) for row in run["history"] if "losses/policy" in row]
    assert steps == [32, 64]
    assert resumed["config"]["updates"] == 2 and first["config"]["updates"] == 1


def test_track_without_wandb_names_the_install_before_anything_starts(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert train.main([*TINY, "--run-id=nowandb", "--track"]) == 2
    error = capsys.readouterr().err
    assert "pip install wandb" in error and "--track" in error and "Traceback" not in error
    assert not os.path.exists("models") and not os.path.exists("summaries"), "nothing may start"


@pytest.mark.slow
def test_only_rank_0_logs_under_torchrun(tmp_path: str) -> None:
    pytest.importorskip("wandb")
    folder = os.path.join(tmp_path, "wandb-dir")
    os.makedirs(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_DIR": folder, "WANDB_SILENT": "true"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", train.__file__]
    command += [*TINY, "--set=n_workers=4", "--run-id=ranks", "--track"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = offline_runs(folder)
    assert [row[summaries.STEP] for row in run["history"] if "losses/policy" in row] == [64]


@pytest.mark.parametrize(
    "eval_interval, video_interval, updates, due",
    [
        (1, 0, 4, []),  # off by default
        (1, 1, 3, [1, 2, 3]),  # every evaluation
        (1, 2, 5, [2, 4, 5]),  # every second evaluation, and the last
        (2, 2, 9, [4, 8, 9]),  # evaluations at 2, 4, 6, 8, 9: every second, and the last
        (0, 1, 3, []),  # no evaluations, no videos
    ],
)
def test_videos_come_every_video_interval_evaluations_and_at_the_last(
    eval_interval: int, video_interval: int, updates: int, due: list[int]
) -> None:
    config = small_config(eval_interval=eval_interval, video_interval=video_interval, updates=updates)
    evaluated = [u for u in range(1, updates + 1) if eval_interval and (u % eval_interval == 0 or u == updates)]
    assert [u for u in evaluated if video_due(config, u)] == due


@pytest.mark.slow
def test_videos_reach_tensorboard_and_wandb(offline: str, tmp_path: str) -> None:
    config = small_config(updates=3, eval_interval=1, eval_episodes=1, video_interval=2, track=True)
    folder = os.path.join(tmp_path, "run")
    trainer = PPOTrainer(config, "videos", torch.device("cpu"), models_dir=folder, summaries_dir=folder)
    trainer.run()
    accumulator = event_accumulator.EventAccumulator(trainer.summary_dir, size_guidance={event_accumulator.IMAGES: 0})
    accumulator.Reload()
    steps = 4 * 16  # per update
    videos = accumulator.Images("evaluation/episode")
    assert [video.step for video in videos] == [2 * steps, 3 * steps]  # the 2nd evaluation's and the last
    assert all(video.encoded_image_string[:6] == b"GIF89a" for video in videos)
    [run] = offline_runs(offline)
    rows = [row for row in run["history"] if "evaluation/episode/_type" in row]
    assert [(row[summaries.STEP], row["evaluation/episode/_type"]) for row in rows] == [
        (2 * steps, "video-file"),
        (3 * steps, "video-file"),
    ]
    [offline_folder] = glob.glob(os.path.join(offline, "wandb", "offline-run-*"))
    for row in rows:
        with open(os.path.join(offline_folder, "files", row["evaluation/episode/path"]), "rb") as file:
            assert file.read(6) == b"GIF89a"


def test_eval_video_is_refused_with_its_new_name_and_saved_configs_are_renamed() -> None:
    with pytest.raises(ConfigError, match=r"'eval_video' \(True\) was replaced by 'video_interval'.*video_interval: 1"):
        small_config(eval_video=True)
    saved = small_config().to_dict()
    del saved["video_interval"]
    for old, new in ((True, 1), (False, 0)):
        assert validate_config(with_saved_defaults({**saved, "eval_video": old})).video_interval == new


def test_the_wandb_id_follows_the_run_id_and_its_start() -> None:
    assert summaries.wandb_id("poc", "summaries/poc/20240101-120000") == "poc-20240101-120000"
    assert summaries.wandb_id("panel/x:y", "summaries/panel/x:y/20240101-120000/") == "panel-x-y-20240101-120000"
