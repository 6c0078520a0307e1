"""Model files and the training state a checkpoint holds: one dict of tensors and builtins each, loadable with
``torch.load(weights_only=True)``.

Files are written atomically (a temporary file in the same folder, then ``os.replace``), so a run killed while
saving leaves the previous file intact.

A checkpoint (``models/<run-id>/checkpoint.pt``) holds everything a resumed run needs to continue exactly: model,
optimizer, config, the run's counters, the random number generator states, each worker's memory and the memory's
trace carried into the next rollout, and the environments' state (their episode numbers and the actions of the
running episodes, which ``Workers.restore`` replays). A model file (``models/<run-id>.nn``) holds what enjoy.py needs:
weights, config, observation shape and action dims.

What a resumed run may change lives here as well (``check_resume``): nothing that the saved memory, environment or
normalisation state depends on, nor anything that gives the model other parameters.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from types import ModuleType

import torch
import yaml

import observations
from config import Config, ConfigError, flatten, validate_config, with_saved_defaults
from distributed import SINGLE, Ranks, gather_to_main
from environments.action_spec import ActionSpec
from memories.base import MemoryState, MemoryTrace
from model import ActorCriticModel, runnable_compute_dtype
from normalization import RewardScaler


def atomic_save(payload: dict, path: str) -> None:
    """``torch.save`` ``payload`` to ``path`` so that ``path`` is always either the old or the new file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pt")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the permissions a plain open() would
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_model(model: ActorCriticModel, config: Config, path: str) -> None:
    """Write the model file that enjoy.py takes: weights, config, observation shape and action dims."""
    atomic_save(
        {
            "kind": "model",
            "model": model.state_dict(),
            "config": config.to_dict(),
            "observation_shape": observations.plain_shape(model.observation_shape),
            "action_dims": list(model.action_dims),
            "actions": model.actions.to_dict(),
        },
        path,
    )


def model_file(snapshot: dict) -> dict:
    """The model file (as ``save_model`` writes it) of a training snapshot's weights, with how far its run had trained
    (``training``: run id, seed, update and environment steps, for a model card; files from before lack it)."""
    keys = ("model", "config", "observation_shape", "action_dims", "actions")
    training = {key: snapshot[key] for key in ("run_id", "seed", "update", "env_steps")}
    return {"kind": "model", **{key: snapshot[key] for key in keys}, "training": training}


def write_half_precision(source: str, target: str) -> None:
    """Write the model file ``source`` (or a checkpoint's model) to ``target`` with its float32 weights in float16, half
    the size, as the repository ships trained models (models/trained/). Loading casts them back to the model's float32
    parameters (``load_state_dict`` copies into the parameters' dtype); compare the result on unseen episodes before
    shipping one."""
    payload = load_file(source)
    payload = model_file(payload) if payload["kind"] == "checkpoint" else payload
    weights = {key: value.half() if value.dtype == torch.float32 else value for key, value in payload["model"].items()}
    atomic_save({**payload, "model": weights}, target)


# A model folder (python -m lab.export writes one, with its model card): the weights in safetensors, the observation
# shape and the actions in the safetensors header's metadata, the resolved config as YAML.
FOLDER_WEIGHTS, FOLDER_CONFIG = "model.safetensors", "config.yaml"
_FOLDER_METADATA = ("observation_shape", "action_dims", "actions")  # JSON strings in the metadata


def _safetensors() -> ModuleType:
    """The safetensors package with its torch functions (optional: model folders only); ValueError naming the install."""
    try:
        import safetensors.torch
    except ImportError:
        raise ValueError(
            "model folders store their weights in safetensors, which is not installed: pip install safetensors"
        ) from None
    return safetensors


