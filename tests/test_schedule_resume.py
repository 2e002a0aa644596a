"""Schedules with a total after a resume on another number of batches an update (processes x accumulation; here the
accumulation, in one process): the same pairs of the global order get the same learning rate as in an uninterrupted
run, and the run ends on the same pair."""

import pytest
from transformers import TrainerCallback

from hf_vanilla.training.budget import budget_schedule_arguments

from .conftest import StopAt, word_budget_trainer


LEARNING_RATE = 1e-3
PAIRS, MAX_TOKENS = 64, 36  # 11 batches an epoch
WARMUP = 3
EPOCHS = 3  # a shrunk update (4 -> 1 batches) makes more updates an epoch than max_steps has: the run must still end
SCHEDULES = {
    "linear": {"lr_scheduler_type": "linear"},
    "cosine": {"lr_scheduler_type": "cosine"},
    "budget": budget_schedule_arguments({"decay_share": 0.5}),
}


class RateByPosition(TrainerCallback):
    """For every update, where training stood in the global order when it began (epoch, pairs of it trained) and the
    learning rate it trained with (what the Trainer logs at the update)."""

    def __init__(self):
        self.trainer = None
        self.start: tuple[int, int] | None = None
        self.rates: dict[int, tuple[tuple[int, int], float]] = {}

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = self.trainer.train_state.position.position()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "learning_rate" in logs:
            self.rates[state.global_step] = (self.start, logs["learning_rate"])


def run(output_dir, schedule: str, accumulation: int, max_steps: int, stop_at: int | None = None, resume=False):
    recorder = RateByPosition()
    trainer = word_budget_trainer(
        output_dir,
        max_tokens=MAX_TOKENS,
        pairs=PAIRS,
        callbacks=[recorder, *([StopAt(stop_at)] if stop_at else [])],
        max_steps=max_steps,
        learning_rate=LEARNING_RATE,
        warmup_steps=WARMUP,
        gradient_accumulation_steps=accumulation,
        **SCHEDULES[schedule],
    )
    recorder.trainer = trainer
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer, recorder.rates


