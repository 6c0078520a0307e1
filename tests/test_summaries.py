"""TensorBoard summaries as users of SB3 and CleanRL expect them: the reward's spread and the episode count per update,
value statistics, where the time went, and the config with the final metrics in the HParams tab."""

from __future__ import annotations

import glob
import os

import pytest
from conftest import train_small
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from lab.seeds import read_scalars


@pytest.mark.slow
def test_summaries_hold_spread_values_time_and_hparams(tmp_path: str) -> None:
    trainer = train_small(tmp_path, "logged", 2)
    folder = trainer.summary_dir
    for tag in ("episode/reward_mean", "episode/reward_min", "episode/reward_max", "episode/reward_std", "episode/count",
                "values/value_mean", "values/return_mean", "values/advantage_mean", "values/advantage_std",
                "time/rollout_seconds", "time/optimize_seconds"):  # fmt: skip
        assert len(read_scalars(folder, tag)) == 2, tag
    low, mean, high = (read_scalars(folder, f"episode/reward_{name}") for name in ("min", "mean", "max"))
    assert all(low[step] <= mean[step] <= high[step] for step in mean)
    assert all(count >= 1 for count in read_scalars(folder, "episode/count").values())
    assert all(seconds > 0 for seconds in read_scalars(folder, "time/rollout_seconds").values())
    tags = {
        value.tag
        for file in glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True)
        for event in EventFileLoader(file).Load()
        for value in event.summary.value
    }
    assert "_hparams_/experiment" in tags and "_hparams_/session_start_info" in tags
    assert "final/reward_mean" in tags  # the metric the HParams table shows per run
