"""Trainer callbacks the recipe adds: CSV logs, a progress bar to the wall-clock budget, a clean stop on SIGTERM, a
source-neglect alarm, where training is in the batches' global order (checked against the Trainer's epoch), and
averaging of the last checkpoints."""

import csv
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_callback import ProgressCallback

from .averaging import average_checkpoints, last_checkpoints
from .folders import save_whole


logger = logging.getLogger(__name__)


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


class EpochPosition(TrainerCallback):
    """Where training is in the token-budget sampler's global order: the epoch and the pairs of it trained, counted
    in the batches of that order, not in updates, so that a checkpoint resumes exactly there on any number of
    processes (`position`). Every update takes `sampler.batches_per_update` batches of the order.

    It keeps `state.epoch` in that count: the library's `epoch + (step + 1) / steps_in_epoch` counts this run's steps
    from the epoch's start, so it would be short of the epoch's end in an epoch resumed in its middle.

    It also stops training if the sampler visits another epoch's order than the one the Trainer is in. The epoch
    reaches the sampler through the loader's dataset (`EpochSettingRows.set_epoch`), because Accelerate's sampler
    wrappers do not pass it on; that relies on Accelerate calling the dataset's `set_epoch`. A release that stops
    doing so would silently train every epoch in epoch 0's order: this makes it an error at the first update of the
    next epoch. The Trainer's epoch is counted here from its `on_epoch_begin` calls, independently of the sampler.

    The learning-rate schedule and `max_steps` count updates of the run's first size, `reference` batches each
    (`schedule_step`): on that size, the update itself; after a resume on another number of processes or
    accumulation steps, the batches of the order trained over `reference`. So the same pairs meet the same learning
    rate, and the run ends where an uninterrupted one would, however often its size changed."""

    def __init__(self, sampler, reference: int | None = None):
        self.sampler = sampler
        self.reference = reference or sampler.batches_per_update
        self.epoch: int | None = None
        self.first_step = self.batches = self.epoch_batches = self.skipped_batches = 0
        # The whole batches of the epoch's order trained before this run began it, and the update its order ends at.
        self.anchor_batches = self.end_step = 0

    def on_epoch_begin(self, args, state, control, **kwargs):
        resumed_epoch, pairs_done = self.sampler.resumed_at
        resumed = self.epoch is None
        self.epoch = resumed_epoch if resumed else self.epoch + 1
        self.first_step, self.batches = state.global_step, 0
        self.epoch_batches = len(self.sampler)
        batches_left = len(self.sampler.epoch_ranges(self.epoch))
        self.skipped_batches = self.epoch_batches - batches_left
        self.anchor_batches = self.sampler.whole_batches_in(self.epoch, pairs_done) if resumed else 0
        self.end_step = state.global_step + batches_left // self.sampler.batches_per_update

    def on_step_begin(self, args, state, control, **kwargs):
        if self.sampler.iterated_epoch is not None and self.sampler.iterated_epoch != self.epoch:
            raise RuntimeError(
                f"The Trainer is in epoch {self.epoch}, but the batches come in the order of epoch "
                f"{self.sampler.iterated_epoch}: the epoch no longer reaches the token-budget sampler through the "
                "loader's dataset (an Accelerate or transformers release changed how set_epoch is called). Please "
                "report it with `hf-vanilla env`."
            )

    def on_step_end(self, args, state, control, **kwargs):
        self.batches = (state.global_step - self.first_step) * self.sampler.batches_per_update
        state.epoch = self.epoch + min(1.0, (self.skipped_batches + self.batches) / self.epoch_batches)

    def updates_left(self, epoch: int) -> int:
        """The updates of this run's size that train what is left of `epoch`."""
        return len(self.sampler.epoch_ranges(epoch)) // self.sampler.batches_per_update

    def reference_updates_per_epoch(self) -> int:
        """The updates of the reference size in a whole epoch (its last batches are cut into a whole update)."""
        return -(-(len(self.sampler.bounds) - 1) // self.reference)

    def schedule_step(self, step: int) -> int | float:
        """Where update `step` of this epoch leaves the run, in updates of the reference size: what the learning-rate
        schedule and `max_steps` count. An epoch's end is where the reference's ends, whatever its last batches were
        cut into; before it, each update adds its batches over `reference`. Whole positions are given as integers,
        which the library's schedules were written for (on the reference size every position is whole)."""
        if self.epoch is None:  # the scheduler's first rate, set before training begins
            return step
        per_epoch = self.reference_updates_per_epoch()
        if step >= self.end_step:
            return (self.epoch + 1) * per_epoch
        batches = self.epoch * per_epoch * self.reference + self.anchor_batches
        batches += (step - self.first_step) * self.sampler.batches_per_update
        return batches // self.reference if batches % self.reference == 0 else batches / self.reference

    def update_reaching(self, schedule_step: int, step: int) -> int:
        """The update of this run, resumed at update `step`, at which the schedule reaches `schedule_step` (the
        run's `max_steps`), or the end of the epoch it lies in: where the run ends."""
        epoch, pairs_done = self.sampler.resumed_at
        batches = self.sampler.whole_batches_in(epoch, pairs_done)
        end, per_epoch = step + self.updates_left(epoch), self.reference_updates_per_epoch()
        while schedule_step > (epoch + 1) * per_epoch:
            step, epoch, batches = end, epoch + 1, 0
            end = step + len(self.sampler) // self.sampler.batches_per_update
        batches_left = (schedule_step - epoch * per_epoch) * self.reference - batches
        return min(end, step + max(0, -(-batches_left // self.sampler.batches_per_update)))

    def position(self) -> tuple[int, int]:
        """(epoch, pairs of it trained): where a resume starts."""
        if self.epoch is None:  # no epoch begun yet
            return self.sampler.resumed_at
        if self.skipped_batches + self.batches >= self.epoch_batches:
            return self.epoch + 1, 0
        return self.epoch, self.sampler.pairs_in(self.epoch, self.batches)


class StartupClock:
    """Logs how long each start-up stage of this process took, up to its first update: a user sees where a slow start
    goes, and `benchmarks/scale.py` reads the lines."""

    def __init__(self, rank: int):
        self.rank, self.last = rank, time.monotonic()

    def lap(self, stage: str) -> None:
        now = time.monotonic()
        logger.warning("[rank %d] startup: %s took %.1f s", self.rank, stage, now - self.last)
        self.last = now


class FirstUpdateCallback(TrainerCallback):
    """Ends the `StartupClock` at the first update this process makes (after a resume too)."""

    def __init__(self, clock: StartupClock):
        self.clock, self.done = clock, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done:
            self.clock.lap(f"first update (update {state.global_step})")
            self.done = True


class TimeBudgetProgressCallback(ProgressCallback):
    """The library's progress bar, counting to the update the time budget will end at rather than to `max_steps`, so
    that its "time left" is the budget's, not the time `max_steps` would take. The end is re-estimated at every update
    from this session's pace, evaluations included, and the time the run's clock (`TrainState`, which a resume
    continues) has left."""

    def __init__(self, train_state):
        super().__init__()
        self.train_state = train_state

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.first_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        clock = self.train_state
        session = clock.elapsed - clock.seconds_before
        done, left = state.global_step - self.first_step, max(clock.seconds - clock.elapsed, 0)
        if self.training_bar is None or done == 0 or session <= 0:
            return
        expected_end = state.global_step + int(done / session * left)
        self.training_bar.total = min(state.max_steps, max(expected_end, state.global_step))
        self.training_bar.refresh()


class StopOnSigtermCallback(TrainerCallback):
    """On SIGTERM (a preempted or cancelled job), finish the current update, save a checkpoint and stop, so that
    `--resume_from_checkpoint` continues from exactly that update. transformers' `enable_jit_checkpoint` waits 3 s
    before it acts and does not tell the caller that the stop came from the signal; `run_training` needs to know,
    so that it exits instead of going on to the test evaluation. Every process stops at the same update: each one
    asks `agree` (the trainer's collective, `any_process`) whether any of them has received the signal, since the
    signal reaches them at different moments and a process that went on alone would wait for the others forever.
    `TokenBudgetSeq2SeqTrainer.train` sets `agree` for every such callback it holds; alone it is `bool`."""

    def __init__(self):
        self.received = False
        self.stopped_at: int | None = None
        self._previous_handler = None
        self.agree: Callable[[bool], bool] = bool

    def _on_sigterm(self, signum, frame) -> None:
        self.received = True

    def on_train_begin(self, args, state, control, **kwargs):
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_step_end(self, args, state, control, **kwargs):
        if self.agree(self.received):
            logger.warning("SIGTERM received: saving a checkpoint at update %d and stopping.", state.global_step)
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        # The library ends the epoch the stop broke off as a whole one: with eval_strategy and save_strategy "epoch" it
        # would evaluate a part of an epoch and save again. That evaluation would count in early stopping's patience
        # and in the best checkpoint, so the resumed run would end elsewhere than the uninterrupted one. The
        # checkpoint was saved at the update; the epoch's evaluation comes at its real end, after the resume.
        if self.stopped_at is not None:
            control.should_evaluate = control.should_save = False

    def on_train_end(self, args, state, control, **kwargs):
        signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)


SOURCE_NEGLECT_WARNING = """
##############################  SOURCE NEGLECT  ##############################
At update %d the model gains only %.3f nats per target token from its source (eval_source_use; %d evaluations in a
row past warm-up below %.2f): the decoder has become a language model of the target that ignores the input, and
its BLEU will stay low however long it trains. Likely causes and remedies:
  - a fragile initialisation: keep the default qkv_init_gain=2**-0.5 (plain Xavier, 1.0, fails on some seeds);
  - a learning rate too high or a warm-up too short for post-LayerNorm: lower --learning_rate or raise
    --warmup_steps, or use normalize_before=True (pre-LN), which trains on every seed;
  - misaligned data: check that line n of the source file translates line n of the target file;
  - sources cut or empty: check --max_length and the source column.
Restart from scratch with a fix rather than training on: this state rarely recovers.
##############################################################################"""


class SourceNeglectCallback(TrainerCallback):
    """Warns loudly when a model stops using its source. Reads `eval_source_use` (nats per target token that the true
    source is worth against another row's, from `TokenBudgetSeq2SeqTrainer`) at every evaluation and warns once it
    stayed below `threshold` for `patience` evaluations in a row after warm-up (before it, every model is near 0):
    the decoder has become a language model of the target, whatever its training loss says."""

    def __init__(self, threshold: float = 0.1, patience: int = 2):
        self.threshold, self.patience = threshold, patience
        self.low_evaluations = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        source_use = (metrics or {}).get("eval_source_use")
        if source_use is None or state.global_step <= args.get_warmup_steps(state.max_steps):
            return
        self.low_evaluations = self.low_evaluations + 1 if source_use < self.threshold else 0
        if self.low_evaluations >= self.patience and state.is_world_process_zero:
            logger.warning(SOURCE_NEGLECT_WARNING, state.global_step, source_use, self.low_evaluations, self.threshold)


class CheckpointAveragingCallback(TrainerCallback):
    """At the end of training, average the last `last_n` checkpoints into `<output_dir>/averaged`, a normal
    `save_pretrained` folder (with the tokenizer), as the paper does with its last 5 (base) or 20 (big). On the budget
    schedule, only checkpoints of the learning rate's decay (`averaging.last_checkpoints`)."""

    def __init__(self, last_n: int, tokenizer: PreTrainedTokenizerBase | None = None):
        self.last_n, self.tokenizer = last_n, tokenizer
        self.averaged: Path | None = None  # the folder this run's average went to, on the main process

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folders = last_checkpoints(args.output_dir, self.last_n)
        if not folders:
            logger.warning("No checkpoints to average in %s.", args.output_dir)
            return
        logger.warning("Averaging %d checkpoints: %s", len(folders), [folder.name for folder in folders])
        target, tokenizer = Path(args.output_dir) / "averaged", [self.tokenizer] if self.tokenizer is not None else []
        save_whole(target, average_checkpoints(folders), *tokenizer)
        self.averaged = target
