"""Pictures: training curves and the cross-attention map of one translation.

Figures are built with `matplotlib.figure.Figure` and written straight to a file, so the global pyplot state (and a
notebook's inline backend) is never touched. matplotlib comes with the `train` extra.
"""

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("Plots need matplotlib: pip install 'hf-vanilla[train]'.") from error
    return Figure(figsize=(width, height))


def series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The (update, value) pairs of one logged quantity, in order."""
    points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
    return [step for step, _ in points], [value for _, value in points]


def plot_training_curves(log_history: list[dict], path: str | Path) -> None:
    """Training and validation loss, validation BLEU and, when measured, how much the model uses its source (the
    validation loss with shuffled sources minus the true one), against the update step."""
    panels = ["loss", "bleu"] + (["source"] if series(log_history, "eval_source_use")[0] else [])
    figure = _figure(5.5 * len(panels), 4)
    axes = figure.subplots(1, len(panels))
    loss_axis, bleu_axis = axes[0], axes[1]
    for key, label in (("loss", "training loss (label-smoothed)"), ("eval_loss", "validation loss")):
        steps, values = series(log_history, key)
        if steps:
            loss_axis.plot(steps, values, label=label, marker="." if key == "eval_loss" else None)
    loss_axis.set_xlabel("update")
    loss_axis.set_ylabel("cross-entropy")
    loss_axis.legend()
    bleu_axis.plot(*series(log_history, "eval_bleu"), marker="o", color="tab:green")
    bleu_axis.set_xlabel("update")
    bleu_axis.set_ylabel("validation BLEU")
    if "source" in panels:
        source_axis = axes[2]
        source_axis.plot(*series(log_history, "eval_source_use"), marker="o", color="tab:purple")
        source_axis.axhline(0.0, color="grey", linewidth=0.8)
        source_axis.set_xlabel("update")
        source_axis.set_ylabel("source use (nats/token)")
        source_axis.set_title("loss with shuffled sources - true loss", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_cross_attention(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, output_path: str | Path, **generate_kwargs
) -> str:
    """Translate `source`, then draw the last decoder layer's cross-attention (mean over heads) as a PNG.

    Rows are target tokens, columns source tokens: a trained model shows the soft word alignment.
    Returns the translation.
    """
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
    figure = _figure(1 + 0.45 * len(source_tokens), 1 + 0.4 * len(target_tokens))
    axis = figure.subplots()
    axis.imshow(weights.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    axis.set_xticks(range(len(source_tokens)), [_readable(t, tokenizer) for t in source_tokens], rotation=90)
    axis.set_yticks(range(len(target_tokens)), [_readable(t, tokenizer) for t in target_tokens])
    axis.set_xlabel("source")
    axis.set_ylabel("target")
    axis.set_title("cross-attention, last decoder layer (mean over heads)")
    figure.tight_layout()
    figure.savefig(output_path, dpi=120)
    return tokenizer.decode(generated[0], skip_special_tokens=True)


def _readable(token: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """A token as text (byte-level BPE stores 'Ġ' for a space and bytes for non-ASCII letters)."""
    return tokenizer.convert_tokens_to_string([token]).replace(" ", "▁") or token
