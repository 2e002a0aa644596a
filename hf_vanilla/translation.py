"""Batch translation of many sentences, and the cross-attention map of one."""

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def translate_lines(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lines: Sequence[str],
    batch_size: int = 32,
    length_ratio: float = 1.0,
    length_offset: int = 50,
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
            budget = math.ceil(length_ratio * batch["input_ids"].shape[1] + length_offset)
            with torch.no_grad():
                output = model.generate(**batch, max_new_tokens=budget, **generate_kwargs)
            texts = tokenizer.batch_decode(output, skip_special_tokens=True)
            per_source = len(texts) // len(indices)
            for position, index in enumerate(indices):
                results[index] = texts[position * per_source : (position + 1) * per_source]
            bar.update(len(indices))
    return results


def plot_cross_attention(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, output_path: str | Path, **generate_kwargs
) -> str:
    """Translate `source`, then draw the last decoder layer's cross-attention (mean over heads) as a PNG.

    Rows are target tokens, columns source tokens: a trained model shows the soft word alignment.
    Returns the translation.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inputs = tokenizer(source, return_tensors="pt").to(model.device)
    with torch.no_grad():
        generated = model.generate(**inputs, **generate_kwargs)
        attention_implementation = model.config._attn_implementation
        model.set_attn_implementation("eager")  # SDPA does not return attention weights
        try:
            out = model(**inputs, decoder_input_ids=generated, output_attentions=True)
        finally:
            model.set_attn_implementation(attention_implementation)
    weights = out.cross_attentions[-1][0].mean(0)[:-1].float().cpu()  # row t: attention when predicting token t+1
    source_tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    target_tokens = tokenizer.convert_ids_to_tokens(generated[0, 1:])
    figure, axis = plt.subplots(figsize=(1 + 0.45 * len(source_tokens), 1 + 0.4 * len(target_tokens)))
    axis.imshow(weights.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    axis.set_xticks(range(len(source_tokens)), [_readable(t, tokenizer) for t in source_tokens], rotation=90)
    axis.set_yticks(range(len(target_tokens)), [_readable(t, tokenizer) for t in target_tokens])
    axis.set_xlabel("source")
    axis.set_ylabel("target")
    axis.set_title("cross-attention, last decoder layer (mean over heads)")
    figure.tight_layout()
    figure.savefig(output_path, dpi=120)
    plt.close(figure)
    return tokenizer.decode(generated[0], skip_special_tokens=True)


def _readable(token: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """A token as text (byte-level BPE stores 'Ġ' for a space and bytes for non-ASCII letters)."""
    return tokenizer.convert_tokens_to_string([token]).replace(" ", "▁") or token