def batches_an_epoch() -> int:
    from hf_vanilla.training import TokenBudgetBatchSampler

    lengths = [2 + i % 6 + 1 for i in range(PAIRS)]  # word_budget_trainer's rows, their end of sequence included
    return len(TokenBudgetBatchSampler(lengths, max_tokens=MAX_TOKENS, seed=3))


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("before, after", [(1, 2), (2, 1), (1, 3), (3, 2), (3, 1), (4, 1)])
def test_a_resume_on_another_size_keeps_each_pairs_learning_rate_and_the_end(tmp_path, schedule, before, after):
    batches = batches_an_epoch()
    assert batches % 2 and batches % 3, "an epoch whose last batches are cut on every resumed size"
    updates_an_epoch = -(-batches // before)
    max_steps = EPOCHS * updates_an_epoch
    whole, whole_rates = run(tmp_path / "whole", schedule, before, max_steps)
    rate_at = dict(whole_rates.values())
    assert len(rate_at) == max_steps and whole.state.global_step == max_steps
    if schedule == "linear":  # the uninterrupted run is the library's schedule, by hand: update n runs at step n - 1's
        for step, (_, rate) in whole_rates.items():
            expected = min((step - 1) / WARMUP, (max_steps - step + 1) / (max_steps - WARMUP))
            assert rate == pytest.approx(LEARNING_RATE * expected)

    stop = updates_an_epoch + updates_an_epoch // 2  # in the middle of epoch 1: the library's epoch loop must go on
    run(tmp_path / "part", schedule, before, max_steps, stop_at=stop)
    resumed, resumed_rates = run(tmp_path / "part", schedule, after, max_steps, resume=True)
    matched = 0
    for step, (position, rate) in resumed_rates.items():
        if step > stop and position in rate_at:
            assert rate == pytest.approx(rate_at[position], abs=1e-12), f"update {step} at {position}"
            matched += 1
    # Updates of `after` batches begin on the uninterrupted run's positions at every common multiple of the sizes,
    # and at each epoch's start.
    assert matched >= (max_steps - stop) * before // (before * after) - 1
    # The run ends where the uninterrupted one did: the end of its last epoch, every pair of it trained.
    assert resumed.train_state.position.position() == whole.train_state.position.position() == (EPOCHS, 0)
    assert resumed.state.epoch == whole.state.epoch == EPOCHS


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_run_resumed_on_another_size_and_back_keeps_its_schedule_and_its_end(tmp_path, schedule):
    """2 -> 1 -> 2 batches an update: in the third part the update is the run's first size again, but its updates
    are still counted from the second's, so the schedule and max_steps must still count in the first size."""
    updates_an_epoch = -(-batches_an_epoch() // 2)
    max_steps = EPOCHS * updates_an_epoch
    _, whole_rates = run(tmp_path / "whole", schedule, 2, max_steps)
    rate_at = dict(whole_rates.values())
    first_stop = updates_an_epoch // 2
    run(tmp_path / "part", schedule, 2, max_steps, stop_at=first_stop)
    second_stop = first_stop + updates_an_epoch  # that many 1-batch updates later: just into epoch 1
    run(tmp_path / "part", schedule, 1, max_steps, stop_at=second_stop, resume=True)
    resumed, resumed_rates = run(tmp_path / "part", schedule, 2, max_steps, resume=True)
    compared = 0
    for step, (position, rate) in resumed_rates.items():
        if step > second_stop and position in rate_at:
            assert rate == pytest.approx(rate_at[position], abs=1e-12), f"update {step} at {position}"
            compared += 1
    assert compared >= updates_an_epoch  # the whole last epoch at least
    assert resumed.train_state.position.position() == (EPOCHS, 0) and resumed.state.epoch == EPOCHS


def test_a_run_resumed_after_its_last_update_makes_no_more(tmp_path):
    """Resumed from a checkpoint that made all of `max_steps` (a job requeued after its last save, the command run
    again), the run trains nothing: the checkpoint's weights and step, no checkpoint past the budget, the average made
    as at the end of training. The library's loop alone makes one more update and saves it (pinned first: the day it
    stops, `end_of_budget_resume` can go)."""
    import torch

    from hf_vanilla.loading import load_model
    from hf_vanilla.training.averaging import checkpoint_folders
    from hf_vanilla.training.callbacks import CheckpointAveragingCallback, StopOnSigtermCallback
    from hf_vanilla.training.recipe import train

    def trainer(output_dir, callbacks=(), resume=None):
        return word_budget_trainer(output_dir, max_tokens=MAX_TOKENS, pairs=PAIRS, callbacks=callbacks, max_steps=4,
                                   learning_rate=LEARNING_RATE, lr_scheduler_type="constant", save_strategy="steps",
                                   save_steps=2, resume_from_checkpoint=resume)  # fmt: skip

    trainer(tmp_path / "library").train()
    library = trainer(tmp_path / "library")
    library.train(resume_from_checkpoint=True)
    assert library.state.global_step == 5 and (tmp_path / "library" / "checkpoint-5").is_dir()

    output = tmp_path / "ours"
    callbacks = [StopOnSigtermCallback(), CheckpointAveragingCallback(last_n=2)]
    train(trainer(output, callbacks), callbacks, output)
    (output / "averaged").rename(output / "averaged-at-the-end")
    callbacks = [StopOnSigtermCallback(), CheckpointAveragingCallback(last_n=2)]
    resumed = trainer(output, callbacks, resume="last")
    trained = train(resumed, callbacks, output)
    assert trained.global_step == resumed.state.global_step == 4
    assert [folder.name for folder in checkpoint_folders(output)] == ["checkpoint-2", "checkpoint-4"]
    weights = {
        name: load_model(output / name).state_dict() for name in ("checkpoint-4", "averaged", "averaged-at-the-end")
    }
    torch.testing.assert_close(resumed.model.state_dict(), weights["checkpoint-4"], rtol=0, atol=0)
    assert callbacks[1].averaged == output / "averaged"
    torch.testing.assert_close(weights["averaged"], weights["averaged-at-the-end"], rtol=0, atol=0)
