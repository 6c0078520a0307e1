"""The plateau before a MiniGrid-MemoryS9 agent learns, seed by seed, from the experiments' records.

For every seed record of the MiniGrid experiments in results/: whether advantages were normalised, the entropy
coefficient it started with, the shortest and longest mean episode of updates 5-40 (about 11 steps: the agent walks
straight to an object and guesses; 40-80: it wanders, often until the 96-step limit), the lowest mean reward of
updates 12-40, the first update after update 5 with training success >= 0.65 (it has left chance, 0.5) and the first
with mean reward >= 0.9. Prints a markdown table and writes plateau.json beside this file.

    python results/ablations/minigrid/minigrid-plateau/plateau.py   # from the repository root, reads the seeds' records
"""

import glob
import json
import os

EXPERIMENTS = (
    "ablations/minigrid/minigrid-5seeds", "ablations/minigrid/minigrid-fix", "memories/minigrid/minigrid-gru",
    "ablations/minigrid/minigrid-defaults-mb16", "ablations/minigrid/minigrid-targetkl",
    "ablations/minigrid/minigrid-targetkl2", "ablations/minigrid/minigrid-beta015",
)  # fmt: skip


def first(values: list[float], level: float, after: int = 0) -> int | None:
    """The 1-based update of the first value >= level after update ``after``, or None."""
    return next((i + 1 for i, v in enumerate(values) if i >= after and v >= level), None)


def seed_row(path: str) -> dict:
    record = json.load(open(path))
    config, curves = record["config"], record["curves"]
    reward, success, length = ([v for _, v in curves[f"episode/{key}_mean"]] for key in ("reward", "success", "length"))
    return {
        "experiment": os.path.basename(os.path.dirname(path)),
        "seed": record["seed"],
        "memory": config.get("memory", "trxl"),
        "normalize_advantages": config["normalize_advantages"],
        "beta_initial": config["beta_schedule"]["initial"],
        "updates": len(reward),
        "length_min_5_40": min(length[4:40]),
        "length_max_5_40": max(length[4:40]),
        "reward_min_12_40": min(reward[11:40]),
        "success_065_at": first(success, 0.65, after=5),
        "reward_09_at": first(reward, 0.9),
    }


if __name__ == "__main__":
    rows = [
        seed_row(path)
        for experiment in EXPERIMENTS
        for path in sorted(glob.glob(os.path.join("results", experiment, "seed-*.json")))
    ]
    print("| experiment | seed | memory | advantages normalised | entropy coefficient from | episode length, updates 5-40 "
          "| lowest reward, updates 12-40 | success 0.65 first at | reward 0.9 first at |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['experiment']} | {r['seed']} | {r['memory']} | {'yes' if r['normalize_advantages'] else 'no'} "
            f"| {r['beta_initial']} | {r['length_min_5_40']:.0f}-{r['length_max_5_40']:.0f} | {r['reward_min_12_40']:.2f} "
            f"| {r['success_065_at'] or 'never'} | {r['reward_09_at'] or 'never'} (of {r['updates']}) |"
        )
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plateau.json"), "w") as file:
        json.dump(rows, file, indent=1)
