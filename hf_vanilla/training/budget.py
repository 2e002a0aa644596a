"""The warmup-stable-decay schedule that spends a training budget in wall time as well as in updates, and the
dropout the budget decides.

A run's progress (`TrainState.progress`) is the larger of its elapsed training time over `--max_train_minutes` and
its update over `max_steps`: whichever ends the run first. The learning rate warms up over `warmup_steps` updates,
holds its peak, and decays to `min_lr_ratio` of it over the last `decay_share` of the progress (Hägele et al. 2024,
"Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"; Li et al. 2020, "Budgeted Training"), so
a run stopped by its clock ends annealed on any machine. The library's `warmup_stable_decay` counts its phases in
updates, which a time budget does not know in advance.
"""

import logging
import math
from functools import partial

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback

from ..modeling_vanilla import VanillaResidualLayer, VanillaStack
from .train_state import CLOCK_SYNC_UPDATES, TrainState


logger = logging.getLogger(__name__)

# The budget schedule's name in a recipe and on the command line: `lr_scheduler_type: budget`. The Trainer's
# arguments take only the library's schedule names, so it reaches them as the library's name with this marker in
# `lr_scheduler_kwargs` ({"schedule": "budget"}), which a plain Trainer refuses rather than reads as its own.
BUDGET_SCHEDULE = "budget"
DECAY_TYPES = ("linear", "cosine", "1-sqrt")
# The decay's share of the budget where a recipe names none (Hägele et al. decay over the last 20%).
DEFAULT_DECAY_SHARE = 0.2


def decay_factor(remaining: float, decay_type: str) -> float:
    """The decay's multiplier of the peak when `remaining` (1 at the decay's start, 0 at its end) of it is left."""
    if decay_type == "linear":
        return remaining
    if decay_type == "cosine":
        return 0.5 * (1 - math.cos(math.pi * remaining))
    return 1 - math.sqrt(1 - remaining)  # "1-sqrt", the shape Hägele et al. found best


