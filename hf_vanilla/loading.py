"""Strict loading: a checkpoint that does not fit the model is an error, never random weights.

`from_pretrained` only logs missing or unexpected weights and initialises the missing ones at random; a
translation service or an averaging job built on that would run on garbage without noticing. Every place that
fills a model with weights (our commands' `load_model`, checkpoint averaging, the Marian import) goes through the
one rule here. Like every hf_vanilla module, this one imports the package first, whose `__init__` registers the
model with the Auto classes: `load_model` needs no `import hf_vanilla` beside it.
"""

from collections.abc import Iterable
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel


def check_weights_fit(
    source: str | Path, missing: Iterable[str], unexpected: Iterable[str], mismatched: Iterable = ()
) -> None:
    """Raise `ValueError` naming `source` if any weight is missing, unexpected or of the wrong shape."""
    problems = {
        kind: sorted(names)
        for kind, names in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("mismatched keys", mismatched),
        )
        if names
    }
    if problems:
        details = "; ".join(
            f"{kind}: {names[:5]}{' ...' if len(names) > 5 else ''}" for kind, names in problems.items()
        )
        raise ValueError(
            f"{source}: the checkpoint does not match the model its config.json describes ({details}). Refusing to "
            "fill the gaps with random weights: check that config.json and model.safetensors belong together."
        )


def load_state_dict_strictly(model: PreTrainedModel, state_dict: dict[str, torch.Tensor], source: str | Path) -> None:
    """`model.load_state_dict(state_dict)` under `check_weights_fit`; tied copies may be absent (they are stored
    once), and the ties are restored afterwards."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    check_weights_fit(source, set(missing) - set(model.all_tied_weights_keys), unexpected)
    model.tie_weights()


def load_model(path: str | Path, **kwargs) -> PreTrainedModel:
    """`AutoModelForSeq2SeqLM.from_pretrained(path)` from safetensors only, under `check_weights_fit`; a file that
    cannot be read (truncated, corrupt) or an invalid config is a `ValueError` too."""
    try:
        model, info = AutoModelForSeq2SeqLM.from_pretrained(
            path, output_loading_info=True, use_safetensors=True, **kwargs
        )
    except SafetensorError as error:
        raise ValueError(
            f"{path}: the weights file cannot be read ({error}); it is truncated or corrupt. Copy or download it "
            "again."
        ) from error
    except StrictDataclassError as error:  # the config's own check, with the message that names the field
        raise ValueError(f"{path}: invalid config.json: {error.__cause__ or error}") from error
    check_weights_fit(path, info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"])
    return model
