"""The training budget (time and updates) and its warmup-stable-decay schedule: learning rates at given times and
updates, hand-computed; through a resume, against an uninterrupted run; and averaging that keeps to the decay."""

import json
import math

import pytest
import torch
from transformers import Seq2SeqTrainingArguments, TrainerCallback, TrainerState

from hf_vanilla.training.averaging import average_checkpoints, last_checkpoints
from hf_vanilla.training.budget import (
    DEFAULT_DECAY_SHARE,
    BudgetDropout,
    budget_decay_share,
    budget_lr_factor,
    budget_schedule_arguments,
    uses_budget_schedule,
)
from hf_vanilla.training.train_state import TrainState, read_train_state

from .conftest import StopAt, make_model, word_budget_trainer


def budget_at(elapsed: float, minutes: float = 10, max_steps: int = 1000, decay_share: float = 0.4):
    budget = TrainState(minutes, decay_share=decay_share)
    budget.elapsed, budget.max_steps = elapsed, max_steps
    return budget


@pytest.mark.parametrize(
    ("step", "elapsed", "decay_type", "expected"),
    [
        (50, 0, "linear", 0.5),  # warmup: 50 of 100 updates
        (200, 60, "linear", 1.0),  # progress 0.2 by updates: the stable phase
        (300, 420, "linear", 0.75),  # progress 0.7 by time: a quarter of the decay (0.6 to 1) done
        (300, 420, "1-sqrt", 1 - math.sqrt(0.25)),
        (300, 420, "cosine", 0.5 * (1 - math.cos(math.pi * 0.75))),
        (900, 60, "linear", 0.25),  # progress 0.9 by updates, whatever the clock says
        (1000, 600, "linear", 0.0),  # the end
        (1000, 700, "linear", 0.0),  # past the end (the last update's clock can overshoot): never negative
        (40, 540, "linear", 0.25),  # a short budget: the decay (progress 0.9) caps the warmup's 0.4
    ],
)
def test_budget_schedule_at_given_times_and_updates(step, elapsed, decay_type, expected):
    factor = budget_lr_factor(step, budget_at(elapsed), warmup_steps=100, decay_type=decay_type, min_lr_ratio=0.0)
    assert factor == pytest.approx(expected, abs=1e-12)


def test_budget_schedule_decays_to_its_floor():
    budget = budget_at(600)
    assert budget_lr_factor(1000, budget, warmup_steps=100, decay_type="linear", min_lr_ratio=0.1) == pytest.approx(
        0.1
    )
    halfway = budget_at(480)  # progress 0.8: half the decay
    assert budget_lr_factor(10, halfway, 0, "linear", min_lr_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)


def test_the_budget_schedule_has_its_own_name_and_the_librarys_keeps_its_meaning(tmp_path):
    """`lr_scheduler_type: budget` in a recipe or on the command line gives the budget schedule; the library's
    `warmup_stable_decay` is the library's, refused without its `num_decay_steps` or with the budget's `decay_share`,
    naming both schedules, never silently swapped for the other."""
    from hf_vanilla.training.arguments import parse_arguments

    def arguments(**kwargs):
        return Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], **kwargs)

    assert uses_budget_schedule(arguments(**budget_schedule_arguments()))
    assert not uses_budget_schedule(
        arguments(lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={"num_decay_steps": 10})
    )
    assert not uses_budget_schedule(arguments(lr_scheduler_type="inverse_sqrt"))
    refused = "warmup_stable_decay is the library's schedule.*lr_scheduler_type: budget"
    for kwargs in ({}, {"num_decay_steps": 10, "decay_share": 0.2}):
        with pytest.raises(ValueError, match=refused):
            uses_budget_schedule(arguments(lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs=kwargs))
    with pytest.raises(ValueError, match="drop num_decay_steps"):
        uses_budget_schedule(arguments(**budget_schedule_arguments({"num_decay_steps": 10})))

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("lr_scheduler_type: budget\nlr_scheduler_kwargs: {decay_share: 0.3}\n")
    common = ["--config", str(recipe), "--output_dir", str(tmp_path)]
    _, from_recipe = parse_arguments(common)
    _, from_command = parse_arguments([*common, "--lr_scheduler_type", "budget", "--lr_scheduler_kwargs", "{}"])
    _, overridden = parse_arguments([*common, "--lr_scheduler_type=linear", "--lr_scheduler_kwargs", "{}"])
    assert uses_budget_schedule(from_recipe) and budget_decay_share(from_recipe) == 0.3
    assert uses_budget_schedule(from_command) and budget_decay_share(from_command) == DEFAULT_DECAY_SHARE
    assert overridden.lr_scheduler_type == "linear" and not uses_budget_schedule(overridden)


