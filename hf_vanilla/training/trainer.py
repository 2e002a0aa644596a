"""`Seq2SeqTrainer` with token-budget batches, the model's chunked training loss, a measure of how much the model uses
its source at every evaluation, checkpoints that appear whole or not at all, and a generation config that evaluation
leaves as it found it."""

import contextlib
import copy
import hashlib
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import broadcast, reduce
from torch.distributed.fsdp import FSDPModule
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints, seed_worker

from ..configuration_vanilla import VanillaTransformerConfig
from ..pipeline_vanilla import check_tokenizer_matches_model
from .batching import EpochSettingRows, TokenBudgetBatchSampler, pair_lengths, refuse_split_batches
from .budget import BudgetDropout, budget_decay_share, budget_schedule, uses_budget_schedule
from .callbacks import EpochPosition, StopOnSigtermCallback
from .launcher import CPU_PROCESSES_VARIABLE
from .metrics import source_use_metrics, source_use_totals
from .optimizers import muon_with_adamw
from .resume import at_schedule_step
from .train_state import TrainState


logger = logging.getLogger(__name__)

# Target positions per chunk of the training loss: [1024, vocab] float32 logits at a time (150 MB at 37k entries).
LOSS_CHUNK_SIZE = 1024
# Checkpoints are written under this hidden folder of the output directory and renamed into place when complete.
STAGING_DIR = ".incomplete-checkpoints"


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches come from a `TokenBudgetBatchSampler`, with a budget in wall time
    (`max_train_minutes`) as well as in updates, and the budget's schedule (`budget.py`) for the training arguments
    of `budget.budget_schedule_arguments` (`lr_scheduler_type: budget` in a recipe). With `measure_source_use`, every
    evaluation also reports `eval_nll`, `eval_nll_shuffled_source` and `eval_source_use`
    (`metrics.source_use_metrics`), which `SourceNeglectCallback` watches.

    Checkpoints are atomic: `checkpoint-N` is written under `<output_dir>/.incomplete-checkpoints/` and renamed into
    the output directory once every file is on disk, so a run killed while it saves leaves the last complete
    checkpoint as the newest one, and `resume_from_checkpoint=True` (the library's `get_last_checkpoint`) resumes
    from it."""

    def __init__(
        self,
        *args,
        max_tokens: int,
        measure_source_use: bool = True,
        max_train_minutes: float | None = None,
        decay_saves: int = 0,
        dropout_min_epochs: float | None = None,
        muon: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.muon = muon
        refuse_split_batches(self.accelerator.split_batches)
        self.max_tokens = max_tokens
        # Where the run stands, asked by this trainer, read by the schedules and callbacks, saved with every checkpoint
        share = self.main_process_value
        self.train_state = TrainState(max_train_minutes, budget_decay_share(self.args), decay_saves, share)
        self.add_callback(self.train_state)
        if dropout_min_epochs is not None:
            self.add_callback(self.budget_dropout(dropout_min_epochs))
        self.made_budget_schedule = False
        self.measure_source_use = measure_source_use
        self._staging_checkpoint = False
        # Our model computes the label-smoothed loss itself, asked per call (`compute_loss`): the library's smoother
        # would pop the labels and smooth materialised logits.
        self.loss_in_the_model = isinstance(self.model.config, VanillaTransformerConfig)
        if self.loss_in_the_model:
            self.label_smoother = None
        if isinstance(self.processing_class, PreTrainedTokenizerBase):
            check_tokenizer_matches_model(self.processing_class, self.model.config)

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The library's optimizer (`optim`), or with `muon` Muon for the 2-D weight matrices and AdamW for the rest
        (`optimizers.muon_with_adamw`)."""
        if not self.muon:
            return super().create_optimizer(model)
        if self.optimizer is None:
            self.optimizer = muon_with_adamw(self.model if model is None else model, self.args)
        return self.optimizer

    def main_process_value(self, value: float) -> float:
        """`value` as the main process has it, on every process (a collective: all of them call it together)."""
        if self.accelerator.num_processes == 1:
            return value
        return broadcast(torch.tensor([value], dtype=torch.float64, device=self.args.device), from_process=0).item()

    def any_process(self, flag: bool) -> bool:
        """Whether `flag` holds on any process (a collective: all of them call it together)."""
        if self.accelerator.num_processes == 1:
            return flag
        return reduce(torch.tensor([float(flag)], device=self.args.device), reduction="sum").item() > 0

    def budget_dropout(self, min_epochs: float) -> BudgetDropout:
        """The callback that keeps the model's dropout only for a budget of at least `min_epochs` epochs, deciding at
        the end of warmup (after the budget's own callback, whose clock it reads)."""
        if not isinstance(self.model.config, VanillaTransformerConfig):
            raise ValueError(
                "dropout_min_epochs sets a vanilla_transformer's dropout; this model is a "
                f"{self.model.config.model_type}. Drop dropout_min_epochs."
            )
        warmup = self.args.warmup_steps
        decide_at = int(warmup) if warmup >= 1 else 0  # a warmup ratio: decided at the first synchronised update
        return BudgetDropout(self.train_state, self.model.config.dropout, min_epochs, decide_at)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The same loss and normalisation as the library's `LabelSmoother`; in training a chunk of positions at a time,
        # without the [tokens, vocab] logits, the largest tensor of a small model's step. Evaluation keeps its logits.
        if self.loss_in_the_model:
            inputs = {**inputs, "label_smoothing": self.args.label_smoothing_factor}
            if model.training:
                inputs["loss_chunk_size"] = LOSS_CHUNK_SIZE
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def batching(self) -> dict:
        """What decides the training batches and their global order (the pairs' lengths, the budget, the seed, and
        whether Accelerate splits batches), and how many of them an update takes (processes x accumulation)."""
        lengths = pair_lengths(self.train_dataset).astype(np.uint32)  # one type, whatever the length limit
        return {
            "processes": self.args.world_size,
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
            "split_batches": self.accelerator.split_batches,
            "max_tokens": self.max_tokens,
            "cpu_processes": int(os.environ.get(CPU_PROCESSES_VARIABLE, "1")),
            "seed": self.args.seed,
            "training_pairs": len(lengths),
            "pair_lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        }

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # None: the library says there is none
        self.train_state.restart(self.batching())
        if self.made_budget_schedule:  # its warmup may count in another run's updates: made again, as the library does
            self.lr_scheduler, self.made_budget_schedule = None, False
        if checkpoint:
            self.train_state.resume_from(Path(checkpoint), self.args.ignore_data_skip, self.max_tokens)
        # A SIGTERM reaches the processes at different moments: each stop callback asks all of them, so that every
        # process stops at the same update (one that stopped alone would leave the others waiting in a collective).
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, StopOnSigtermCallback):
                callback.agree = self.any_process
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        position, resized = self.train_state.position, self.train_state.counts_other_updates()
        if resized and self.args.max_steps <= 0:  # a length in epochs, which the library counted in this run's size
            num_training_steps = math.ceil(self.args.num_train_epochs * position.reference_updates_per_epoch())
        # The budget's end in updates: `max_steps`, or a length in epochs counted in updates, so that the budget
        # schedule decays over a run that gives its length in epochs too.
        self.train_state.max_steps = self.args.max_steps if self.args.max_steps > 0 else num_training_steps
        if self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        if uses_budget_schedule(self.args):
            kwargs = self.args.lr_scheduler_kwargs or {}
            kwargs = {key: value for key, value in kwargs.items() if key not in ("decay_share", "schedule")}
            warmup = self.args.get_warmup_steps(num_training_steps)
            self.lr_scheduler = budget_schedule(optimizer or self.optimizer, self.train_state, warmup, **kwargs)
            self.made_budget_schedule = True
            return self.lr_scheduler
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if resized and isinstance(scheduler, LambdaLR):  # every library schedule but reduce_lr_on_plateau
            # Partials of a function, so that the scheduler's state holds nothing of ours (as `budget_schedule`).
            scheduler.lr_lambdas = [partial(at_schedule_step, rate, self.train_state) for rate in scheduler.lr_lambdas]
        return scheduler

    def set_initial_training_values(self, args, dataloader: DataLoader) -> tuple:
        values = super().set_initial_training_values(args, dataloader)
        position = self.train_state.position
        if args.max_steps > 0 and self.train_state.counts_other_updates():
            # The library bounds its epoch loop by max_steps over this run's updates an epoch; max_steps counts
            # updates of the run's first size, so the run spans the epochs those take (the stop is `state.max_steps`).
            epochs = -(-args.max_steps // position.reference_updates_per_epoch())
            values = (max(values[0], epochs), *values[1:])
        return values

    # A private Trainer method (`library_hooks.TRAINER_METHODS`): the library counts the epoch and the batches to skip
    # from `global_step` in updates of this run's size, which a checkpoint of another process count or accumulation
    # did not take. The sampler starts the epoch at the checkpoint's position instead, so nothing is skipped here.
    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ) -> tuple[int, int]:
        callbacks = self.callback_handler.callbacks
        place = callbacks.index(self.train_state)
        library_epoch, library_skip = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        # The library's own restore of callback states (`restore_callback_states_from_checkpoint`) swaps in a new
        # `TrainState` built from the saved arguments; the schedules and callbacks hold this one, which `train`
        # restored from the same record, and it must run before those that read its clock.
        callbacks[:] = [callback for callback in callbacks if not isinstance(callback, TrainState)]
        callbacks.insert(place, self.train_state)
        train_state, position = self.train_state, self.train_state.position
        if resume_from_checkpoint is None or position is None:  # the latter: a subclass's own loader
            return library_epoch, library_skip
        if train_state.resume_at is None:  # a checkpoint without a position, resumed with --ignore_data_skip
            train_state.resume_at = (library_epoch, 0)
        sampler = position.sampler
        sampler.resume(*train_state.resume_at)
        epoch, _ = train_state.resume_at
        if self.args.max_steps <= 0:  # a length in epochs: count what is left in updates of this run's size
            updates_left = position.updates_left(epoch) + (num_train_epochs - epoch - 1) * num_update_steps_per_epoch
            self.state.max_steps = self.state.global_step + updates_left
        elif train_state.counts_other_updates():
            self.state.max_steps = position.update_reaching(self.args.max_steps, self.state.global_step)
            logger.warning(
                "max_steps=%d counts updates of %d batches: this run of %d-batch updates ends at update %d.",
                self.args.max_steps,
                position.reference,
                sampler.batches_per_update,
                self.state.max_steps,
            )
        return epoch, 0

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        start = time.monotonic()
        sampler = TokenBudgetBatchSampler(
            pair_lengths(dataset),
            self.max_tokens,
            seed=self.args.seed,
            batches_per_update=self.args.world_size * self.args.gradient_accumulation_steps,
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
            # Starting an epoch draws the workers' base seed from this generator, not from torch's global one, so a
            # resume that starts its epoch in the middle leaves the restored dropout stream as the checkpoint had it.
            generator=torch.Generator().manual_seed(self.args.seed),
        )
        self.remove_callback(EpochPosition)  # the position in an earlier loader's order, if any
        self.train_state.position = EpochPosition(sampler, self.train_state.reference)
        self.add_callback(self.train_state.position)
        # Accelerate shards the batches across processes: each rank gets every n-th batch (the sampler made their
        # number a multiple of the processes times the accumulation, so none is repeated to even them out).
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
        if self.train_state.session_start is not None:  # the clock the checkpoint records counts this evaluation
            self.train_state.sync()
        # The library writes every `ExportableState` into trainer_state.json under its entry, which a checkpoint
        # written without one (by an earlier hf_vanilla, or a plain Trainer) lacks.
        self.state.stateful_callbacks.setdefault(type(self.train_state).__name__, {})
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # what a killed save of this step left behind
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
    (`summon_full_params`). The layers gather their own in their forward hooks, as in training.

    FSDP2 makes the first module to run forward its root. On a model that has not run forward yet (an evaluation
    before training, `predict` on a loaded model), generate()'s call of the encoder would make the first encoder layer
    a root of its own, and the model's forward then fails ("FSDP state has already been lazily initialized for
    model.encoder.layers.0"). So the root runs forward on one token first: cheap next to a generation, whose every
    step gathers each decoder layer."""
    if not isinstance(model, FSDPModule):
        yield
        return
    one_token = torch.full((1, 1), model.config.decoder_start_token_id, device=model.device)
    with torch.no_grad():
        model(input_ids=one_token, decoder_input_ids=one_token)
    model.unshard()
    try:
        yield
    finally:
        model.reshard()
