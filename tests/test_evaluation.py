"""Evaluation edge cases: episodes cut at the evaluation's step limit."""

from __future__ import annotations

import torch
from conftest import small_config

from evaluation import count_cut_episodes_as_failures, evaluate, metric_means
from model import ActorCriticModel


def test_a_cut_episode_counts_as_a_failure_where_the_task_reports_success() -> None:
    results = [
        {"reward": 1.0, "length": 5.0, "success": 1.0},
        {"reward": 0.2, "length": 9.0, "evaluation_cut": 1.0},
        {"reward": 1.0, "length": 4.0, "success": 1.0, "commands": 3.0},
    ]
    count_cut_episodes_as_failures(results)
    assert results[1]["success"] == 0.0
    means = metric_means(results)
    assert means["success"] == 2 / 3 and means["length"] == 6.0
    assert means["commands"] == 3.0  # a metric only some episodes report: the mean of those


def test_without_success_nothing_is_added() -> None:
    results = [{"reward": 1.0, "length": 5.0}, {"reward": 0.2, "length": 9.0, "evaluation_cut": 1.0}]
    assert "success" not in count_cut_episodes_as_failures(results)[1]


def test_evaluate_reports_cut_episodes_with_their_steps_and_mark() -> None:
    config = small_config()
    torch.manual_seed(0)
    model = ActorCriticModel(config, (3,), [2])
    results = evaluate(model, config, torch.device("cpu"), episodes=3, max_steps=1)
    assert all(result["evaluation_cut"] == 1.0 and result["length"] == 1.0 for result in results)