class BudgetDropout(TrainerCallback):
    """Keeps the model's dropout only for a budget that buys at least `min_epochs` passes over the training data.

    A run of a few epochs underfits, and dropout only slows it; a run of many overfits without it. Which of the two a
    time budget is depends on the machine, so the budget's progress decides, at the end of warmup: the epochs it buys
    are the epochs trained so far over the progress made. Until then, and for a shorter budget, the run trains
    without dropout; the model's config records the dropout it trained with. The decision is saved with the clock in
    every later checkpoint, and a resumed session keeps it, whatever its pace: every session of a run (and every
    process: they read one clock) trains with the same choice. A checkpoint past the decision that records none
    (written before it was saved) is decided again from its clock and epoch."""

    def __init__(self, budget: TrainState, dropout: float, min_epochs: float, decide_at: int):
        if min_epochs <= 0:
            raise ValueError(f"dropout_min_epochs must be positive, got {min_epochs}.")
        self.budget, self.dropout, self.min_epochs = budget, dropout, min_epochs
        # A step where every process has the main process's clock (`CLOCK_SYNC_UPDATES`).
        self.decide_at = max(CLOCK_SYNC_UPDATES, math.ceil(decide_at / CLOCK_SYNC_UPDATES) * CLOCK_SYNC_UPDATES)
        self.decided = False

    def budget_epochs(self, step: int, epoch: float, num_train_epochs: float) -> float:
        """The epochs the whole budget buys, as update `step` (at `epoch`) sees it; a run without a time or update
        budget trains its `num_train_epochs`."""
        progress = self.budget.progress(step)
        return epoch / progress if progress > 0 else num_train_epochs

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.decided = self.budget.dropout_decision is not None  # made in an earlier session of the run
        if self.decided:
            set_dropout(model, self.budget.dropout_decision)
        elif state.global_step >= self.decide_at:  # a resume past the decision, from a checkpoint without it
            self.decide(args, state, model)
        else:
            set_dropout(model, 0.0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self.decided and state.global_step >= self.decide_at:
            self.decide(args, state, model)

    def decide(self, args, state, model) -> None:
        self.decided = True
        epochs = self.budget_epochs(state.global_step, state.epoch or 0.0, args.num_train_epochs)
        dropout = self.dropout if epochs >= self.min_epochs else 0.0
        set_dropout(model, dropout)
        self.budget.dropout_decision = dropout
        logger.warning(
            "At update %d the budget buys about %.1f epochs (dropout_min_epochs %g): dropout %g from here on.",
            state.global_step, epochs, self.min_epochs, dropout,
        )  # fmt: skip


def set_dropout(model: torch.nn.Module, dropout: float) -> None:
    """Sets `model`'s dropout (`config.dropout`: each sub-layer's output and the embedding sums) in its config and in
    every module that applies it."""
    model.config.dropout = dropout
    for module in model.modules():
        if isinstance(module, (VanillaResidualLayer, VanillaStack)):
            module.dropout = dropout


def budget_lr_factor(step: int, budget: TrainState, warmup_steps: int, decay_type: str, min_lr_ratio: float) -> float:
    """The learning rate of update `step` as a share of the peak: linear warmup, the peak, then the decay."""
    warmup = min(1.0, budget.schedule_step(step) / warmup_steps) if warmup_steps > 0 else 1.0
    progress = budget.progress(step)
    if budget.decay_share == 0 or progress <= budget.decay_start():
        return warmup
    remaining = max(0.0, (1.0 - progress) / budget.decay_share)
    return min(warmup, min_lr_ratio + (1 - min_lr_ratio) * decay_factor(remaining, decay_type))


def budget_schedule_arguments(lr_scheduler_kwargs: dict | None = None) -> dict:
    """The training arguments that ask for the budget schedule (what `lr_scheduler_type: budget` in a recipe gives),
    with its own `lr_scheduler_kwargs` (`decay_share`, `decay_type`, `min_lr_ratio`)."""
    kwargs = {**(lr_scheduler_kwargs or {}), "schedule": BUDGET_SCHEDULE}
    return {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": kwargs}


def uses_budget_schedule(args) -> bool:
    """Whether the training arguments ask for the budget schedule (`budget_schedule_arguments`). The library's
    `warmup_stable_decay` keeps its meaning, a decay counted in updates, and needs its `num_decay_steps`: asked for
    without it, or with the budget schedule's `decay_share`, it is refused naming both schedules."""
    kwargs = args.lr_scheduler_kwargs or {}
    if kwargs.get("schedule") == BUDGET_SCHEDULE:
        if args.lr_scheduler_type != "warmup_stable_decay" or "num_decay_steps" in kwargs:
            raise ValueError(
                "lr_scheduler_kwargs schedule: budget asks for the budget schedule, which decays over the last "
                "decay_share of the time or updates: drop num_decay_steps (and write lr_scheduler_type: budget)."
            )
        return True
    if "decay_share" in kwargs or (
        args.lr_scheduler_type == "warmup_stable_decay" and "num_decay_steps" not in kwargs
    ):
        raise ValueError(
            "lr_scheduler_type warmup_stable_decay is the library's schedule, whose decay is counted in updates: give "
            "lr_scheduler_kwargs num_decay_steps. For the budget schedule, which decays over the last decay_share of "
            "--max_train_minutes or max_steps, write lr_scheduler_type: budget."
        )
    return False


def budget_decay_share(args) -> float:
    """The share of the budget the budget schedule decays over (`lr_scheduler_kwargs: {decay_share: ...}`), 0 for
    any other schedule."""
    if not uses_budget_schedule(args):
        return 0.0
    return float((args.lr_scheduler_kwargs or {}).get("decay_share", DEFAULT_DECAY_SHARE))


def budget_schedule(
    optimizer: Optimizer,
    budget: TrainState,
    warmup_steps: int,
    decay_type: str = "1-sqrt",
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """The warmup-stable-decay schedule on `budget`'s progress. A `partial` of a function, so that the scheduler's
    state (which `torch.load(weights_only=True)` reads back on resume) holds no object of ours."""
    if decay_type not in DECAY_TYPES:
        raise ValueError(f"decay_type must be one of {', '.join(DECAY_TYPES)}, got {decay_type!r}.")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio}.")
    factor = partial(
        budget_lr_factor, budget=budget, warmup_steps=warmup_steps, decay_type=decay_type, min_lr_ratio=min_lr_ratio
    )
    return LambdaLR(optimizer, factor)