class FakeClock(TrainerCallback):
    """`time.monotonic` for the budget, where `seconds(n)` pass during update n (one second by default) and nothing
    between: a callback of the trainer it times."""

    def __init__(self, seconds=lambda update: 1.0):
        self.now, self.seconds = 1000.0, seconds

    def __call__(self) -> float:
        return self.now

    def on_step_begin(self, args, state, control, **kwargs):
        self.now += self.seconds(state.global_step + 1)


def budget_trainer(output_dir, monkeypatch, callbacks=(), dropout: float = 0.0, dropout_min_epochs=None, clock=None):
    from hf_vanilla.training import train_state

    clock = clock or FakeClock()
    monkeypatch.setattr(train_state, "monotonic", clock)
    return word_budget_trainer(
        output_dir,
        max_tokens=64,
        callbacks=[clock, *callbacks],
        dropout=dropout,
        trainer_options={"max_train_minutes": 1, "decay_saves": 4, "dropout_min_epochs": dropout_min_epochs},
        max_steps=1000,  # the 60-second budget ends the run first
        learning_rate=1e-3,
        **budget_schedule_arguments({"decay_share": 0.5, "decay_type": "linear"}),
        warmup_steps=10,
    )


def learning_rates(trainer) -> dict[int, float]:
    return {entry["step"]: entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry}


def test_a_length_in_epochs_on_the_budget_schedule_decays_over_its_last_share(tmp_path):
    """3 epochs and no max_steps nor time budget: the run's length is the epochs counted in updates, and its last
    half decays linearly to zero, as the same run given that many updates as `max_steps` does."""
    options = dict(learning_rate=1e-3, warmup_steps=2)
    options |= budget_schedule_arguments({"decay_share": 0.5, "decay_type": "linear"})
    by_epochs = word_budget_trainer(tmp_path / "epochs", max_tokens=64, num_train_epochs=3, **options)
    by_epochs.train()
    updates = by_epochs.state.global_step
    by_updates = word_budget_trainer(tmp_path / "updates", max_tokens=64, max_steps=updates, **options)
    by_updates.train()
    rates = learning_rates(by_epochs)
    assert rates == pytest.approx(learning_rates(by_updates))
    assert rates[updates] < 0.2e-3 and rates[updates // 4] == pytest.approx(1e-3)  # decayed; the peak before


def as_written_before_the_train_state(checkpoint) -> None:
    """Rewrite `checkpoint` as hf_vanilla wrote it before its `TrainState` went into trainer_state.json: the clock and
    the batching record in two files of their own."""
    trainer_state = json.loads((checkpoint / "trainer_state.json").read_text())
    saved = trainer_state["stateful_callbacks"].pop(TrainState.__name__)["attributes"]
    (checkpoint / "trainer_state.json").write_text(json.dumps(trainer_state))
    (checkpoint / "token_budget_batching.json").write_text(json.dumps(saved.pop("batching")))
    (checkpoint / "training_clock.json").write_text(json.dumps(saved))


@pytest.mark.parametrize("resumed_from", ["trainer_state", "files_of_an_earlier_release", "library_restore_too"])
def test_a_resumed_run_keeps_its_clock_and_every_learning_rate(tmp_path, monkeypatch, resumed_from):
    """Stopped at update 25 and resumed: the same learning rates and end as the uninterrupted run, whether the
    checkpoint holds its `TrainState` in trainer_state.json, or in the two files an earlier hf_vanilla wrote, or the
    library restores callback states too (`restore_callback_states_from_checkpoint`, which builds a new `TrainState`:
    the trainer keeps its own, the one the schedule reads)."""
    whole = budget_trainer(tmp_path / "whole", monkeypatch)
    whole.train()
    rates = learning_rates(whole)
    # One second an update, a 60-second budget: 60 updates. The rate logged at update k is the one it trained with,
    # set after update k - 1 from the clock of update k - 2: warmup to update 11, the peak to 32, then the decay.
    assert whole.state.global_step == 60 and max(rates) == 60
    assert rates[10] == pytest.approx(0.9e-3) and rates[11] == rates[32] == pytest.approx(1e-3)
    assert rates[33] == pytest.approx(1e-3 * 29 / 30) and rates[45] == pytest.approx(1e-3 * 17 / 30)
    assert rates[60] == pytest.approx(1e-3 * 2 / 30)
    # Four checkpoints through the decay (at 37.5, 45, 52.5 and 60 s), the last at the end, each with its clock.
    saved = {folder.name: read_train_state(folder) for folder in last_checkpoints(whole.args.output_dir, 9)}
    assert sorted(saved) == ["checkpoint-38", "checkpoint-45", "checkpoint-53", "checkpoint-60"]
    clock = {key: saved["checkpoint-60"][key] for key in ("train_seconds", "progress", "decay_start")}
    assert clock == {"train_seconds": 60.0, "progress": 1.0, "decay_start": 0.5}

    stopped = budget_trainer(tmp_path / "part", monkeypatch, callbacks=[StopAt(25)])
    stopped.train()
    assert stopped.state.global_step == 25
    if resumed_from == "files_of_an_earlier_release":
        as_written_before_the_train_state(tmp_path / "part" / "checkpoint-25")
    resumed = budget_trainer(tmp_path / "part", monkeypatch)  # a new process: its monotonic clock starts elsewhere
    resumed.args.restore_callback_states_from_checkpoint = resumed_from == "library_restore_too"
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 60, "the budget ends where the uninterrupted run's did"
    assert learning_rates(resumed) == pytest.approx(rates)  # the checkpoint's history up to 25, then this session
    checkpoint = tmp_path / "part" / "checkpoint-60"
    assert read_train_state(checkpoint)["train_seconds"] == 60.0
    assert [c for c in resumed.callback_handler.callbacks if isinstance(c, TrainState)] == [resumed.train_state]


@pytest.mark.parametrize(
    ("step", "elapsed", "epoch", "expected"),
    [
        (200, 60, 0.84, 8.4),  # progress 0.1 by time (0.0667 by updates): 10 times the epochs so far
        (200, 120, 0.84, 4.2),  # a machine half as fast
        (200, 6, 0.84, 0.84 * 3000 / 200),  # progress by updates (200 of 3000) outruns the clock's
    ],
)
def test_the_epochs_a_budget_buys(step, elapsed, epoch, expected):
    deciding = BudgetDropout(budget_at(elapsed, max_steps=3000), dropout=0.1, min_epochs=6, decide_at=200)
    assert deciding.budget_epochs(step, epoch, num_train_epochs=3) == pytest.approx(expected)
    assert BudgetDropout(TrainState(), 0.1, 6, 200).budget_epochs(step, epoch, num_train_epochs=3) == 3


def test_set_dropout_is_the_dropout_the_model_was_built_with():
    from hf_vanilla.training.budget import set_dropout

    ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 1, 1]])
    batch = {"input_ids": ids, "attention_mask": (ids != 1).long(), "labels": ids}

    def train_mode_logits(model):
        torch.manual_seed(7)
        return model.train()(**batch).logits

    built = make_model(dropout=0.3, vocab_size=48)
    changed = make_model(dropout=0.0, vocab_size=48)
    set_dropout(changed, 0.3)
    assert changed.config.dropout == 0.3
    torch.testing.assert_close(train_mode_logits(changed), train_mode_logits(built), rtol=0, atol=0)
    set_dropout(built, 0.0)  # every site at 0: training mode computes what evaluation does
    with torch.no_grad():
        torch.testing.assert_close(train_mode_logits(built), built.eval()(**batch).logits)


