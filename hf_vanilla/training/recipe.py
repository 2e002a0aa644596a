"""The paper's training recipe on top of `Seq2SeqTrainer`, adding only what the library lacks.

The library provides the loop, Accelerate (CPU, one or many GPUs, FSDP), checkpoints and resumption, the
inverse-square-root schedule (`lr_scheduler_type="inverse_sqrt"` is exactly §5.3's formula, normalised to its
peak), label smoothing (`label_smoothing_factor`), `predict_with_generate` evaluation, early stopping and
TensorBoard. Added here: token-budget batching (fairseq's `--max-tokens`), a sacreBLEU/chrF metric that works
offline, CSV logs with a PNG of the curves, a wall-clock budget, and averaging of the last checkpoints.
"""

import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from accelerate.utils import broadcast, broadcast_object_list
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    TrainerState,
    set_seed,
)
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import TrainOutput, get_last_checkpoint

from ..configuration_vanilla import VanillaTransformerConfig
from ..data import datasets_cache_dir, load_parallel_corpus
from ..loading import load_model
from ..modeling_vanilla import VanillaTransformerForConditionalGeneration
from ..pipeline_vanilla import decoding_max_length
from .arguments import RecipeArguments, bf16_hardware, resume_point, with_paper_learning_rate
from .averaging import last_checkpoints
from .callbacks import (
    CheckpointAveragingCallback,
    CsvLoggerCallback,
    FirstUpdateCallback,
    SourceNeglectCallback,
    StartupClock,
    StopOnSigtermCallback,
    TimeBudgetProgressCallback,
)
from .metrics import TranslationMetric, build_compute_metrics, decode_padded
from .preprocessing import TokenizedCorpus, default_cache_dir, prepare_tokenizer, tokenize_corpus, tokenizer_identity
from .report import card_hyperparameters, hardware_description, write_test_report
from .trainer import TokenBudgetSeq2SeqTrainer


logger = logging.getLogger(__name__)

EVALUATED = ("validation", "test")


class TrainingInterrupted(Exception):
    """Raised by `run_training` after a SIGTERM stop: the checkpoint is saved; resume from it."""

    def __init__(self, step: int, output_dir: Path):
        self.step = step
        super().__init__(
            f"Stopped by SIGTERM after update {step}; the checkpoint is {output_dir / f'checkpoint-{step}'}. "
            "Run the same command with `--resume_from_checkpoint last` to continue from it."
        )


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


@dataclass
class PreparedData:
    """The raw evaluation splits (the test split feeds the report), the tokenizer and the tokenized corpus."""

    corpus: "object"  # datasets.DatasetDict of source/target strings, without the training split
    tokenizer: PreTrainedTokenizerBase
    tokenized: TokenizedCorpus


def prepare_data(
    recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, output_dir: Path, clock: StartupClock
) -> PreparedData:
    """Read the corpus, learn (or load) the tokenizer and tokenize, once: the main process does it first, into the
    cache, and the other processes then open what it wrote. Across nodes, the main process of each node does it for
    its node when the caches are on node-local disks, the global main process once for all when every node sees
    the same caches (`caches_shared_by_all_nodes`)."""
    cache_dir = Path(recipe.data_cache_dir) if recipe.data_cache_dir else default_cache_dir()
    limits = {
        "train": recipe.max_train_examples,
        "validation": recipe.max_eval_examples,
        "test": recipe.max_test_examples,
    }
    shared = caches_shared_by_all_nodes([cache_dir, datasets_cache_dir()], training_args)
    # The process that goes first (one per node, or one for all) prepares the data; only it may rebuild a cache.
    preparer = training_args.local_process_index == 0 if not shared else training_args.process_index == 0
    with training_args.main_process_first(desc="reading and tokenizing the corpus", local=not shared):
        if training_args.process_index != 0:
            clock.lap("waiting for the main process to prepare the data")
        corpus = load_parallel_corpus(
            recipe.data,
            recipe.source_language,
            recipe.target_language,
            pattern=recipe.data_pattern,
            max_examples={split: limit for split, limit in limits.items() if limit},
            config=recipe.data_config,
            data_files=recipe.data_files(),
        )
        clock.lap(f"reading {len(corpus['train'])} training pairs")
        trained_with = tokenizer_trained_with(resumed_checkpoint(training_args), output_dir)
        if trained_with is not None:  # the checkpoints' ids are its tokenizer's
            tokenizer = resumed_tokenizer(trained_with, recipe.tokenizer)
        else:
            tokenizer = prepare_tokenizer(
                corpus["train"],
                recipe.vocab_size,
                recipe.tokenizer_sample,
                output_dir,
                cache_dir,
                tokenizer_path=recipe.tokenizer,
                is_main_process=training_args.process_index == 0,
            )
        clock.lap("tokenizer")
        tokenized = tokenize_corpus(
            corpus,
            tokenizer,
            recipe.max_length,
            cache_dir,
            num_workers=recipe.preprocessing_num_workers,
            may_rebuild=preparer,
        )
        clock.lap(f"tokenizing ({'built' if tokenized.built else 'opened'} {tokenized.path})")
    # Only the tokenized training split is read from here on.
    evaluation_splits = {split: pairs for split, pairs in corpus.items() if split != "train"}
    return PreparedData(type(corpus)(evaluation_splits), tokenizer, tokenized)


