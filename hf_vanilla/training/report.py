"""What a finished run leaves behind for people: test scores with their signatures, the translations, the model
card's hyper-parameter table, the curves, and a short summary on stdout."""

import json
import os
import platform
from pathlib import Path

import torch
from transformers import PreTrainedModel, Seq2SeqTrainingArguments

from ..plotting import plot_training_curves
from .metrics import TranslationMetric


def card_hyperparameters(
    args: Seq2SeqTrainingArguments,
    model: PreTrainedModel,
    updates: int,
    max_tokens: int,
    checkpoints_averaged: int,
    data: str,
    source_language: str,
    target_language: str,
) -> dict:
    """What the model card's training table shows."""
    return {
        "max_tokens_per_batch": max_tokens,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "processes": args.world_size,
        "optimizer": f"Adam(beta1={args.adam_beta1}, beta2={args.adam_beta2}, eps={args.adam_epsilon})",
        "peak_learning_rate": args.learning_rate,
        "lr_schedule": f"{args.lr_scheduler_type}, warmup {args.warmup_steps}"
        + (f", {args.lr_scheduler_kwargs}" if args.lr_scheduler_kwargs else ""),
        "label_smoothing": args.label_smoothing_factor,
        "dropout": model.config.dropout,
        "updates": updates,  # made, not planned: a time budget or early stopping can end training sooner
        "checkpoints_averaged": checkpoints_averaged,
        "seed": args.seed,
        "vocabulary": model.config.vocab_size,
        "data": data,
        "recipe.source_language": source_language,
        "recipe.target_language": target_language,
    }


def hardware_description(processes: int) -> str:
    """The machine a run trained on, for its scores file: the GPU, or the CPU model with cores and threads."""
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        cpuinfo = Path("/proc/cpuinfo")  # Linux only; elsewhere platform's answer
        lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
        models = [line.split(":", 1)[1].strip() for line in lines if "model name" in line]
        name = models[0] if models else platform.processor() or platform.machine()
        device = f"CPU {name}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    return f"{device}; {processes} process(es); torch {torch.__version__}; {platform.system()}"


def write_test_report(
    output_dir: Path,
    log_history: list[dict],
    metric: TranslationMetric,
    test_pairs,
    hypotheses: list[str],
    scores: dict,
    hyperparameters: dict,
    examples: int = 3,
) -> dict:
    """Score against the raw references, write scores, translations, hyper-parameters and curves, print a summary.
    Returns the scores computed here (raw-reference BLEU and the signatures)."""
    signed = metric.compute(predictions=hypotheses, references=[[t] for t in test_pairs["target"]])
    result = {
        "bleu_raw_references": signed["bleu"],
        "bleu_signature": signed["bleu_signature"],
        "chrf_signature": signed["chrf_signature"],
    }
    # Beside the model, not in its folder: a saved model holds the model, never the settings that trained it.
    (output_dir / "hyperparameters.json").write_text(json.dumps(hyperparameters, indent=2))
    (output_dir / "test_scores.json").write_text(json.dumps({**scores, **result}, indent=2))
    (output_dir / "test_translations.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    plot_training_curves(log_history, output_dir / "curves.png")
    for source, hypothesis in list(zip(test_pairs["source"], hypotheses, strict=True))[:examples]:
        print(f"  {source}\n  -> {hypothesis}")
    print(f"test BLEU {signed['bleu']:.2f}  chrF {scores.get('test_chrf', float('nan')):.2f}")
    print(f"sacreBLEU signature: {signed['bleu_signature']}")
    return result
