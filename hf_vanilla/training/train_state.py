"""Where a run stands, owned by one object and saved whole with every checkpoint (docs/training.md, "Where a run
stands").

`TrainState` holds the run's wall clock and its progress through the budget (the larger of its elapsed training time
over `--max_train_minutes` and its update over `max_steps`), the stop when the time is spent, the checkpoints saved
through the decay, the dropout decision, and the run's place in its batches: the epoch and pairs trained
(`EpochPosition`, which tracks them as the batches go by) and the update the schedule counts, in updates of the run's
first size. The trainer asks it; the schedules, the callbacks and the progress bar read it; averaging reads what it
saved. Its collectives are the trainer's: it is handed `share`, the main process's value of a number on every process.

It is a transformers `ExportableState`, so the library writes it into every checkpoint's `trainer_state.json`
(`stateful_callbacks`, beside the Trainer's own state) at the moment it writes that file. A resume reads it back into
this same object: the library's own restore (`restore_callback_states_from_checkpoint`) builds a new one from the
saved arguments, which the trainer, its schedule and its callbacks do not hold.

Elapsed time counts the whole training loop (evaluations and saves included) of every session of the run, so a
resume on any number of processes starts from the time the checkpoint recorded. Every process reads the main
process's clock, so all of them change the learning rate and stop at the same update.
"""

import json
import logging
from collections.abc import Callable
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING

from transformers import TrainerCallback, TrainerState
from transformers.trainer_callback import ExportableState

from .resume import (
    CHECKPOINT_STEPS,
    SCHEDULE_REFERENCE,
    check_same_batching,
    log_resume,
    resume_position,
    schedule_reference,
)


if TYPE_CHECKING:
    from .callbacks import EpochPosition  # which imports averaging, which reads what this module saves

logger = logging.getLogger(__name__)

# Processes agree on the main process's clock every this many updates: often enough that a stop comes within a
# fraction of a second of the budget, rarely enough that a GPU's queue of work is not drained at every update.
CLOCK_SYNC_UPDATES = 10
# What hf_vanilla before the one train state wrote beside trainer_state.json; read when resuming such a checkpoint.
LEGACY_CLOCK_FILE = "training_clock.json"
LEGACY_BATCHING_FILE = "token_budget_batching.json"