class DropoutRecorder(TrainerCallback):
    """The residual dropout each update trained with."""

    def __init__(self):
        self.dropout: dict[int, float] = {}

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.dropout[state.global_step + 1] = model.model.encoder.layers[0].dropout


@pytest.mark.parametrize("margin", [-0.01, 0.01])
def test_dropout_follows_the_epochs_the_budget_buys_through_a_resume(tmp_path, monkeypatch, margin):
    # One second an update, a 60-second budget: 60 updates, decided at the warmup's end (update 10), where the
    # progress is 1/6, so the budget buys 6 times the epochs of the first 10 updates.
    probe = budget_trainer(tmp_path / "probe", monkeypatch, [StopAt(10)])
    probe.train()
    min_epochs = 6 * probe.state.epoch + margin  # just below what the budget buys keeps dropout; just above drops it
    expected = 0.1 if margin < 0 else 0.0

    recorder = DropoutRecorder()
    whole = budget_trainer(tmp_path / "whole", monkeypatch, [recorder], dropout=0.1, dropout_min_epochs=min_epochs)
    whole.train()
    assert whole.state.global_step == 60
    assert {step: recorder.dropout[step] for step in (1, 10, 11, 60)} == {1: 0.0, 10: 0.0, 11: expected, 60: expected}
    assert whole.model.config.dropout == expected

    stopped = budget_trainer(tmp_path / "part", monkeypatch, [StopAt(25)], dropout=0.1, dropout_min_epochs=min_epochs)
    stopped.train()
    recorder = DropoutRecorder()
    resumed = budget_trainer(tmp_path / "part", monkeypatch, [recorder], dropout=0.1, dropout_min_epochs=min_epochs)
    resumed.train(resume_from_checkpoint=True)  # the decision the checkpoint records
    assert resumed.state.global_step == 60
    assert set(recorder.dropout.values()) == {expected} and min(recorder.dropout) == 26


