"""What a checkpoint records of the run's batches and its place in their global order (`TrainState`'s `batching`),
and how a resume reads it: refused where the batches would differ, started at the recorded pair, its schedule counted
in updates of the run's first size (docs/training.md, "Where a run stands")."""

import logging
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .train_state import TrainState

logger = logging.getLogger(__name__)

# The entries of a checkpoint's batching record that decide the batches, as the message of a refused resume names
# them. The process count and the gradient accumulation do not: they only decide how many batches an update takes.
TRAINING_PAIRS = "the training pairs (--data, --max_train_examples, --max_length or the tokenizer)"
BATCHING_OPTIONS = {
    "split_batches": "Accelerate's split_batches",
    "max_tokens": "--max_tokens",
    "seed": "--seed",
    "training_pairs": TRAINING_PAIRS,
    "pair_lengths_sha256": TRAINING_PAIRS,
}
# The entry of that record giving the batches an update of the run's first size took: what the learning-rate schedule
# and `max_steps` count updates of (`EpochPosition.schedule_step`).
SCHEDULE_REFERENCE = "schedule_batches_per_update"
# The entries giving the checkpoint's update and where that update leaves the schedule: they differ once any part of
# the run trained on another size, and from then on every part must count its updates into the schedule's.
CHECKPOINT_STEPS = ("global_step", "schedule_step")


def check_same_batching(checkpoint: Path, saved: dict, now: dict) -> None:
    """Refuse, in one line naming the option, to resume from `checkpoint` with other batches than it trained on: its
    position in their order would not say which pairs were trained, losing some pairs of the epoch and repeating
    others. Under `cpu_processes`, which sets each process's --max_tokens, a changed count is named as such."""
    launched = saved.get("cpu_processes", 1), now.get("cpu_processes", 1)
    if launched[0] != launched[1] and saved.get("max_tokens") != now.get("max_tokens"):
        raise ValueError(
            f"{checkpoint} was trained with cpu_processes {launched[0]} (batches of up to {saved['max_tokens']} "
            f"tokens in each process), and this run has cpu_processes {launched[1]} ({now['max_tokens']}). Its "
            f"position in the batches says nothing about these batches. Resume with cpu_processes {launched[0]}, or "
            "add --ignore_data_skip true to restart the current epoch from its first batch (its pairs trained before "
            "the checkpoint are seen again)."
        )
    for name, option in BATCHING_OPTIONS.items():
        if name in saved and name in now and now[name] != saved[name]:
            # a digest says nothing to a reader: say what differs
            changed = (
                "pairs of other lengths"
                if name == "pair_lengths_sha256"
                else f"{saved[name]}, and this run has {now[name]}"
            )
            raise ValueError(
                f"{checkpoint} was trained with {option}: {changed}. Its position in the batches says nothing about "
                f"these batches. Resume with {option} as it was, or add --ignore_data_skip true to restart the "
                "current epoch from its first batch (its pairs trained before the checkpoint are seen again)."
            )


def resume_position(checkpoint: Path, saved: dict, restart_epoch: bool) -> tuple[int, int] | None:
    """(epoch, pairs of it trained) where a resume from `checkpoint` starts in the batches' global order; the epoch's
    start with `restart_epoch` (--ignore_data_skip), which is the library's count for a checkpoint without a
    position (None)."""
    if "pairs_done" in saved:
        return saved["epoch"], 0 if restart_epoch else saved["pairs_done"]
    if restart_epoch:
        return None
    raise ValueError(
        f"{checkpoint} was written by an earlier hf_vanilla, which recorded no position in the batches' order (and "
        "formed them otherwise for several processes): add --ignore_data_skip true to restart the current epoch from "
        "its first batch (its pairs trained before the checkpoint are seen again)."
    )


def schedule_reference(saved: dict, now: dict) -> int:
    """The batches an update of the run's first size took, which its schedule counts in: recorded in the checkpoint,
    or, for one written without it, its own updates' (a run resumed before on another size did not record any)."""
    if SCHEDULE_REFERENCE in saved:
        return saved[SCHEDULE_REFERENCE]
    return saved.get("processes", now["processes"]) * saved.get("gradient_accumulation_steps", 1)


def at_schedule_step(rate, train_state: "TrainState", step: int) -> float:
    """A library schedule's `rate` at update `step`, counted in updates of the run's first size."""
    return rate(train_state.schedule_step(step))


def log_resume(checkpoint: str, saved: dict, now: dict, max_tokens: int, reference: int) -> None:
    """Say where the resume starts, and how the batches an update takes (and so its tokens) changed, if they did."""
    before = saved.get("processes", now["processes"]) * saved.get("gradient_accumulation_steps", 1)
    after = now["processes"] * now["gradient_accumulation_steps"]
    where = f"epoch {saved['epoch']} after {saved['pairs_done']} pairs" if "pairs_done" in saved else "its position"
    logger.warning("Resuming from %s at %s of the batches' global order.", checkpoint, where)
    if before != after:
        logger.warning(
            "An update now takes %d batches (%d process(es) x %d accumulation step(s), up to %d tokens) where the "
            "checkpoint's took %d (up to %d tokens). The learning-rate schedule and max_steps count updates of the "
            "run's first size, %d batches, so the same pairs get the same learning rate as in an uninterrupted run. "
            "Dropout masks differ from an uninterrupted run's (each process draws its own); on the same number of "
            "processes a resume is bit-exact.",
            after,
            now["processes"],
            now["gradient_accumulation_steps"],
            after * max_tokens,
            before,
            before * max_tokens,
            reference,
        )