def write_folder(payload: dict, folder: str) -> None:
    """Write a model file's (or a checkpoint's) model as a model folder: FOLDER_WEIGHTS (the weights as they are in
    the file, so the folder plays exactly as the file) and FOLDER_CONFIG (the resolved config, every default filled
    in, which ``train.py --config`` takes)."""
    os.makedirs(folder, exist_ok=True)
    config = validate_config(with_saved_defaults(payload["config"])).to_dict()
    weights = {key: value.detach().cpu().contiguous().clone() for key, value in payload["model"].items()}  # no shared storage
    metadata = {"format": "pt", **{key: json.dumps(payload[key]) for key in _FOLDER_METADATA if key in payload}}
    path = os.path.join(folder, FOLDER_WEIGHTS)
    _safetensors().torch.save_file(weights, path, metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # the permissions a plain open() gives, as the config's and the card's
    with open(os.path.join(folder, FOLDER_CONFIG), "w") as file:
        yaml.safe_dump(config, file, sort_keys=False)


def read_folder(folder: str) -> dict:
    """The model of a model folder, as ``load_file`` returns a model file's."""
    paths = [os.path.join(folder, name) for name in (FOLDER_WEIGHTS, FOLDER_CONFIG)]
    if not all(os.path.isfile(path) for path in paths):
        raise ValueError(
            f"'{folder}' is a folder without {FOLDER_WEIGHTS} and {FOLDER_CONFIG}: pass a model folder written by "
            "python -m lab.export, or a model file (models/<run-id>.nn)"
        )
    with _safetensors().safe_open(paths[0], framework="pt") as file:
        metadata = file.metadata() or {}
        weights = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 - a safetensors file, no dict
    with open(paths[1]) as file:
        config = yaml.safe_load(file)
    missing = [key for key in ("observation_shape", "action_dims") if key not in metadata]
    if missing or not isinstance(config, dict):
        raise ValueError(f"'{folder}' is not a model folder written by python -m lab.export: its metadata lacks {missing}")
    payload = {"kind": "model", "model": weights, "config": config}
    payload.update({key: json.loads(metadata[key]) for key in _FOLDER_METADATA if key in metadata})
    return payload


def load_file(path: str) -> dict:
    """Load a model or checkpoint file (or a model folder, ``read_folder``), with a clear error for a missing or
    foreign file."""
    if os.path.isdir(path):
        return read_folder(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"'{path}' does not exist: pass a file written by train.py, models/<run-id>.nn (a model) or "
            "models/<run-id>/checkpoint.pt (a checkpoint)"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises many types for foreign files; their texts are about torch's internals
        raise ValueError(
            f"'{path}' is not a model or checkpoint written by train.py: pass models/<run-id>.nn (a model) or "
            "models/<run-id>/checkpoint.pt (a checkpoint)"
        ) from None
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise ValueError(f"'{path}' is not a model or checkpoint written by train.py (no model weights and config inside)")
    return payload


def saved_actions(payload: dict) -> ActionSpec:
    """The action space of a model or checkpoint file (files from before continuous actions hold only the counts)."""
    return ActionSpec.coerce(payload.get("actions", payload["action_dims"]))


def load_model(path: str, device: torch.device) -> tuple[ActorCriticModel, Config]:
    """Rebuild the model and its config from a file written by ``save_model`` (or a checkpoint)."""
    payload = load_file(path)
    try:
        config = validate_config(with_saved_defaults(payload["config"]))
    except ConfigError as error:
        raise ValueError(f"'{path}' holds a config this version cannot read: {error}") from None
    compute_dtype = runnable_compute_dtype(config.compute_dtype, device)
    model = ActorCriticModel(
        config, observations.normalize_shape(payload["observation_shape"]), saved_actions(payload), compute_dtype=compute_dtype
    )
    load_weights(model, payload["model"], path)
    return model.to(device), config


def load_weights(model: ActorCriticModel, weights: dict[str, torch.Tensor], path: str) -> None:
    """``model.load_state_dict(weights)``, with an error that says what to do when the file does not fit the code."""
    missing = sorted(set(model.state_dict()) - set(weights))
    if missing:
        raise ValueError(
            f"'{path}' does not fit this version of the model (it lacks '{missing[0]}'; files written before the "
            "encoder/memory/heads split name their weights differently): train it again with this version"
        )
    model.load_state_dict(weights)


@dataclass
class Progress:
    """Names and counters of a run: what a checkpoint holds besides the tensors."""

    run_id: str
    seed: int
    memory_path: str
    summary_dir: str
    update: int = 0  # completed updates
    env_steps: int = 0  # environment steps of all workers so far


def snapshot_training(
    progress: Progress,
    config: Config,
    model: ActorCriticModel,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    workers_state: list[dict],
    memory_state: MemoryState,
    trace: MemoryTrace,
    ranks: Ranks = SINGLE,
    reward_scaler: RewardScaler | None = None,
) -> dict | None:
    """Everything a resumed run needs, copied (the model keeps training after this); ``restore_training`` reads it.

    With ``ranks`` of several processes each holds its own workers, memory and GPU generator: they are gathered on
    rank 0, which returns the snapshot of all of them; the other ranks return None.
    """
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    memory, trace_state = memory_state.state_dict(), trace.state_dict()  # CPU copies
    rewards = None if reward_scaler is None else reward_scaler.state_dict()
    shards = None
    if ranks.distributed:
        shard = {
            "workers": workers_state,
            "memory": memory,
            "trace": trace_state,
            "returns": None if rewards is None else rewards["returns"],
            # Each rank samples on its own GPU, whose generator only that rank's process knows.
            "cuda_rng": torch.cuda.get_rng_state(device) if cuda else None,
        }
        shards = gather_to_main(shard, ranks)
        if shards is None:
            return None
        workers_state = [state for shard in shards for state in shard["workers"]]
    snapshot = {
        "kind": "checkpoint",
        "model": {key: value.detach().cpu().clone() for key, value in model.state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "config": config.to_dict(),
        "observation_shape": observations.plain_shape(model.observation_shape),
        "action_dims": list(model.action_dims),
        "actions": model.actions.to_dict(),
        "run_id": progress.run_id,
        "seed": progress.seed,
        "memory_path": progress.memory_path,
        "summary_dir": progress.summary_dir,
        "update": progress.update,
        "env_steps": progress.env_steps,
        "rng": {
            "torch": torch.get_rng_state(),
            # This process's GPU only: a state per visible GPU would not restore where fewer are visible.
            "cuda_device": torch.cuda.get_rng_state(device) if cuda else None,
            "minibatch": generator.get_state(),
        },
        "workers": workers_state,
        "memory": memory,
        "trace": trace_state,
    }
    if rewards is not None:  # normalize_rewards: the return statistics and each worker's running return (per rank)
        returns = rewards["returns"] if shards is None else [shard["returns"] for shard in shards]
        snapshot["rewards"] = {**rewards, "returns": returns}
    if shards is not None:
        snapshot.update(
            world_size=ranks.world,
            memory=[shard["memory"] for shard in shards],
            trace=[shard["trace"] for shard in shards],
            cuda_rng=[shard["cuda_rng"] for shard in shards],
        )
    return snapshot


def restore_training(
    payload: dict,
    model: ActorCriticModel,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    memory_state: MemoryState,
    trace: MemoryTrace,
    reward_scaler: RewardScaler | None = None,
) -> Progress:
    """Load a ``snapshot_training`` payload into freshly built parts; the caller restores the workers from
    ``payload["workers"]``. Returns the run's progress."""
    found = (observations.normalize_shape(payload["observation_shape"]), saved_actions(payload))
    expected = (model.observation_shape, model.actions)
    if found != expected:
        raise ValueError(
            f"the checkpoint's model takes observations {found[0]} and actions {found[1]}, but the environment "
            f"gives observations {expected[0]} and actions {expected[1]}: resume with the config it was trained with"
        )
    load_weights(model, payload["model"], "the checkpoint")
    # The optimizer's moments come from the checkpoint, its settings (epsilon) from the run's config: load_state_dict
    # would restore the saved ones, and a `--set adam_epsilon=...` on resume would be ignored without a word.
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    saved_groups = len(payload["optimizer"]["param_groups"])
    if saved_groups != len(settings):
        raise ValueError(
            f"the checkpoint's optimizer has {saved_groups} parameter group(s) and this config's {len(settings)}: "
            "the memory's own rate (memory_learning_rate_scale other than 1, or the transformer's max_learning_rate "
            "other than 0) was set on one side and not on the other; resume with the settings it was trained with"
        )
    optimizer.load_state_dict(payload["optimizer"])
    for group, setting in zip(optimizer.param_groups, settings, strict=True):
        group.update(setting)
    torch.set_rng_state(payload["rng"]["torch"])
    device = next(model.parameters()).device
    if device.type == "cuda" and payload["rng"].get("cuda_device") is not None:  # this rank's (trainer.shard_of)
        torch.cuda.set_rng_state(payload["rng"]["cuda_device"], device)
    generator.set_state(payload["rng"]["minibatch"])
    memory_state.load_state_dict(payload["memory"])
    trace.load_state_dict(payload["trace"])
    if reward_scaler is not None:
        if "rewards" not in payload:
            raise ValueError("the checkpoint was trained without normalize_rewards: resume it with normalize_rewards false")
        reward_scaler.load_state_dict(payload["rewards"])
    return Progress(
        payload["run_id"], payload["seed"], payload["memory_path"], payload["summary_dir"], payload["update"],
        payload["env_steps"],
    )  # fmt: skip


# What a resumed run may change. The saved memory and environment state depend on these keys, whatever the model's
# parameters; keys that change the parameters' shapes are found by building the new model (``model_changes``).
# (worker_steps may change: the checkpoint holds only the last memory_length steps of the trace, which any T carries.)
STATE_KEYS = ("memory", "transformer.memory_length", "n_workers", "memory_dtype", "environment")
# Keys that change what the saved parameters mean without changing their shapes.
MEANING_KEYS = (
    "transformer.num_heads",
    "transformer.positional_encoding",
    "transformer.query_position",
    "transformer.positional_values",
    "transformer.recency_bias",
)


def statistics_changes(saved: dict, config: dict) -> list[str]:
    """The changes from the saved config ``saved`` to ``config`` (both validated, as dicts) that would drop or
    invalidate the normalisation statistics a checkpoint carries, each with the reason: normalisation turned off (the
    statistics are dropped) or on (they start from nothing under a trained model), another ``normalize_clip`` than the
    statistics were applied with, another ``gamma`` than the discounted returns whose spread scales the rewards, or
    other ``normalize_skip_keys`` or ``normalize_one_hot`` than the saved statistics leave as they are."""
    observations_on, rewards_on = saved["normalize_observations"], saved["normalize_rewards"]
    reasons = {
        "normalize_observations": "the saved observation statistics would be "
        + ("dropped" if observations_on else "started from nothing under a model trained on raw observations"),
        "normalize_rewards": "the saved return statistics would be "
        + ("dropped" if rewards_on else "started from nothing under a value function trained on raw rewards"),
        "normalize_clip": f"the saved statistics were applied clipped to {saved['normalize_clip']!r}",
        "gamma": f"the saved reward scale is the spread of returns discounted with gamma {saved['gamma']!r}",
        "normalize_skip_keys": "the saved model was trained with these keys as they are and the others normalised",
        "normalize_one_hot": "the saved statistics "
        + ("normalise" if saved["normalize_one_hot"] else "leave as they are")
        + " the one-hot codes",
    }
    applies = {
        "normalize_clip": observations_on or rewards_on,
        "gamma": rewards_on,
        "normalize_skip_keys": observations_on,
        "normalize_one_hot": observations_on,
    }
    return [
        f"{key} {saved[key]!r} -> {config[key]!r} ({reason})"
        for key, reason in reasons.items()
        if applies.get(key, True) and saved[key] != config[key]
    ]


def _value(raw: dict, dotted: str) -> object:
    for part in dotted.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def _environment_shapes(environment: dict) -> str:
    """Observation and action shapes of an environment section ("observations (3,) and actions [3]"), or "" where it
    cannot be built here."""
    try:
        from environments import create_env

        env = create_env(environment)
    except Exception:  # only for the message: the environment's own errors show when training starts
        return ""
    try:
        return f"observations {observations.shape_of(env.observation_space)} and actions {ActionSpec.of(env.action_space)}"
    except (AttributeError, TypeError, ValueError):
        return ""
    finally:
        env.close()


def model_changes(checkpoint: dict, saved: dict, config: dict) -> list[str]:
    """The config keys that differ between the checkpoint's and the new config, named with the first saved parameter
    whose shape the new config changes (or that it adds or drops); empty where the saved parameters fit."""
    model = ActorCriticModel(
        validate_config(config), observations.normalize_shape(checkpoint["observation_shape"]), saved_actions(checkpoint)
    )
    new = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    old = {name: tuple(value.shape) for name, value in checkpoint["model"].items()}
    differ = [name for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
    if not differ:
        return []
    name = differ[0]
    shapes = ", ".join(f"{which} {shape}" for which, shape in (("saved", old.get(name)), ("new", new.get(name))) if shape)
    flat_old, flat_new = flatten(saved), flatten(config)
    keys = [
        f"{key} {flat_old.get(key)!r} -> {flat_new.get(key)!r}"
        for key in flat_new
        if key != "updates" and flat_old.get(key) != flat_new.get(key)
    ]
    return [f"{', '.join(keys) or 'the config'} (parameter {name}: {shapes})"]


def check_resume(checkpoint: dict, config: dict) -> None:
    """Refuse to resume ``checkpoint`` with ``config`` (the resumed run's, validated, as a dict) where the saved state
    would not carry over: ValueError naming each key, its saved and new value, and what to do instead.

    Refused are changes that would drop or invalidate the saved normalisation statistics (``statistics_changes``),
    changes of ``STATE_KEYS`` or ``MEANING_KEYS``, and, where neither, changes that give the model other parameter
    shapes: the saved model, optimizer, memory or environment state would not fit.
    """
    try:
        saved = validate_config(with_saved_defaults(checkpoint["config"])).to_dict()  # keys added since, filled in
    except ConfigError:
        saved = checkpoint["config"]
    statistics = statistics_changes(saved, config) if isinstance(saved, dict) and "gamma" in saved else []
    if statistics:
        raise ValueError(
            f"the checkpoint cannot be resumed with {'; '.join(statistics)}: a resumed run continues the normalisation "
            "statistics of its checkpoint. Resume without that --set, or train a new run with these values "
            "(--config with them and another --run-id)"
        )
    changes = []
    for key in STATE_KEYS + MEANING_KEYS:
        old, new = _value(saved, key), _value(config, key)
        if old == new:
            continue
        if key == "environment" and isinstance(old, dict) and isinstance(new, dict):
            keys = ["type"] if old.get("type") != new.get("type") else sorted(set(old) | set(new), key=str)
            differ = ", ".join(f"environment.{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))
            saved_shapes = (
                f"observations {observations.normalize_shape(checkpoint['observation_shape'])} and actions "
                f"{saved_actions(checkpoint)}"
            )
            new_shapes = _environment_shapes(new)
            new_shapes = f", the new environment gives {new_shapes}" if new_shapes else ""
            changes.append(f"{differ} (the checkpoint's model takes {saved_shapes}{new_shapes})")
        else:
            changes.append(f"{key} {old!r} -> {new!r}")
    if not changes:
        changes = model_changes(checkpoint, saved, config)
    if changes:
        raise ValueError(
            f"the checkpoint cannot be resumed with {'; '.join(changes)}: "
            f"{'this changes' if len(changes) == 1 else 'these change'} the shapes of the saved model or memory "
            "(or the environment the saved episodes replay in). Resume without that --set, or start a new run "
            "with --config and --run-id"
        )