def tokenizer_trained_with(checkpoint: Path | None, output_dir: Path) -> Path | None:
    """Where the tokenizer of a run resumed from `checkpoint` is: in the checkpoint, as the Trainer saves it, or else
    where the run saved the BPE it learnt (`<output_dir>/tokenizer`). None when not resuming."""
    folders = (checkpoint, output_dir / "tokenizer") if checkpoint is not None else ()
    return next((folder for folder in folders if (folder / "tokenizer_config.json").is_file()), None)


def resumed_tokenizer(trained_with: Path, tokenizer_path: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer in `trained_with`. A `tokenizer_path` given as well must hold the same one: with another, the
    checkpoint's embeddings would be read for other tokens, and the run would train and score on without a sign."""
    tokenizer = AutoTokenizer.from_pretrained(trained_with)
    given = AutoTokenizer.from_pretrained(tokenizer_path) if tokenizer_path else tokenizer
    if tokenizer_identity(given) != tokenizer_identity(tokenizer):
        raise ValueError(
            f"--tokenizer {tokenizer_path} is not the tokenizer this run was trained with ({trained_with}): the "
            f"checkpoint's ids would mean other tokens. Resume with --tokenizer {trained_with}, or train from the "
            "start into another --output_dir."
        )
    return tokenizer


# What launchers tell each process of the number on its node: torchrun (and Accelerate's CPU launcher), Open MPI,
# MPICH and Intel MPI, MVAPICH (the variables Accelerate reads for its own CPU runs).
LOCAL_SIZE_VARIABLES = [
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_LOCAL_SIZE",
]


def processes_on_this_node(world_size: int) -> int:
    """How many of the job's `world_size` processes run on this node: from the launcher's variable where it sets one
    (`LOCAL_SIZE_VARIABLES`), else counted through the process group, each process naming its node (Slurm's
    `SLURMD_NODENAME` under `srun`, else the host name). Before this, a launcher without `LOCAL_WORLD_SIZE` (`srun`
    or `mpirun` straight into the command) counted as one node."""
    for variable in LOCAL_SIZE_VARIABLES:
        if os.environ.get(variable):
            return int(os.environ[variable])
    if world_size == 1:
        return 1
    import torch.distributed as dist

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    nodes = [None] * world_size
    dist.all_gather_object(nodes, node)
    return nodes.count(node)


def caches_shared_by_all_nodes(folders: list[Path], training_args: Seq2SeqTrainingArguments) -> bool:
    """Whether every process sees the same `folders` (a shared filesystem) rather than each node its own disk: the
    global main process leaves a file in each, and every process looks for it. On one node, trivially true. Logged,
    since it decides whether each node prepares the data or one process does it for all."""
    import torch.distributed as dist

    world = training_args.world_size
    if world == processes_on_this_node(world):
        return True
    token = [secrets.token_hex(8) if training_args.process_index == 0 else None]
    dist.broadcast_object_list(token)
    probes = [folder / f".hf-vanilla-shared-{token[0]}" for folder in folders]
    if training_args.process_index == 0:
        for probe in probes:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.touch()
    dist.barrier()
    seen = [None] * world
    dist.all_gather_object(seen, all(probe.exists() for probe in probes))
    dist.barrier()
    if training_args.process_index == 0:
        for probe in probes:
            probe.unlink()
    shared = all(seen)
    logger.warning(
        "[rank %d] data caches %s: %s",
        training_args.process_index,
        ", ".join(map(str, folders)),
        "shared by all nodes, prepared once" if shared else "on each node's own disk, prepared once per node",
    )
    return shared


def recipe_metric(recipe: RecipeArguments) -> TranslationMetric:
    return TranslationMetric(tokenize=recipe.bleu_tokenize, lowercase=recipe.bleu_lowercase)


def recipe_callbacks(recipe: RecipeArguments, output_dir: Path, tokenizer: PreTrainedTokenizerBase) -> list:
    """The callbacks a run's options ask for; the first two (CSV log, SIGTERM stop) are always on."""
    callbacks = [CsvLoggerCallback(output_dir / "log.csv"), StopOnSigtermCallback()]
    if recipe.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience))
    if recipe.detect_source_neglect:
        callbacks.append(SourceNeglectCallback())
    if recipe.average_last:
        callbacks.append(CheckpointAveragingCallback(recipe.average_last, tokenizer))
    return callbacks


