"""Trainer callbacks the recipe adds: CSV logs, a wall-clock budget, a clean stop on SIGTERM, and averaging of the
last checkpoints."""

import csv
import logging
import signal
import time
from pathlib import Path

from transformers import PreTrainedTokenizerBase, TrainerCallback

from .averaging import average_checkpoints, checkpoint_folders


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
