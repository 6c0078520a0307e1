"""Evaluation edge cases: episodes cut at the evaluation's step limit."""

from __future__ import annotations

import torch
from conftest import small_config

from evaluation import count_cut_episodes_as_failures, evaluate, metric_means
from model import ActorCriticModel
from summaries import evaluation_line


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


def test_the_mean_of_evaluation_cut_is_the_share_of_cut_episodes() -> None:
    results = [
        {"reward": 1.0, "length": 5.0, "success": 1.0},
        {"reward": 0.2, "length": 9.0, "evaluation_cut": 1.0},
        {"reward": 1.0, "length": 4.0, "success": 1.0},
        {"reward": 1.0, "length": 6.0, "success": 1.0},
    ]  # as a record written before uncut episodes carried the mark holds them
    assert metric_means(count_cut_episodes_as_failures(results))["evaluation_cut"] == 0.25


def test_evaluate_marks_the_episodes_that_ended_by_themselves() -> None:
    config = small_config()
    torch.manual_seed(0)
    model = ActorCriticModel(config, (3,), [2])
    results = evaluate(model, config, torch.device("cpu"), episodes=3)  # the proof-of-memory task ends in a few steps
    assert [result["evaluation_cut"] for result in results] == [0.0, 0.0, 0.0]


def test_every_episode_cut_counts_as_a_failure_where_the_task_is_known_to_report_success() -> None:
    """No episode of the evaluation tells that the task reports success; its training did."""
    results = [{"reward": 0.2, "length": 9.0, "evaluation_cut": 1.0}, {"reward": 0.1, "length": 9.0, "evaluation_cut": 1.0}]
    assert [result["success"] for result in count_cut_episodes_as_failures(results, success=True)] == [0.0, 0.0]


def test_the_evaluation_line_gives_the_share_of_cut_episodes_where_any_was() -> None:
    every_cut = metric_means(count_cut_episodes_as_failures([{"reward": -1.0, "length": 64.0, "evaluation_cut": 1.0}]))
    assert evaluation_line(every_cut) == "reward -1.000  cut 1.000"  # no success: no episode reported one
    some_cut = [{"reward": 1.0, "length": 5.0, "success": 1.0}, {"reward": 0.0, "length": 64.0, "evaluation_cut": 1.0}]
    assert evaluation_line(metric_means(count_cut_episodes_as_failures(some_cut))) == "reward 0.500  success 0.500  cut 0.500"
    assert evaluation_line(metric_means(count_cut_episodes_as_failures([{"reward": 1.0, "length": 5.0}]))) == "reward 1.000"