def build_trainer(
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    data: PreparedData,
    model: VanillaTransformerForConditionalGeneration,
    callbacks: list,
) -> TokenBudgetSeq2SeqTrainer:
    """The trainer with the paper's learning rate, and generation that may run to the longest source + 50 tokens."""
    splits = data.tokenized.splits
    longest_source = max(max(splits[split].with_format("arrow")["source_length"].to_pylist()) for split in EVALUATED)
    training_args = replace(
        with_paper_learning_rate(training_args, recipe.lr_scale, model.config.d_model),
        # `max_length` counts the decoder start token too; never the library's silent 20
        generation_max_length=decoding_max_length(longest_source, extra=recipe.extra_target_tokens),
        # pinned memory only speeds up copies to a GPU; on the CPU, PyTorch warns about it at every epoch
        dataloader_pin_memory=training_args.dataloader_pin_memory and training_args.device.type != "cpu",
    )
    return TokenBudgetSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        processing_class=data.tokenizer,
        data_collator=seq2seq_collator(data.tokenizer, model, training_args),
        # BLEU needs generated ids; without `predict_with_generate` an evaluation scores the loss alone
        compute_metrics=build_compute_metrics(data.tokenizer, recipe_metric(recipe))
        if training_args.predict_with_generate
        else None,
        callbacks=callbacks,
        max_tokens=recipe.max_tokens,
        measure_source_use=recipe.detect_source_neglect,
        max_train_minutes=recipe.max_train_minutes,
        decay_saves=recipe.average_last,
        dropout_min_epochs=recipe.dropout_min_epochs,
        muon=recipe.muon,
    )


def seq2seq_collator(
    tokenizer: PreTrainedTokenizerBase, model: VanillaTransformerForConditionalGeneration, training_args
) -> DataCollatorForSeq2Seq:
    """The library's collator; in half precision, padding each batch to a multiple of 8 positions, the shapes tensor
    cores work on whole (as `run_translation.py` does for fp16)."""
    half = training_args.fp16 or training_args.bf16
    return DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=8 if half else None)


# From this width on, bf16 autocast pays on hardware that computes bf16 natively (docs/performance.md, bf16 table).
BF16_PAYS_FROM_D_MODEL = 512


def suggest_bf16(training_args: Seq2SeqTrainingArguments, config: VanillaTransformerConfig) -> None:
    """One line when hardware that computes bf16 natively trains a model of base size or more in float32."""
    hardware = bf16_hardware()
    if hardware and not (training_args.bf16 or training_args.fp16) and config.d_model >= BF16_PAYS_FROM_D_MODEL:
        logger.warning(
            "This is %s and the model is %d wide: --bf16 true (or `bf16: auto` in the recipe) trains it faster; "
            "see docs/performance.md.",
            hardware,
            config.d_model,
        )


def train(trainer: TokenBudgetSeq2SeqTrainer, callbacks: list, output_dir: Path):
    """Train (resuming if asked); raise `TrainingInterrupted` after a SIGTERM stop; returns the train output. A resume
    from a checkpoint that has made all of `max_steps` trains nothing (`end_of_budget_resume`)."""
    finished = budget_spent_at(trainer.args)
    if finished is not None:
        return end_of_budget_resume(trainer, callbacks, finished)
    sigterm = next(c for c in callbacks if isinstance(c, StopOnSigtermCallback))
    trained = trainer.train(resume_from_checkpoint=resume_point(trainer.args.resume_from_checkpoint))
    if sigterm.stopped_at is not None:
        raise TrainingInterrupted(sigterm.stopped_at, output_dir)
    return trained


