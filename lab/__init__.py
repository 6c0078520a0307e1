"""The lab: the research tools around the trainer, kept apart from it as rl-baselines3-zoo is from stable-baselines3.

The lab imports the training core (the top-level modules, memories/ and environments/) and starts train.py; the core
imports nothing from here. Each tool is one module and one command, run from the repository root as
``python -m lab.<tool>`` (``--help`` explains its flags):

- ``python -m lab.experiment``: several seeds of one config, each final model evaluated on the same unseen episodes,
  aggregated into results/<id>/ (IQM with a 95% stratified-bootstrap interval, curves, steps to a threshold);
- ``python -m lab.plot``: the IQM curves of experiments overlaid; ``--tables`` writes the generated results tables;
- ``python -m lab.panel``: a benchmark panel, (task, memory) pairs each run as an experiment, in one leaderboard;
- ``python -m lab.tune``: hyperparameter search with Optuna, every trial over a few seeds of train.py;
- ``python -m lab.benchmark``: throughput, peak memory and FLOPs of the memory paths and memories; ``--gpu-check``
  runs the checks for a GPU machine.

The modules behind them: seeds.py (running an experiment's seeds and their records), experiment_report.py (an
experiment's aggregate, console report, figure and number formats), aggregation.py (statistics over runs), tables.py
(the README's and docs/results.md's generated tables), measure.py (measuring one memory path in one process) and
gpu_check.py (the GPU machine's checks).
"""
