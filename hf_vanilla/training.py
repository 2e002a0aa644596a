"""The paper's training recipe on top of `Seq2SeqTrainer`, adding only what the library lacks.

The library provides the loop, Accelerate (CPU, one or many GPUs, FSDP), checkpoints and resumption, the
inverse-square-root schedule (`lr_scheduler_type="inverse_sqrt"` is exactly §5.3's formula, normalised to its
peak), label smoothing (`label_smoothing_factor`), `predict_with_generate` evaluation, early stopping and
TensorBoard. Added here: token-budget batching (fairseq's `--max-tokens`), a sacreBLEU/chrF metric that works
offline, CSV logs with a PNG of the curves, a wall-clock budget, and averaging of the last checkpoints.
"""

import copy
import csv
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import evaluate
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from .averaging import average_checkpoints, checkpoint_folders
from .configuration_vanilla import VanillaTransformerConfig
from .data import load_parallel_corpus
from .loading import load_model
from .modeling_vanilla import VanillaTransformerForConditionalGeneration
from .pipeline_vanilla import check_tokenizer_matches_model
from .tokenization import train_bpe_tokenizer


logger = logging.getLogger(__name__)


@dataclass
class RecipeArguments:
    """What a translation run needs beyond `Seq2SeqTrainingArguments`; every field is a command-line option."""

    data: str = field(
        default="../shared/data/multi30k",
        metadata={"help": "folder of aligned text files ({split}.{lang}[.gz]) or a Hub dataset id"},
    )
    data_pattern: str = field(default="{split}.{lang}", metadata={"help": "file name pattern inside `data`"})
    source_language: str = "en"
    target_language: str = "de"
    max_train_examples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_examples: int | None = field(default=None, metadata={"help": "use only the first N validation pairs"})
    max_test_examples: int | None = field(default=None, metadata={"help": "use only the first N test pairs"})
    model_config: str = field(default="configs/tiny.json", metadata={"help": "model preset (JSON)"})
    tokenizer: str | None = field(default=None, metadata={"help": "trained tokenizer folder; trained if not given"})
    vocab_size: int = field(default=10000, metadata={"help": "size of the BPE vocabulary to train"})
    max_length: int = field(default=256, metadata={"help": "training pairs longer (in tokens) are dropped, counted"})
    max_tokens: int = field(default=4096, metadata={"help": "tokens per batch including padding (per process)"})
    lr_scale: float | None = field(
        default=None,
        metadata={"help": "set the peak learning rate by the paper's formula: scale * d_model^-0.5 * warmup^-0.5"},
    )
    average_last: int = field(default=0, metadata={"help": "average the last N checkpoints at the end (0: off)"})
    early_stopping_patience: int | None = field(default=None, metadata={"help": "evaluations without BLEU gain"})
    max_train_minutes: float | None = field(default=None, metadata={"help": "stop training after this wall time"})
    bleu_tokenize: str = field(default="13a", metadata={"help": "sacreBLEU tokenizer; 'none' for pre-tokenized"})
    bleu_lowercase: bool = False
    test_num_beams: int = field(default=4, metadata={"help": "beam size for the final test evaluation"})
    extra_target_tokens: int = field(default=50, metadata={"help": "generation budget: longest source + this"})
    translate_examples: int = field(default=3, metadata={"help": "test sentences printed with translations"})


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs holding at most `max_tokens` tokens each, padding included (fairseq's
    `--max-tokens`): a batch of n pairs costs n * its longest side. Batches are formed once from a seeded,
    length-sorted order (so their number is fixed, as the Trainer needs) and visited in a new order each epoch."""

    def __init__(
        self,
        source_lengths: list[int],
        target_lengths: list[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
    ):
        lengths = np.maximum(np.asarray(source_lengths), np.asarray(target_lengths))
        if lengths.size == 0:
            raise ValueError("No training pairs to batch.")
        if lengths.max() > max_tokens:
            raise ValueError(
                f"A pair of {lengths.max()} tokens exceeds `max_tokens`={max_tokens}; raise `max_tokens` or lower "
                "`max_length` so long pairs are filtered out."
            )
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0
        order = np.random.default_rng(seed).permutation(len(lengths))
        order = order[np.argsort(lengths[order], kind="stable")]  # by length; ties in seeded random order
        self.batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for index in order.tolist():
            longest_if_added = max(longest, int(lengths[index]))
            if batch and longest_if_added * (len(batch) + 1) > max_tokens:
                self.batches.append(batch)
                batch, longest_if_added = [], int(lengths[index])
            batch.append(index)
            longest = longest_if_added
        self.batches.append(batch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = range(len(self.batches))
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.batches)).tolist()
        for position in order:
            yield self.batches[position]

    def __len__(self) -> int:
        return len(self.batches)


class TranslationMetric(evaluate.Metric):
    """Corpus BLEU and chrF with sacreBLEU, as an `evaluate` metric that needs no download (the Hub's
    `evaluate.load("sacrebleu")` fetches a script at run time). Returns the scores and their signatures."""

    def __init__(self, tokenize: str = "13a", lowercase: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.tokenize, self.lowercase = tokenize, lowercase

    def _info(self) -> evaluate.MetricInfo:
        import datasets

        return evaluate.MetricInfo(
            description="sacreBLEU corpus BLEU and chrF",
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores.",
            inputs_description="predictions: list of strings; references: list of lists of strings",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions: list[str], references: list[list[str]]) -> dict:
        from sacrebleu.metrics import BLEU, CHRF

        streams = [list(stream) for stream in zip(*references, strict=True)]
        bleu = BLEU(tokenize=self.tokenize, lowercase=self.lowercase)
        chrf = CHRF(lowercase=self.lowercase)
        bleu_score, chrf_score = bleu.corpus_score(predictions, streams), chrf.corpus_score(predictions, streams)
        return {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }


def build_compute_metrics(tokenizer: PreTrainedTokenizerBase, metric: TranslationMetric):
    """`compute_metrics` for `predict_with_generate`: -100 (padding between batches) becomes pad before decoding."""

    def compute_metrics(eval_prediction) -> dict:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        predictions = np.where(predictions == -100, tokenizer.pad_token_id, predictions)
        labels = np.where(labels == -100, tokenizer.pad_token_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = [[text] for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = metric.compute(predictions=hypotheses, references=references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}  # Trainer logs numbers only

    return compute_metrics


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches come from a `TokenBudgetBatchSampler`."""

    def __init__(self, *args, max_tokens: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        if isinstance(self.processing_class, PreTrainedTokenizerBase):
            check_tokenizer_matches_model(self.processing_class, self.model.config)

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        sampler = TokenBudgetBatchSampler(
            dataset["source_length"], dataset["target_length"], self.max_tokens, seed=self.args.seed
        )
        dataset = self._remove_unused_columns(dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        # Accelerate shards the batches across processes: each rank gets every n-th batch.
        return self.accelerator.prepare(loader)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # While training, the model computes the label-smoothed loss itself, a chunk of positions at a time, instead
        # of the library's `LabelSmoother` over the materialised [tokens, vocab] logits: the same loss with the same
        # normalisation (`num_items_in_batch`), without the largest tensor of a small model's step.
        if not (model.training and self.label_smoother is not None and "labels" in inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {**inputs, "label_smoothing": self.label_smoother.epsilon, "skip_logits": not return_outputs}
        smoother, self.label_smoother = self.label_smoother, None  # the model smooths, so the library must not
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.label_smoother = smoother

    def prediction_step(self, *args, **kwargs):
        # Seq2SeqTrainer fills every library default into `model.generation_config` (max_length=20 among them),
        # which checkpoints would then save and every later `generate(max_new_tokens=...)` would warn about.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(*args, **kwargs)
        finally:
            self.model.generation_config = generation_config


class CsvLoggerCallback(TrainerCallback):
    """Every logged value as a `step,epoch,name,value` row of `<output_dir>/log.csv`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        is_new = not self.path.exists()
        with self.path.open("a", newline="") as handle:
            writer = csv.writer(handle)
            if is_new:
                writer.writerow(["step", "epoch", "name", "value"])
            for name, value in logs.items():
                if isinstance(value, (int, float)):
                    writer.writerow([state.global_step, state.epoch, name, value])


class TimeBudgetCallback(TrainerCallback):
    """Stop training (saving a checkpoint) once `minutes` of wall time have passed."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start >= self.seconds:
            logger.warning(
                "Time budget of %.1f minutes reached at step %d: stopping.", self.seconds / 60, state.global_step
            )
            control.should_training_stop = True
            control.should_save = True


class TrainingInterrupted(Exception):
    """Raised by `run_training` after a SIGTERM stop: the checkpoint is saved; resume from it."""

    def __init__(self, step: int, output_dir: Path):
        self.step = step
        super().__init__(
            f"Stopped by SIGTERM after update {step}; the checkpoint is {output_dir / f'checkpoint-{step}'}. "
            "Run the same command with `--resume_from_checkpoint last` to continue from it."
        )


class StopOnSigtermCallback(TrainerCallback):
    """On SIGTERM (a preempted or cancelled job), finish the current update, save a checkpoint and stop, so that
    `--resume_from_checkpoint` continues from exactly that update. transformers' `enable_jit_checkpoint` waits 3 s
    before it acts and does not tell the caller that the stop came from the signal; `run_training` needs to know,
    so that it exits instead of going on to the test evaluation."""

    def __init__(self):
        self.received = False
        self.stopped_at: int | None = None
        self._previous_handler = None

    def _on_sigterm(self, signum, frame) -> None:
        self.received = True

    def on_train_begin(self, args, state, control, **kwargs):
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_step_end(self, args, state, control, **kwargs):
        if self.received:
            logger.warning("SIGTERM received: saving a checkpoint at update %d and stopping.", state.global_step)
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)


class CheckpointAveragingCallback(TrainerCallback):
    """At the end of training, average the last `last_n` checkpoints into `<output_dir>/averaged`, a normal
    `save_pretrained` folder (with the tokenizer), as the paper does with its last 5 (base) or 20 (big)."""

    def __init__(self, last_n: int, tokenizer: PreTrainedTokenizerBase | None = None):
        self.last_n, self.tokenizer = last_n, tokenizer

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folders = checkpoint_folders(args.output_dir)[-self.last_n :]
        if not folders:
            logger.warning("No checkpoints to average in %s.", args.output_dir)
            return
        logger.warning("Averaging %d checkpoints: %s", len(folders), [folder.name for folder in folders])
        target = Path(args.output_dir) / "averaged"
        average_checkpoints(folders).save_pretrained(target)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(target)


def plot_curves(log_history: list[dict], path: str | Path) -> None:
    """Training/validation loss and validation BLEU against the update step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key):
        points = [(entry["step"], entry[key]) for entry in log_history if key in entry]
        return [p[0] for p in points], [p[1] for p in points]

    figure, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("loss", "training loss (label-smoothed)"), ("eval_loss", "validation loss")):
        steps, values = series(key)
        if steps:
            loss_axis.plot(steps, values, label=label, marker="." if key == "eval_loss" else None)
    loss_axis.set_xlabel("update")
    loss_axis.set_ylabel("cross-entropy")
    loss_axis.legend()
    steps, values = series("eval_bleu")
    bleu_axis.plot(steps, values, marker="o", color="tab:green")
    bleu_axis.set_xlabel("update")
    bleu_axis.set_ylabel("validation BLEU")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def resume_point(value: str | None) -> str | bool | None:
    """`--resume_from_checkpoint last` (or `true`) resumes from the newest checkpoint; any other value is a path."""
    if isinstance(value, str) and value.lower() in {"last", "true"}:
        return True
    return value


def prepare_tokenizer(
    recipe: RecipeArguments, train_pairs, output_dir: Path, resuming: bool = False
) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    if recipe.tokenizer:
        return AutoTokenizer.from_pretrained(recipe.tokenizer)
    if resuming and (output_dir / "tokenizer").is_dir():  # the checkpoints' ids come from this one
        return AutoTokenizer.from_pretrained(output_dir / "tokenizer")
    tokenizer = train_bpe_tokenizer(
        [*train_pairs["source"], *train_pairs["target"]], vocab_size=recipe.vocab_size, show_progress=False
    )
    tokenizer.save_pretrained(output_dir / "tokenizer")
    return tokenizer


def build_model(recipe: RecipeArguments, tokenizer: PreTrainedTokenizerBase, training_args):
    config = VanillaTransformerConfig.from_json_file(recipe.model_config)
    config.vocab_size = config.decoder_vocab_size = len(tokenizer)
    config.pad_token_id, config.bos_token_id = tokenizer.pad_token_id, tokenizer.bos_token_id
    config.eos_token_id, config.unk_token_id = tokenizer.eos_token_id, tokenizer.unk_token_id
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.validate()
    if recipe.lr_scale is not None:  # §5.3: lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
        training_args.learning_rate = (
            recipe.lr_scale * config.d_model**-0.5 * max(training_args.warmup_steps, 1) ** -0.5
        )
    torch.manual_seed(training_args.seed)
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
        recipe, corpus["train"], output_dir, resuming=bool(training_args.resume_from_checkpoint)
    )
    model = build_model(recipe, tokenizer, training_args)
    tokenized, dropped = tokenize_corpus(corpus, tokenizer, recipe.max_length)

    longest_source = max(max(tokenized[split]["source_length"]) for split in ("validation", "test"))
    training_args.generation_max_length = longest_source + recipe.extra_target_tokens  # never cut at 20 tokens
    metric = TranslationMetric(tokenize=recipe.bleu_tokenize, lowercase=recipe.bleu_lowercase)
    sigterm = StopOnSigtermCallback()
    callbacks = [CsvLoggerCallback(output_dir / "log.csv"), sigterm]
    if recipe.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience))
    if recipe.max_train_minutes:
        callbacks.append(TimeBudgetCallback(recipe.max_train_minutes))
    if recipe.average_last:
        callbacks.append(CheckpointAveragingCallback(recipe.average_last, tokenizer))
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
    )
    trainer.train(resume_from_checkpoint=resume_point(training_args.resume_from_checkpoint))
    if sigterm.stopped_at is not None:
        raise TrainingInterrupted(sigterm.stopped_at, output_dir)

    trainer.accelerator.wait_for_everyone()
    if recipe.average_last and (output_dir / "averaged").is_dir():  # every rank evaluates the averaged weights
        averaged = load_model(output_dir / "averaged")
        trainer.model.load_state_dict(averaged.state_dict())
    test = trainer.predict(
        tokenized["test"], num_beams=recipe.test_num_beams, max_length=training_args.generation_max_length
    )
    scores = {**test.metrics, "dropped_training_pairs": dropped, "global_step": trainer.state.global_step}
    if trainer.is_world_process_zero():
        trainer.save_model(output_dir / "final")
        hypotheses = tokenizer.batch_decode(
            np.where(test.predictions == -100, tokenizer.pad_token_id, test.predictions), skip_special_tokens=True
        )
        scores.update(report_test_results(recipe, trainer, metric, corpus["test"], hypotheses, scores))
    return scores


def report_test_results(recipe, trainer, metric: TranslationMetric, test_pairs, hypotheses: list[str], scores: dict):
    """Score against the raw references, write scores, translations, hyper-parameters and curves, print a summary."""
    output_dir = Path(trainer.args.output_dir)
    signed = metric.compute(predictions=hypotheses, references=[[t] for t in test_pairs["target"]])
    result = {
        "bleu_raw_references": signed["bleu"],
        "bleu_signature": signed["bleu_signature"],
        "chrf_signature": signed["chrf_signature"],
    }
    card_table = hyperparameters(recipe, trainer.args, trainer.model, trainer.state.global_step)
    (output_dir / "final" / "hyperparameters.json").write_text(json.dumps(card_table, indent=2))
    (output_dir / "test_scores.json").write_text(json.dumps({**scores, **result}, indent=2))
    (output_dir / "test_translations.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    plot_curves(trainer.state.log_history, output_dir / "curves.png")
    examples = list(zip(test_pairs["source"], hypotheses, strict=True))[: recipe.translate_examples]
    for source, hypothesis in examples:
        print(f"  {source}\n  -> {hypothesis}")
    print(f"test BLEU {signed['bleu']:.2f}  chrF {scores.get('test_chrf', float('nan')):.2f}")
    print(f"sacreBLEU signature: {signed['bleu_signature']}")
    return result


def hyperparameters(recipe: RecipeArguments, args: Seq2SeqTrainingArguments, model, updates: int) -> dict:
    """What the model card's training table shows."""
    return {
        "max_tokens_per_batch": recipe.max_tokens,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "processes": args.world_size,
        "optimizer": f"Adam(beta1={args.adam_beta1}, beta2={args.adam_beta2}, eps={args.adam_epsilon})",
        "peak_learning_rate": args.learning_rate,
        "lr_schedule": f"{args.lr_scheduler_type}, warmup {args.warmup_steps}",
        "label_smoothing": args.label_smoothing_factor,
        "dropout": model.config.dropout,
        "updates": updates,  # made, not planned: a time budget or early stopping can end training sooner
        "checkpoints_averaged": recipe.average_last,
        "seed": args.seed,
        "vocabulary": model.config.vocab_size,
        "data": recipe.data,
        "recipe.source_language": recipe.source_language,
        "recipe.target_language": recipe.target_language,
    }


def parse_arguments(argv: list[str] | None = None) -> tuple[RecipeArguments, Seq2SeqTrainingArguments]:
    """`--config recipe.yaml` supplies defaults; every recipe or `Seq2SeqTrainingArguments` field can override."""
    import argparse

    import yaml
    from transformers import HfArgumentParser

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    parser = HfArgumentParser(
        (RecipeArguments, Seq2SeqTrainingArguments),
        description="Train a translation model. --config RECIPE.yaml sets defaults for every option below.",
    )
    if known.config:
        values = yaml.safe_load(Path(known.config).read_text()) or {}
        unknown = set(values) - {action.dest for action in parser._actions}
        if unknown:
            raise ValueError(f"{known.config}: unknown keys {sorted(unknown)}; see `hf-vanilla train --help`.")
        parser.set_defaults(**values)
    recipe, training_args = parser.parse_args_into_dataclasses(args=rest, look_for_args_file=False)
    return recipe, training_args


__all__ = [
    "RecipeArguments",
    "TokenBudgetBatchSampler",
    "TokenBudgetSeq2SeqTrainer",
    "TranslationMetric",
    "parse_arguments",
    "run_training",
]
