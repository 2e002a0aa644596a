"""Strict loading for our commands: a checkpoint that does not fit the model is an error, never random weights.

`from_pretrained` only logs missing or unexpected weights and initialises the missing ones at random; a
translation service or an averaging job built on that would run on garbage without noticing.
"""

from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel


def load_model(path: str | Path, **kwargs) -> PreTrainedModel:
    """`AutoModelForSeq2SeqLM.from_pretrained(path)` from safetensors only, raising `ValueError` if the checkpoint
    lacks weights the model has, holds weights it does not have, or cannot be read (truncated, corrupt)."""
    try:
        model, info = AutoModelForSeq2SeqLM.from_pretrained(
            path, output_loading_info=True, use_safetensors=True, **kwargs
        )
    except SafetensorError as error:
        raise ValueError(
            f"{path}: the weights file cannot be read ({error}); it is truncated or corrupt. Copy or download it "
            "again."
        ) from error
    problems = {
        kind: sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[kind]
    }
    if problems:
        details = "; ".join(
            f"{kind.replace('_', ' ')}: {names[:5]}{' ...' if len(names) > 5 else ''}"
            for kind, names in problems.items()
        )
        raise ValueError(
            f"{path}: the checkpoint does not match the model its config.json describes ({details}). Refusing to "
            "fill the gaps with random weights: check that config.json and model.safetensors belong together."
        )
    return model
