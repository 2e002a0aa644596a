# Copyright 2026 The hf_vanilla Authors. Licensed under the Apache License, Version 2.0.
"""`pipeline("translation")` for hf_vanilla models.

transformers 5 removed its translation pipeline. This one is copied next to published weights (registered in
`config.custom_pipelines`) by every `save_pretrained`, so `pipeline("translation", model=folder,
trust_remote_code=True)` works where hf_vanilla is not installed; `import hf_vanilla` registers it in-process for
model objects and folders (`translation_<source>_to_<target>` names too), where it also serves other seq2seq models
(MarianMT, ...) exactly as their `generate()` does. It imports only torch and transformers.
"""

import math

import torch
from transformers import Pipeline


# §6.1: "We set the maximum output length during inference to input length + 50, but terminate early when possible."
EXTRA_TARGET_TOKENS = 50

_LENGTH_ARGUMENTS = ("max_new_tokens", "max_length")

# What every saved hf_vanilla folder lists in `config.custom_pipelines` (the config's `to_dict` writes it, with the
# model's `translation_<source>_to_<target>` name too; `save_pretrained` copies this file beside the config):
# `pipeline("translation", model=folder, trust_remote_code=True)` then works in a Python without hf_vanilla, for
# Trainer checkpoints as much as for published models.
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_vanilla.VanillaTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


def decoding_budget(source_length: int, ratio: float = 1.0, extra: int = EXTRA_TARGET_TOKENS) -> int:
    """The most new tokens to generate for a source of `source_length` tokens: `ratio * length + extra`, rounded
    up (the paper: length + 50)."""
    return math.ceil(ratio * source_length + extra)


def decoding_max_length(source_length: int, ratio: float = 1.0, extra: int = EXTRA_TARGET_TOKENS) -> int:
    """`generate()`'s `max_length` for `decoding_budget`: the decoder start token, then the budget. The pipeline,
    `hf-vanilla translate` and the training recipe all decode with it: `max_new_tokens` beside the generation config's
    own `max_length` would make `generate()` warn at every call that both were set."""
    return 1 + decoding_budget(source_length, ratio, extra)


def check_tokenizer_matches_model(tokenizer, config) -> None:
    """Fail when a pipeline or trainer is built, not mid-translation, if the tokenizer can produce ids the model
    cannot embed or gives padding / end-of-sentence a different id than the model (a tokenizer from another run)."""
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} entries but the model's vocabulary only {config.vocab_size} "
            "(`config.vocab_size`): they come from different runs. Use the tokenizer saved with the model."
        )
    for name in ("pad_token_id", "eos_token_id"):
        tokenizer_id, model_id = getattr(tokenizer, name, None), getattr(config, name, None)
        if tokenizer_id is not None and model_id is not None and tokenizer_id != model_id:
            raise ValueError(
                f"The tokenizer's `{name}` is {tokenizer_id} but the model's is {model_id}: they come from "
                "different runs. Use the tokenizer saved with the model."
            )


class VanillaTranslationPipeline(Pipeline):
    """Translate a string or a list of strings: returns `[{"translation_text": ...}]` per input, as users know it.

    Generation options (`num_beams`, `max_new_tokens`, `length_penalty`, `num_return_sequences`, `do_sample`, ...)
    go to `model.generate`, at construction or per call; the model's `generation_config` supplies the rest.
    """

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            raise ValueError("The translation pipeline needs a tokenizer: pass `tokenizer=` or a folder that has one.")
        check_tokenizer_matches_model(self.tokenizer, self.model.config)
        expected = getattr(self.model.config, "translation_task", None)
        if self.task.startswith("translation_") and expected and self.task != expected:
            raise ValueError(f"The task is {self.task!r}, but this model translates {expected!r}.")

    def _sanitize_parameters(self, clean_up_tokenization_spaces: bool | None = None, **generate_kwargs):
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        forward_params = {"generate_kwargs": generate_kwargs} if generate_kwargs else {}
        return {}, forward_params, postprocess_params

    def __call__(self, inputs: str | list[str], **kwargs) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        """A string gives `[{"translation_text": t}, ...]` (one dict per returned sequence); a list gives one such
        list per input, flattened to one dict per input when each input has a single translation."""
        if isinstance(inputs, str):
            return super().__call__(inputs, **kwargs)
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise ValueError(f"Pass a string or a non-empty list of strings to translate, got {inputs!r}.")
        results = super().__call__(list(inputs), **kwargs)
        if all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def preprocess(self, text: str) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"The translation pipeline takes strings, got {type(text).__name__}: {text!r}.")
        if not text.strip():
            raise ValueError("Cannot translate an empty string; drop empty lines before calling the pipeline.")
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, model_inputs: dict[str, torch.Tensor], generate_kwargs: dict | None = None) -> dict:
        generate_kwargs = dict(generate_kwargs or {})
        batch_size, source_length = model_inputs["input_ids"].shape
        if self.model.config.model_type == "vanilla_transformer" and not any(
            name in generate_kwargs for name in _LENGTH_ARGUMENTS
        ):
            # hf_vanilla models decode with the paper's budget; any other model as its generation config says.
            generate_kwargs["max_length"] = decoding_max_length(source_length)
        output_ids = self.model.generate(**model_inputs, **self.generate_kwargs_of_this_call(generate_kwargs))
        # [batch * n_best, T] -> [batch, n_best, T], so the pipeline's un-batching keeps each input's n-best together
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def generate_kwargs_of_this_call(self, generate_kwargs: dict) -> dict:
        """The call's generation parameters over the pipeline's, as the installed release's own pipelines merge them:
        `Pipeline._prepare_generate_kwargs` where it exists (the later 5.x releases), before it the pipeline's
        generation config unless the call passes one."""
        prepare = getattr(self, "_prepare_generate_kwargs", None)
        if prepare is not None:
            return prepare(generate_kwargs)
        return {"generation_config": self.generation_config, **generate_kwargs}

    def postprocess(self, model_outputs: dict, clean_up_tokenization_spaces: bool = False) -> list[dict[str, str]]:
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]


__all__ = ["VanillaTranslationPipeline"]
