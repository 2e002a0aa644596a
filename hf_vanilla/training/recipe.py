"""The paper's training recipe on top of `Seq2SeqTrainer`, adding only what the library lacks.

The library provides the loop, Accelerate (CPU, one or many GPUs, FSDP), checkpoints and resumption, the
inverse-square-root schedule (`lr_scheduler_type="inverse_sqrt"` is exactly §5.3's formula, normalised to its
peak), label smoothing (`label_smoothing_factor`), `predict_with_generate` evaluation, early stopping and
TensorBoard. Added here: token-budget batching (fairseq's `--max-tokens`), a sacreBLEU/chrF metric that works
offline, CSV logs with a PNG of the curves, a wall-clock budget, and averaging of the last checkpoints.
"""

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    set_seed,
)

from ..configuration_vanilla import VanillaTransformerConfig
from ..data import load_parallel_corpus
from ..loading import load_model
from ..modeling_vanilla import VanillaTransformerForConditionalGeneration
from ..pipeline_vanilla import decoding_budget
from ..tokenization import train_bpe_tokenizer
from .arguments import RecipeArguments, resume_point, with_paper_learning_rate
from .callbacks import (
    CheckpointAveragingCallback,
    CsvLoggerCallback,
    SourceNeglectCallback,
    StopOnSigtermCallback,
    TimeBudgetCallback,
)
from .metrics import TranslationMetric, build_compute_metrics
from .report import card_hyperparameters, hardware_description, write_test_report
from .trainer import TokenBudgetSeq2SeqTrainer


logger = logging.getLogger(__name__)


class TrainingInterrupted(Exception):
    """Raised by `run_training` after a SIGTERM stop: the checkpoint is saved; resume from it."""

    def __init__(self, step: int, output_dir: Path):
        self.step = step
        super().__init__(
            f"Stopped by SIGTERM after update {step}; the checkpoint is {output_dir / f'checkpoint-{step}'}. "
            "Run the same command with `--resume_from_checkpoint last` to continue from it."
        )


def prepare_tokenizer(
    tokenizer_path: str | None, vocab_size: int, train_pairs, output_dir: Path, resuming: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer at `tokenizer_path`; when resuming, the run's own; else a joint BPE of `vocab_size` trained on
    the training pairs and saved to `<output_dir>/tokenizer`."""
    if tokenizer_path:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    if resuming and (output_dir / "tokenizer").is_dir():  # the checkpoints' ids come from this one
        return AutoTokenizer.from_pretrained(output_dir / "tokenizer")
    tokenizer = train_bpe_tokenizer(
        [*train_pairs["source"], *train_pairs["target"]], vocab_size=vocab_size, show_progress=False
    )
    tokenizer.save_pretrained(output_dir / "tokenizer")
    return tokenizer


def build_model(
    model_config: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    source_language: str | None = None,
    target_language: str | None = None,
) -> VanillaTransformerForConditionalGeneration:
    """A freshly initialised model of the preset `model_config`, sized and numbered for `tokenizer`, that knows the
    languages it will translate between."""
    config = VanillaTransformerConfig.from_json_file(model_config)
    config.source_language, config.target_language = source_language, target_language
    config.vocab_size = config.decoder_vocab_size = len(tokenizer)
    config.pad_token_id, config.bos_token_id = tokenizer.pad_token_id, tokenizer.bos_token_id
    config.eos_token_id, config.unk_token_id = tokenizer.eos_token_id, tokenizer.unk_token_id
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.validate()
    return VanillaTransformerForConditionalGeneration(config)


def tokenize_corpus(corpus, tokenizer: PreTrainedTokenizerBase, max_length: int):
    """Token ids plus lengths; over-long *training* pairs are dropped and counted, evaluation pairs never."""

    def encode(batch):
        encoded = tokenizer(batch["source"], text_target=batch["target"])
        encoded["source_length"] = [len(ids) for ids in encoded["input_ids"]]
        encoded["target_length"] = [len(ids) for ids in encoded["labels"]]
        return encoded

    tokenized = corpus.map(encode, batched=True, desc="tokenizing")
    train = tokenized["train"]
    kept = train.filter(
        lambda row: row["source_length"] <= max_length and row["target_length"] <= max_length, desc="length filter"
    )
    dropped = len(train) - len(kept)
    logger.warning(
        "Length filter: kept %d training pairs, dropped %d longer than %d tokens.", len(kept), dropped, max_length
    )
    tokenized["train"] = kept
    return tokenized, dropped


def recipe_callbacks(recipe: RecipeArguments, output_dir: Path, tokenizer: PreTrainedTokenizerBase) -> list:
    """The callbacks a run's options ask for; the first two (CSV log, SIGTERM stop) are always on."""
    callbacks = [CsvLoggerCallback(output_dir / "log.csv"), StopOnSigtermCallback()]
    if recipe.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience))
    if recipe.max_train_minutes:
        callbacks.append(TimeBudgetCallback(recipe.max_train_minutes))
    if recipe.detect_source_neglect:
        callbacks.append(SourceNeglectCallback())
    if recipe.average_last:
        callbacks.append(CheckpointAveragingCallback(recipe.average_last, tokenizer))
    return callbacks


