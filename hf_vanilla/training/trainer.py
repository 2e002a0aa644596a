"""`Seq2SeqTrainer` with token-budget batches, the model's chunked training loss, a measure of how much the model uses
its source at every evaluation, checkpoints that appear whole or not at all, and a generation config that evaluation
leaves as it found it."""

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints, seed_worker

from ..configuration_vanilla import VanillaTransformerConfig
from ..pipeline_vanilla import check_tokenizer_matches_model
from .batching import EpochSettingRows, TokenBudgetBatchSampler
from .callbacks import SamplerEpochCheck
from .metrics import source_use_metrics, source_use_totals
from .preprocessing import pair_lengths


logger = logging.getLogger(__name__)

# Target positions per chunk of the training loss: [1024, vocab] float32 logits at a time (150 MB at 37k entries).
LOSS_CHUNK_SIZE = 1024
# Checkpoints are written under this hidden folder of the output directory and renamed into place when complete.
STAGING_DIR = ".incomplete-checkpoints"
# What decided a checkpoint's batches, written into it: a resume skips that many batches of the same order.
BATCHING_FILE = "token_budget_batching.json"
# Each entry of that file, as the message of a refused resume names it.
TRAINING_PAIRS = "the training pairs (--data, --max_train_examples, --max_length or the tokenizer)"
BATCHING_OPTIONS = {
    "processes": "the process count",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
    "split_batches": "Accelerate's split_batches",
    "max_tokens": "--max_tokens",
    "seed": "--seed",
    "training_pairs": TRAINING_PAIRS,
    "pair_lengths_sha256": TRAINING_PAIRS,
}


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches come from a `TokenBudgetBatchSampler`. With `measure_source_use`,
    every evaluation also reports `eval_nll`, `eval_nll_shuffled_source` and `eval_source_use`
    (`metrics.source_use_metrics`), which `SourceNeglectCallback` watches.

    Checkpoints are atomic: `checkpoint-N` is written under `<output_dir>/.incomplete-checkpoints/` and renamed into
    the output directory once every file is on disk, so a run killed while it saves leaves the last complete
    checkpoint as the newest one, and `resume_from_checkpoint=True` (the library's `get_last_checkpoint`) resumes
    from it."""

    def __init__(self, *args, max_tokens: int, measure_source_use: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        self.measure_source_use = measure_source_use
        self._staging_checkpoint = False
        # Our model computes the label-smoothed loss itself, asked per call (`compute_loss`): the library's smoother
        # would pop the labels and smooth materialised logits.
        self.loss_in_the_model = isinstance(self.model.config, VanillaTransformerConfig)
        if self.loss_in_the_model:
            self.label_smoother = None
        if isinstance(self.processing_class, PreTrainedTokenizerBase):
            check_tokenizer_matches_model(self.processing_class, self.model.config)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The same loss and normalisation as the library's `LabelSmoother`; in training a chunk of positions at a time,
        # without the [tokens, vocab] logits, the largest tensor of a small model's step. Evaluation keeps its logits.
        if self.loss_in_the_model:
            inputs = {**inputs, "label_smoothing": self.args.label_smoothing_factor}
            if model.training:
                inputs["loss_chunk_size"] = LOSS_CHUNK_SIZE
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def batching(self) -> dict:
        """What decides the training batches, their order and how many a resume skips: the pairs' lengths, the budget,
        the seed, the process count and how the processes deal them. The Trainer skips `global_step` times the
        accumulation steps batches of each process, so each of these must be the same."""
        lengths = pair_lengths(self.train_dataset).astype(np.uint32)  # one type, whatever the length limit
        return {
            "processes": self.args.world_size,
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
            "split_batches": self.accelerator.split_batches,
            "max_tokens": self.max_tokens,
            "seed": self.args.seed,
            "training_pairs": len(lengths),
            "pair_lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        }

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # None: the library says there is none
        if checkpoint and not self.args.ignore_data_skip:
            check_same_batching(Path(checkpoint), self.batching())
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        start = time.monotonic()
        sampler = TokenBudgetBatchSampler(
            pair_lengths(dataset),
            self.max_tokens,
            seed=self.args.seed,
            num_shards=self.args.world_size,
        )
        logger.warning(
            "[rank %d] startup: batches (%d of at most %d tokens from %d pairs) took %.1f s",
            self.args.process_index,
            len(sampler),
            self.max_tokens,
            len(dataset),
            time.monotonic() - start,
        )
        loader = DataLoader(
            # what the collator pads (the lengths only batch), and the way each epoch reaches the sampler
            EpochSettingRows(dataset.select_columns(["input_ids", "labels"]), sampler),
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            # the options the Trainer gives its own training loader
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            multiprocessing_context=self.args.dataloader_multiprocessing_context,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            in_order=self.args.dataloader_in_order,
            worker_init_fn=partial(
                seed_worker, num_workers=self.args.dataloader_num_workers, rank=self.args.process_index
            ),
        )
        self.remove_callback(SamplerEpochCheck)  # the check of an earlier loader, if any
        self.add_callback(SamplerEpochCheck(sampler))
        # Accelerate shards the batches across processes: each rank gets every n-th batch (the sampler made their
        # number a multiple of the process count, so none is repeated to even them out).
        return self.accelerator.prepare(loader)

    def evaluation_loop(self, dataloader, description, *args, metric_key_prefix: str = "eval", **kwargs):
        # Seq2SeqTrainer gathers generated ids with `gather`, which keeps the pairs Accelerate repeats so that every
        # process gets a full last batch, so a sentence would be scored more than once. Our evaluation sets have a
        # length, so `gather_for_metrics` drops exactly those repeats. (`gather_function` is
        # the public attribute the library keeps for subclasses to choose; its own loop resets it afterwards.)
        self.gather_function = self.accelerator.gather_for_metrics
        output = super().evaluation_loop(dataloader, description, *args, metric_key_prefix=metric_key_prefix, **kwargs)
        if self.measure_source_use:
            # Two teacher-forced passes over the evaluation batches: cheap next to the generation above.
            totals = self.accelerator.reduce(source_use_totals(self.model, dataloader), reduction="sum")
            output.metrics.update(source_use_metrics(totals, metric_key_prefix))
        return output

    # The two private Trainer methods below are the only way to write a checkpoint elsewhere before it is visible
    # (`library_hooks.TRAINER_METHODS`; tests/test_library_hooks.py fails, naming them, if a release changes them).
    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._staging_checkpoint else run_dir

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged, final = run_dir / STAGING_DIR / name, run_dir / name
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # what a killed save of this step left behind
            staged.mkdir(parents=True)
            (staged / BATCHING_FILE).write_text(json.dumps(self.batching(), indent=1))
        self.accelerator.wait_for_everyone()
        self._staging_checkpoint = True  # the library writes the whole checkpoint under the staging folder
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_checkpoint = False
        self.accelerator.wait_for_everyone()  # every process's files (optimizer shards, RNG states) are written
        if not self.args.should_save:
            return
        # Inside the staging folder the library could only see this step's checkpoint: point the state at the best
        # one as it will lie once renamed, and write the state again before the rename makes the folder visible.
        if self.state.best_global_step:
            best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}"
            if best.is_dir() or best == final:
                self.state.best_model_checkpoint = str(best)
            self.state.save_to_json(str(staged / "trainer_state.json"))
        shutil.rmtree(final, ignore_errors=True)  # a checkpoint of the same step from before a resume
        os.replace(staged, final)
        with contextlib.suppress(OSError):  # leave no empty staging folder behind (other saves may still use it)
            staged.parent.rmdir()
        rotate_checkpoints(
            output_dir=str(run_dir),
            save_total_limit=self.args.save_total_limit,
            best_model_checkpoint=self.state.best_model_checkpoint,
            use_mtime=False,
        )

    def prediction_step(self, *args, **kwargs):
        # Seq2SeqTrainer fills every library default into `model.generation_config` (max_length=20 among them),
        # which checkpoints would then save and every later `generate(max_new_tokens=...)` would warn about.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            with root_parameters_gathered(self.model):
                return super().prediction_step(*args, **kwargs)
        finally:
            self.model.generation_config = generation_config


@contextlib.contextmanager
def root_parameters_gathered(model) -> Iterator[None]:
    """With FSDP2, the root module's own parameters (the embeddings and the output projection tied to them, the final
    norms) gathered for the duration, then sharded again. `generate()` calls the encoder directly, not the root
    module, whose forward hook would gather them, so it fails on sharded ones ("aten.embedding.default got mixed
    torch.Tensor and DTensor"); `Seq2SeqTrainer.prediction_step` gathers parameters for FSDP1 only
    (`summon_full_params`). The layers gather their own in their forward hooks, as in training."""
    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def saved_batching(checkpoint: Path) -> dict:
    """What decided the batches of `checkpoint`: its `BATCHING_FILE`; for a checkpoint written without one, the process
    count alone, read from its RNG states (one file per process: `rng_state_<rank>.pth`, or `rng_state.pth`)."""
    if (checkpoint / BATCHING_FILE).is_file():
        return json.loads((checkpoint / BATCHING_FILE).read_text())
    processes = 1 if (checkpoint / "rng_state.pth").exists() else len(list(checkpoint.glob("rng_state_*.pth")))
    return {"processes": processes} if processes else {}


def check_same_batching(checkpoint: Path, now: dict) -> None:
    """Refuse, in one line naming the option, to resume from `checkpoint` with other batches than it trained on: the
    batches a resume skips would not be the ones trained, losing some pairs of the epoch and repeating others."""
    for name, saved in saved_batching(checkpoint).items():
        if name in now and now[name] != saved:
            option = BATCHING_OPTIONS[name]
            # a digest says nothing to a reader: say what differs
            changed = (
                "pairs of other lengths" if name == "pair_lengths_sha256" else f"{saved}, and this run has {now[name]}"
            )
            raise ValueError(
                f"{checkpoint} was trained with {option}: {changed}. The batches the "
                f"resume would skip are not the ones it trained. Resume with {option} as it was, or add "
                "--ignore_data_skip true to restart the current epoch from its first batch (its pairs trained before "
                "the checkpoint are seen again)."
            )
