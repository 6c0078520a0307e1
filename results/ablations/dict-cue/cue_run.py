"""One seed of the Dict cue task with configs/poc_memory_env.yaml's settings, its environment swapped for
tests/cue_task.py's Dict form (an 8x8x3 image that shows the step, a 3-vector with the cue at step 0, the step and an
answer flag; 5 steps), memory_length 8, 40 updates (82k steps).

Run from the repository root: python results/ablations/dict-cue/cue_run.py dict SEED [key=value ...]
Prints the console lines every 5 updates, then a JSON line: the last rollout's success and the greedy success over
100 unseen episodes of the final model.
"""

import json
import os
import sys
import time

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from config import load_config  # noqa: E402
from evaluation import evaluate  # noqa: E402
from trainer import PPOTrainer  # noqa: E402

torch.set_num_threads(1)  # two seeds at a time on 2 cores
observation, seed = sys.argv[1], int(sys.argv[2])
overrides = {"updates": 40, "transformer.memory_length": 8, "eval_interval": 0}
overrides["environment"] = {"type": "Gymnasium", "id": "cue_task:Cue-v0", "kwargs": {"observation": observation}}
overrides.update({key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in sys.argv[3:])})
config = load_config("configs/poc_memory_env.yaml", overrides)
start = time.time()
folder = "/tmp/cue"
trainer = PPOTrainer(config, f"cue-{observation}-{seed}", torch.device("cpu"), seed, models_dir=folder, summaries_dir=folder)
means = trainer.run(log_every=5)
results = evaluate(trainer.model, config, torch.device("cpu"), 100, seed=1, deterministic=True)
greedy = float(np.mean([result["success"] for result in results]))
line = {"obs": observation, "seed": seed, "sets": sys.argv[3:], "success": means.get("success"), "greedy": greedy}
print(json.dumps(line | {"s": time.time() - start}))