def run_training(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """Train, evaluate on the test split with beam search, save `<output_dir>/final`; returns the test scores."""
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    limits = {
        "train": recipe.max_train_examples,
        "validation": recipe.max_eval_examples,
        "test": recipe.max_test_examples,
    }
    corpus = load_parallel_corpus(
        recipe.data,
        recipe.source_language,
        recipe.target_language,
        pattern=recipe.data_pattern,
        max_examples={split: limit for split, limit in limits.items() if limit},
    )
    tokenizer = prepare_tokenizer(
        recipe.tokenizer,
        recipe.vocab_size,
        corpus["train"],
        output_dir,
        resuming=bool(training_args.resume_from_checkpoint),
    )
    set_seed(training_args.seed)  # before the model is built, so its initial weights follow the seed
    model = build_model(recipe.model_config, tokenizer, recipe.source_language, recipe.target_language)
    tokenized, dropped = tokenize_corpus(corpus, tokenizer, recipe.max_length)

    longest_source = max(max(tokenized[split]["source_length"]) for split in ("validation", "test"))
    training_args = replace(
        with_paper_learning_rate(training_args, recipe.lr_scale, model.config.d_model),
        # `max_length` counts the decoder start token too; never the library's silent 20
        generation_max_length=1 + decoding_budget(longest_source, extra=recipe.extra_target_tokens),
    )
    metric = TranslationMetric(tokenize=recipe.bleu_tokenize, lowercase=recipe.bleu_lowercase)
    callbacks = recipe_callbacks(recipe, output_dir, tokenizer)
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=build_compute_metrics(tokenizer, metric),
        callbacks=callbacks,
        max_tokens=recipe.max_tokens,
        measure_source_use=recipe.detect_source_neglect,
    )
    trained = trainer.train(resume_from_checkpoint=resume_point(training_args.resume_from_checkpoint))
    stopped_at = next(c.stopped_at for c in callbacks if isinstance(c, StopOnSigtermCallback))
    if stopped_at is not None:
        raise TrainingInterrupted(stopped_at, output_dir)

    trainer.accelerator.wait_for_everyone()
    if recipe.average_last and (output_dir / "averaged").is_dir():  # every rank evaluates the averaged weights
        averaged = load_model(output_dir / "averaged")
        trainer.model.load_state_dict(averaged.state_dict())
    test = trainer.predict(
        tokenized["test"], num_beams=recipe.test_num_beams, max_length=training_args.generation_max_length
    )
    scores = {
        **test.metrics,
        "dropped_training_pairs": dropped,
        "global_step": trainer.state.global_step,
        "seed": training_args.seed,
        "train_wall_seconds": trained.metrics["train_runtime"],  # this session's training, evaluations included
        "hardware": hardware_description(training_args.world_size),
    }
    if trainer.is_world_process_zero():
        trainer.save_model(output_dir / "final")
        hypotheses = tokenizer.batch_decode(
            np.where(test.predictions == -100, tokenizer.pad_token_id, test.predictions), skip_special_tokens=True
        )
        hyperparameters = card_hyperparameters(
            training_args,
            model,
            updates=trainer.state.global_step,
            max_tokens=recipe.max_tokens,
            checkpoints_averaged=recipe.average_last,
            data=recipe.data,
            source_language=recipe.source_language,
            target_language=recipe.target_language,
        )
        scores.update(
            write_test_report(
                output_dir,
                trainer.state.log_history,
                metric,
                corpus["test"],
                hypotheses,
                scores,
                hyperparameters,
                examples=recipe.translate_examples,
            )
        )
    return scores
