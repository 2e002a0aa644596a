"""Checkpoint averaging (the paper averages the last 5 checkpoints of a base model, 20 of a big one)."""

import re
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from ..loading import load_model, load_state_dict_strictly
from .train_state import read_train_state


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Trainer checkpoints (`checkpoint-<step>`) under `output_dir`, oldest first."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(folders, key=lambda p: int(p.name.split("-")[1]))


def before_decay(checkpoint: Path) -> bool:
    """Whether `checkpoint` was saved before the learning rate's decay began, by the progress its run's state recorded
    (`TrainState`). Checkpoints of other schedules, which decay from the first update or never, are not."""
    saved = read_train_state(checkpoint) or {}
    return saved.get("decay_start", 1) < 1 and saved["progress"] < saved["decay_start"]


def last_checkpoints(output_dir: str | Path, last_n: int) -> list[Path]:
    """The last `last_n` checkpoints of a run that averaging takes: of a run on the budget schedule, only those of the
    decay. Weights from before it, still at the peak learning rate, are worse than the decayed ones: averaged in,
    they pull the mean back towards the stable phase. None for `last_n` 0."""
    if last_n <= 0:
        return []
    return [folder for folder in checkpoint_folders(output_dir) if not before_decay(folder)][-last_n:]


def average_state_dicts(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the `model.safetensors` weights of several checkpoints of one model.

    Sums run in float64 and the mean is cast back to each tensor's dtype; integer tensors are taken from the first.
    """
    if not paths:
        raise ValueError("Nothing to average: pass at least one checkpoint folder.")
    early = [str(path) for path in paths if before_decay(Path(path))]
    if early:
        raise ValueError(
            f"{', '.join(early)}: saved before the learning rate's decay began (by the progress in "
            "trainer_state.json); averaged with decayed weights, it makes them worse. Average checkpoints of the "
            "decay only (hf-vanilla average --from RUN --last N picks them)."
        )
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        file = Path(path) / "model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"{file} does not exist; checkpoints must hold safetensors weights.")
        with safe_open(file, framework="pt") as weights:
            if dtypes and set(weights.keys()) != set(dtypes):
                raise ValueError(f"{file} holds different weights than {paths[0]}: not checkpoints of one model.")
            for key in weights.keys():
                tensor = weights.get_tensor(key)
                if key not in dtypes:
                    dtypes[key] = tensor.dtype
                    total[key] = tensor.double() if tensor.is_floating_point() else tensor
                elif tensor.is_floating_point():
                    total[key] += tensor.double()
    return {
        key: (value / len(paths)).to(dtypes[key]) if dtypes[key].is_floating_point else value
        for key, value in total.items()
    }


def average_checkpoints(paths: list[str | Path]) -> PreTrainedModel:
    """A model (config of the last checkpoint) holding the mean weights; tied weights stay tied."""
    model = load_model(paths[-1])
    load_state_dict_strictly(model, average_state_dicts(paths), source=f"the average of {len(paths)} checkpoints")
    return model