class TrainState(TrainerCallback, ExportableState):
    """Where the run stands: its clock, progress and stop, the decay's saves, the dropout decision, and its place in
    the batches and the schedule. Saves `decay_saves` checkpoints evenly through the decay, the last at the end, so
    that averaging finds checkpoints of the decay however fast the machine is."""

    def __init__(
        self,
        minutes: float | None = None,
        decay_share: float = 0.0,
        decay_saves: int = 0,
        share: Callable[[float], float] = float,
    ):
        if minutes is not None and minutes <= 0:
            raise ValueError(f"--max_train_minutes must be positive, got {minutes}.")
        if not 0 <= decay_share <= 1:
            raise ValueError(f"decay_share must lie in [0, 1], got {decay_share}.")
        self.seconds = minutes * 60 if minutes else None
        self.decay_share, self.decay_saves = decay_share, decay_saves
        # The main process's value of a number on every process: the trainer's collective (`main_process_value`), so
        # that all of them change the learning rate and stop at the same update. One process: the number itself.
        self.share = share
        self.max_steps = 0  # the run's length in updates (of its first size), set by the trainer with its schedule
        self.position: EpochPosition | None = None  # the place in the batches' order, set with the training loader
        self.session_start: float | None = None
        self.restart({})

    def restart(self, batches: dict) -> None:
        """Set the state to a run's start, on `batches` (what decides the batches and how many an update takes; the
        trainer's `batching`). A resume then continues a checkpoint's: `resume_from`."""
        self.batches = batches
        self.step = 0  # the last update this object saw end
        self.seconds_before = 0.0  # the training seconds of earlier sessions, from the checkpoint resumed
        self.elapsed = 0.0  # the main process's training seconds at the last synchronisation
        self.saves_done = 0
        self.dropout_decision: float | None = None  # `BudgetDropout`'s, once made: kept by every later session
        self.resume_at: tuple[int, int] | None = None  # (epoch, pairs of it trained) of the checkpoint resumed
        self.reference: int | None = None  # the batches an update of the run's first size took, from the checkpoint
        self.steps_apart = False  # whether the checkpoint's update is not its schedule's (an earlier part resized)

    def resume_from(self, checkpoint: Path, restart_epoch: bool, max_tokens: int) -> None:
        """Continue the run `checkpoint` saved: its clock (from zero, said in one line, if it recorded none), its
        dropout decision, and its place in the batches, refused in one line if this run's batches differ, unless
        `restart_epoch` (`--ignore_data_skip`) starts the epoch over."""
        saved = read_train_state(checkpoint)
        if saved is None or "train_seconds" not in saved:
            logger.warning("%s records no training time: the time budget counts from this session.", checkpoint)
        else:
            self.seconds_before = self.elapsed = saved["train_seconds"]
            self.saves_done = self.saves_before(saved["progress"])
            self.dropout_decision = saved.get("dropout_decision")
        batching = (saved or {}).get("batching") or processes_of(checkpoint)
        if not restart_epoch:
            check_same_batching(checkpoint, batching, self.batches)
        self.resume_at = resume_position(checkpoint, batching, restart_epoch)
        self.reference = schedule_reference(batching, self.batches)
        self.steps_apart = batching.get(CHECKPOINT_STEPS[0]) != batching.get(CHECKPOINT_STEPS[1])
        log_resume(str(checkpoint), batching, self.batches, max_tokens, self.reference)

    # The place in the batches and the schedule

    def schedule_step(self, step: int) -> int | float:
        """What `max_steps` and the warmup count at update `step`: the update itself, unless this run counts updates
        of another size than the run's first (`EpochPosition.schedule_step`)."""
        return step if self.position is None else self.position.schedule_step(step)

    def counts_other_updates(self) -> bool:
        """Whether this run's updates are not the ones its schedule and `max_steps` count: its size is not the run's
        first, or an earlier part of the run's was (the checkpoint's update then lies apart from its schedule's)."""
        position = self.position  # None: a subclass's own loader, whose updates the schedule counts
        return position is not None and (position.reference != position.sampler.batches_per_update or self.steps_apart)

    # The clock, the progress and the stop

    def decay_start(self) -> float:
        """The progress at which the learning rate starts to decay."""
        return 1.0 - self.decay_share

    def decay_save_points(self) -> list[float]:
        """The progress of each checkpoint saved through the decay; the last is the end of the run."""
        return [self.decay_start() + self.decay_share * k / self.decay_saves for k in range(1, self.decay_saves + 1)]

    def saves_before(self, progress: float) -> int:
        """How many of the decay's checkpoints lie at or before `progress`."""
        return sum(point <= progress for point in self.decay_save_points())

    def progress(self, step: int) -> float:
        """How much of the budget update `step` has used: the larger of the time and the updates spent."""
        by_time = self.elapsed / self.seconds if self.seconds else 0.0
        by_steps = self.schedule_step(step) / self.max_steps if self.max_steps > 0 else 0.0
        return max(by_time, by_steps)

    def on_train_begin(self, args, state, control, **kwargs):
        self.session_start = monotonic()
        self.step = state.global_step

    def sync(self) -> None:
        """Every process takes the main process's training seconds of the run so far. Collective: every process
        calls it at the same update."""
        self.elapsed = self.share(self.seconds_before + monotonic() - self.session_start)

    def on_step_end(self, args, state, control, **kwargs):
        self.step = state.global_step
        if args.world_size == 1 or state.global_step % CLOCK_SYNC_UPDATES == 0:
            self.sync()
        progress = self.progress(state.global_step)
        if self.seconds and self.elapsed >= self.seconds:
            logger.warning(
                "Time budget of %.1f minutes reached at update %d: stopping.", self.seconds / 60, state.global_step
            )
            control.should_training_stop = control.should_save = True
        saves_due = self.saves_before(progress)
        if saves_due > self.saves_done:
            self.saves_done = saves_due
            control.should_save = True

    # Saved whole

    def state(self) -> dict:
        """What a checkpoint records (`ExportableState`; the library writes it into `trainer_state.json`): the clock
        with this update's evaluation (the trainer syncs it before saving), the progress, the dropout decision, and
        the batches with the place in their order and in the schedule."""
        record = {"train_seconds": self.elapsed, "progress": self.progress(self.step)}
        record["decay_start"] = self.decay_start()
        if self.dropout_decision is not None:
            record["dropout_decision"] = self.dropout_decision
        batching = dict(self.batches)
        if self.position is not None:  # None: a subclass's own loader
            batching["epoch"], batching["pairs_done"] = self.position.position()
            batching[SCHEDULE_REFERENCE] = self.position.reference
            batching.update(zip(CHECKPOINT_STEPS, (self.step, self.schedule_step(self.step)), strict=True))
        return {"args": {}, "attributes": {**record, "batching": batching}}


def read_train_state(checkpoint: str | Path) -> dict | None:
    """What `checkpoint` recorded of where its run stood (`TrainState.state`'s attributes): from its
    `trainer_state.json`, or from the two files an earlier hf_vanilla wrote beside it; None where it has neither."""
    checkpoint = Path(checkpoint)
    trainer_state = checkpoint / "trainer_state.json"
    if trainer_state.is_file():
        saved = TrainerState.load_from_json(str(trainer_state)).stateful_callbacks.get(TrainState.__name__)
        if saved:
            return saved["attributes"]
    clock, batching = checkpoint / LEGACY_CLOCK_FILE, checkpoint / LEGACY_BATCHING_FILE
    if not clock.is_file() and not batching.is_file():
        return None
    record = json.loads(clock.read_text()) if clock.is_file() else {}
    return {**record, "batching": json.loads(batching.read_text())} if batching.is_file() else record


def processes_of(checkpoint: Path) -> dict:
    """The process count of a checkpoint that recorded nothing of its batches, read from its RNG states (one file per
    process: `rng_state_<rank>.pth`, or `rng_state.pth`)."""
    processes = 1 if (checkpoint / "rng_state.pth").exists() else len(list(checkpoint.glob("rng_state_*.pth")))
    return {"processes": processes} if processes else {}