def test_a_dropout_decision_survives_a_resume_whose_pace_changed(tmp_path, monkeypatch):
    """Decided at update 10 at one second an update: the budget buys just over `min_epochs`, so dropout stays. Then
    every update takes two seconds (35 updates in all). A resume at update 20 keeps the decision: decided again there,
    the budget would seem to buy 2/3 of it and drop dropout."""
    probe = budget_trainer(tmp_path / "probe", monkeypatch, [StopAt(10)])
    probe.train()
    min_epochs = 6 * probe.state.epoch - 0.01

    def slower_after_warmup():
        return FakeClock(lambda update: 1.0 if update <= 10 else 2.0)

    options = {"dropout": 0.1, "dropout_min_epochs": min_epochs}
    recorder = DropoutRecorder()
    whole = budget_trainer(tmp_path / "whole", monkeypatch, [recorder], clock=slower_after_warmup(), **options)
    whole.train()
    assert whole.state.global_step == 35 and recorder.dropout[11] == recorder.dropout[35] == 0.1

    stopped = budget_trainer(tmp_path / "part", monkeypatch, [StopAt(20)], clock=slower_after_warmup(), **options)
    stopped.train()
    recorder = DropoutRecorder()
    resumed = budget_trainer(tmp_path / "part", monkeypatch, [recorder], clock=FakeClock(lambda _: 2.0), **options)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 35
    assert set(recorder.dropout.values()) == {0.1} and resumed.model.config.dropout == 0.1


def test_a_checkpoints_clock_counts_the_evaluation_at_its_own_update(tmp_path, monkeypatch):
    """Evaluated and saved at update 5, where the evaluation takes 100 (fake) seconds: the checkpoint's clock, which a
    resume continues, includes them, as the run's own clock does from the next update on."""
    from datasets import Dataset

    clock = FakeClock()

    class SlowEvaluation(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            clock.now += 100.0

    rows = [[4 + i, 5 + i, 2] for i in range(8)]
    trainer = budget_trainer(tmp_path, monkeypatch, [StopAt(5), SlowEvaluation()], clock=clock)
    trainer.eval_dataset = Dataset.from_dict({"input_ids": rows, "labels": rows})
    trainer.args.eval_strategy = trainer.args.save_strategy = "steps"
    trainer.args.eval_steps = trainer.args.save_steps = 5
    trainer.train()
    recorded = read_train_state(tmp_path / "checkpoint-5")["train_seconds"]
    assert recorded >= 5 + 100


def test_dropout_min_epochs_refuses_another_model(tmp_path):
    from transformers import MarianConfig, MarianMTModel

    trainer = word_budget_trainer(tmp_path, max_tokens=64)
    trainer.model = MarianMTModel(MarianConfig(vocab_size=48, pad_token_id=0, decoder_start_token_id=0, d_model=16))
    with pytest.raises(ValueError, match="this model is a marian. Drop dropout_min_epochs"):
        trainer.budget_dropout(6)


def write_checkpoint(folder, model, progress: float, decay_start: float) -> None:
    """A checkpoint whose trainer_state.json records a `TrainState` at `progress`, as the trainer saves it."""
    model.save_pretrained(folder)
    clock = {"train_seconds": 100 * progress, "progress": progress, "decay_start": decay_start}
    state = TrainerState(stateful_callbacks={TrainState.__name__: {"args": {}, "attributes": clock}})
    state.save_to_json(str(folder / "trainer_state.json"))


def test_averaging_takes_only_checkpoints_of_the_decay_and_refuses_earlier_ones(tmp_path):
    model = make_model()
    for step, progress in ((10, 0.5), (20, 0.7), (30, 0.85), (40, 1.0)):
        write_checkpoint(tmp_path / f"checkpoint-{step}", model, progress, decay_start=0.6)
    assert [folder.name for folder in last_checkpoints(tmp_path, 5)] == [
        "checkpoint-20",
        "checkpoint-30",
        "checkpoint-40",
    ]
    with pytest.raises(ValueError, match="checkpoint-10: saved before the learning rate's decay began"):
        average_checkpoints([tmp_path / "checkpoint-10", tmp_path / "checkpoint-40"])
    # Checkpoints of a schedule without a budget's decay (decay_start 1) are all averaged, as before.
    for step in (10, 20):
        write_checkpoint(tmp_path / "other" / f"checkpoint-{step}", model, step / 100, decay_start=1.0)
    assert len(last_checkpoints(tmp_path / "other", 5)) == 2
