"""Decoding for users: batch translation of many sentences, and generate()'s compiled speed path."""

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, PreTrainedModel, PreTrainedTokenizerBase

from .pipeline_vanilla import EXTRA_TARGET_TOKENS, decoding_budget


def translate_lines(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lines: Sequence[str],
    batch_size: int = 32,
    length_ratio: float = 1.0,
    length_offset: int = EXTRA_TARGET_TOKENS,
    progress: bool = True,
    **generate_kwargs,
) -> list[list[str]]:
    """Translate `lines`, returning for each (in input order) its `num_return_sequences` candidates.

    Sentences are batched by source length so little compute goes to padding. Each batch may produce at most
    `length_ratio * longest_source + length_offset` new tokens (the paper: source length + 50).
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}.")
    empty = [number for number, line in enumerate(lines, start=1) if not line.strip()]
    if empty:
        raise ValueError(f"Cannot translate empty lines (line {empty[0]} and {len(empty) - 1} more); remove them.")
    encoded = tokenizer(list(lines), add_special_tokens=True)["input_ids"]
    order = sorted(range(len(lines)), key=lambda i: len(encoded[i]))
    results: list[list[str]] = [[] for _ in lines]
    model.eval()
    with tqdm(total=len(lines), desc="translating", unit="sent", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in indices]}, return_tensors="pt").to(model.device)
            budget = decoding_budget(batch["input_ids"].shape[1], length_ratio, length_offset)
            with torch.no_grad():
                output = model.generate(**batch, max_new_tokens=budget, **generate_kwargs)
            texts = tokenizer.batch_decode(output, skip_special_tokens=True)
            per_source = len(texts) // len(indices)
            for position, index in enumerate(indices):
                results[index] = texts[position * per_source : (position + 1) * per_source]
            bar.update(len(indices))
    return results


def static_cache_and_compile() -> dict:
    """`generate()` options for its own speed path: a preallocated (static) cache and the decoding step compiled
    with `torch.compile(fullgraph=True)`. transformers compiles only on accelerators unless asked, so every device is
    asked explicitly. Greedy decoding and sampling use it; beam search runs the step eagerly."""
    config = CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True
    return dict(cache_implementation="static", compile_config=config)