def resumed_checkpoint(args: Seq2SeqTrainingArguments) -> Path | None:
    """The checkpoint `--resume_from_checkpoint` names (`last`: the newest in the output directory); None when the run
    starts from scratch or there is none."""
    resume = resume_point(args.resume_from_checkpoint)
    checkpoint = get_last_checkpoint(args.output_dir) if resume is True else resume
    return Path(checkpoint) if checkpoint else None


def budget_spent_at(args: Seq2SeqTrainingArguments) -> Path | None:
    """The checkpoint to resume from, where it has already made the run's `max_steps` updates; None otherwise."""
    checkpoint = resumed_checkpoint(args)
    if checkpoint is None or args.max_steps <= 0 or not (checkpoint / "trainer_state.json").is_file():
        return None  # the Trainer says what is missing
    state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    return checkpoint if state.global_step >= args.max_steps else None


def end_of_budget_resume(trainer: TokenBudgetSeq2SeqTrainer, callbacks: list, checkpoint: Path) -> TrainOutput:
    """The end of a run resumed from `checkpoint`, which made every update of the budget (a job requeued after its
    last save, or the command run again): its weights and state, averaged as at the end of training, and no update.
    The library's loop checks `max_steps` after an update, so it would make one more and save it, moving the average's
    window and, under a schedule not yet at zero, the weights."""
    trainer.model.load_state_dict(load_model(checkpoint).state_dict())
    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    trainer.state.is_world_process_zero = trainer.is_world_process_zero()
    trainer.state.is_local_process_zero = trainer.is_local_process_zero()
    logger.warning("%s has made all %d updates: nothing to train.", checkpoint, trainer.args.max_steps)
    for averaging in (c for c in callbacks if isinstance(c, CheckpointAveragingCallback)):
        averaging.on_train_end(trainer.args, trainer.state, trainer.control)
    return TrainOutput(trainer.state.global_step, 0.0, {"train_runtime": 0.0})


def remove_stale_average(output_dir: Path, is_main_process: bool) -> None:
    """An `averaged/` left in `output_dir` before this session trains is an earlier run's, or an earlier session's that
    stopped: never this run's final weights. Removed by the main process, saying so."""
    stale = output_dir / "averaged"
    if is_main_process and stale.is_dir():
        logger.warning("Removing %s: an earlier run's average (this run averages its own at its end).", stale)
        shutil.rmtree(stale)


def choose_final_weights(
    trainer: TokenBudgetSeq2SeqTrainer, averaged: Path | None, rule: str = "better", decoding: dict | None = None
) -> dict:
    """Keep the better of the last weights and the ones this run averaged into `averaged` (on the main process; None
    where it did not average) by validation BLEU (by validation loss where the evaluation does not generate), or the
    averaged ones whatever they score (`rule="averaged"`), said in one line with both scores; returns which and the
    scores. Validation is translated with the `decoding` options given (the run's evaluation settings otherwise).
    Never the test split: the choice is part of training. Every rank follows the main process, and gets the
    averaged weights from it: on nodes that do not share the output folder, only the main process's disk holds them."""
    trainer.accelerator.wait_for_everyone()  # the main process has written the average
    if not broadcast_object_list([averaged is not None])[0]:
        return {"final_weights": "last"}
    metric = "bleu" if trainer.args.predict_with_generate else "loss"
    last = {name: weight.detach().clone() for name, weight in trainer.model.state_dict().items()}
    decoding = decoding or {}
    scores = {"last": trainer.evaluate(metric_key_prefix="final_last", **decoding)[f"final_last_{metric}"]}
    average = load_model(averaged).state_dict() if averaged is not None else {k: v.clone() for k, v in last.items()}
    for weight in average.values():
        broadcast(weight, from_process=0)
    trainer.model.load_state_dict(average)
    scores["averaged"] = trainer.evaluate(metric_key_prefix="final_averaged", **decoding)[f"final_averaged_{metric}"]
    averaged_is_better = (
        scores["averaged"] >= scores["last"] if metric == "bleu" else scores["averaged"] <= scores["last"]
    )
    chosen = "averaged" if rule == "averaged" or averaged_is_better else "last"
    if chosen == "last":
        trainer.model.load_state_dict(last)
    logger.warning(
        "Final weights: the %s ones (validation %s: averaged %.3f, last %.3f).",
        chosen,
        metric,
        scores["averaged"],
        scores["last"],
    )
    return {"final_weights": chosen, **{f"validation_{metric}_{name}": score for name, score in scores.items()}}


def test_decoding(recipe: RecipeArguments) -> dict:
    """The test split's beam search: its size and its length penalty where one is given (the model's otherwise)."""
    penalty = {} if recipe.test_length_penalty is None else {"length_penalty": recipe.test_length_penalty}
    return {"num_beams": recipe.test_num_beams, **penalty}


def translate_test_split(trainer: TokenBudgetSeq2SeqTrainer, recipe: RecipeArguments, data: PreparedData):
    """The test split translated with beam search by the final weights (on every rank). `predict_with_generate`
    decides whether the run's evaluations generate, never whether the test is translated: training is over here."""
    trainer.args.predict_with_generate = True
    trainer.compute_metrics = build_compute_metrics(data.tokenizer, recipe_metric(recipe))
    return trainer.predict(
        data.tokenized.splits["test"], max_length=trainer.args.generation_max_length, **test_decoding(recipe)
    )


def report(trainer, recipe: RecipeArguments, data: PreparedData, test, scores: dict, output_dir: Path) -> dict:
    """On the main process: save `final/`, score against the raw references, write the run's files."""
    tokenizer = data.tokenizer
    # The model and its tokenizer only: the Trainer's `save_model` would add its pickled training arguments
    # (training_args.bin), and a published model holds no training settings.
    trainer.model.save_pretrained(output_dir / "final")
    tokenizer.save_pretrained(output_dir / "final")
    hypotheses = decode_padded(tokenizer, test.predictions)
    hyperparameters = card_hyperparameters(
        trainer.args,
        trainer.model,
        updates=trainer.state.global_step,
        max_tokens=recipe.max_tokens,
        checkpoints_averaged=len(last_checkpoints(output_dir, recipe.average_last))
        if scores["final_weights"] == "averaged"
        else 0,
        data=recipe.data,
        source_language=recipe.source_language,
        target_language=recipe.target_language,
    )
    return write_test_report(
        output_dir,
        trainer.state.log_history,
        recipe_metric(recipe),
        data.corpus["test"],
        hypotheses,
        scores,
        hyperparameters,
        examples=recipe.translate_examples,
    )


def run_training(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """Train, evaluate on the test split with beam search, save `<output_dir>/final`; returns the test scores."""
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    clock = StartupClock(training_args.process_index)
    data = prepare_data(recipe, training_args, output_dir, clock)
    set_seed(training_args.seed)  # before the model is built, so its initial weights follow the seed
    model = build_model(recipe.model_config, data.tokenizer, recipe.source_language, recipe.target_language)
    clock.lap("model")
    suggest_bf16(training_args, model.config)
    callbacks = [*recipe_callbacks(recipe, output_dir, data.tokenizer), FirstUpdateCallback(clock)]
    trainer = build_trainer(recipe, training_args, data, model, callbacks)
    if recipe.max_train_minutes and trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TimeBudgetProgressCallback(trainer.train_state))
    remove_stale_average(output_dir, trainer.is_world_process_zero())
    trained = train(trainer, callbacks, output_dir)
    averaging = next((c for c in callbacks if isinstance(c, CheckpointAveragingCallback)), None)
    decoding = test_decoding(recipe) if recipe.final_choice_decoding == "test" else None
    final = choose_final_weights(trainer, averaging and averaging.averaged, recipe.final_weights, decoding)
    test = translate_test_split(trainer, recipe, data)
    scores = {
        **test.metrics,
        **final,
        "dropped_training_pairs": data.tokenized.dropped,
        "global_step": trainer.state.global_step,
        "seed": training_args.seed,
        "train_wall_seconds": trained.metrics["train_runtime"],  # this session's training, evaluations included
        "hardware": hardware_description(training_args.world_size),
    }
    if trainer.is_world_process_zero():
        scores.update(report(trainer, recipe, data, test, scores, output_dir))
    return scores
