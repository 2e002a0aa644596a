"""Muon for the 2-D weight matrices, AdamW for the rest (`--muon`): the same steps as torch's two optimizers run side
by side, on the parameters it should take, scheduled and resumed through the Trainer like any other optimizer."""

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import Seq2SeqTrainingArguments

from hf_vanilla.training.optimizers import MuonWithAdamW, muon_with_adamw

from .conftest import StopAt, make_model, word_budget_trainer


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / 3)


def test_it_steps_as_torchs_muon_and_adamw_side_by_side_under_one_schedule():
    ours, reference = make_model(dropout=0.0), make_model(dropout=0.0)
    matrices = [name for name, p in ours.named_parameters() if p.ndim == 2 and "embed" not in name]
    others = [name for name, _ in ours.named_parameters() if name not in matrices]
    settings = {"lr": 0.01, "weight_decay": 0.1}
    optimizer = MuonWithAdamW(
        [ours.get_parameter(n) for n in matrices], [ours.get_parameter(n) for n in others], **settings,
        betas=(0.9, 0.98), eps=1e-9,
    )  # fmt: skip
    references = [
        torch.optim.Muon([reference.get_parameter(n) for n in matrices], **settings, adjust_lr_fn="match_rms_adamw"),
        torch.optim.AdamW([reference.get_parameter(n) for n in others], **settings, betas=(0.9, 0.98), eps=1e-9),
    ]
    schedules = [LambdaLR(optimizer, warmup)] + [LambdaLR(o, warmup) for o in references]
    inputs = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    batch = {"input_ids": inputs, "attention_mask": inputs.ne(0).long(), "labels": torch.tensor([[9, 8, 2]] * 2)}
    for _ in range(4):
        for model, steppers in ((ours, [optimizer]), (reference, references)):
            model.train()(**batch).loss.backward()
            for stepper in steppers:
                stepper.step()
                stepper.zero_grad()
        for schedule in schedules:
            schedule.step()
    assert [group["lr"] for group in optimizer.param_groups] == [settings["lr"]] * 2  # past the warmup: both set
    for name, parameter in ours.named_parameters():
        assert torch.equal(parameter, reference.get_parameter(name)), name


def test_muon_takes_every_weight_matrix_of_the_layers_and_adamw_the_rest():
    model = make_model()  # 2 + 2 layers, all embeddings tied to the output projection
    args = Seq2SeqTrainingArguments(output_dir="unused", use_cpu=True, report_to=[], learning_rate=1e-3)
    optimizer = muon_with_adamw(model, args)
    muon, adamw = ({id(p) for p in o.param_groups[0]["params"]} for o in optimizer.optimizers)
    names = {id(p): name for name, p in model.named_parameters()}
    # an encoder layer: q, k, v, out and two feed-forward weights; a decoder layer 4 more for the cross-attention
    assert len(muon) == 2 * 6 + 2 * 10
    assert all(names[i].endswith(".weight") and "norm" not in names[i] for i in muon)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert id(model.get_input_embeddings().weight) in adamw
    assert muon.isdisjoint(adamw) and muon | adamw == set(names)


def test_a_loaded_state_keeps_one_schedule_for_both_optimizers():
    """torch's `load_state_dict` gives an optimizer new parameter groups: the schedule of a resumed run must still
    set the learning rate the two optimizers step with."""
    model = make_model()
    args = Seq2SeqTrainingArguments(output_dir="unused", use_cpu=True, report_to=[], learning_rate=1e-3)
    saved = muon_with_adamw(model, args).state_dict()
    optimizer = muon_with_adamw(model, args)
    optimizer.load_state_dict(saved)
    schedule = LambdaLR(optimizer, lambda step: 0.5**step)
    for _ in range(2):
        optimizer.step()  # no gradients: nothing moves
        schedule.step()
    assert [group["lr"] for o in optimizer.optimizers for group in o.param_groups] == [0.25e-3] * 2


def test_a_state_of_another_optimizer_is_refused_by_name():
    model = make_model()
    args = Seq2SeqTrainingArguments(output_dir="unused", use_cpu=True, report_to=[])
    adamw_state = torch.optim.AdamW(model.parameters()).state_dict()
    with pytest.raises(ValueError, match="not MuonWithAdamW's"):
        muon_with_adamw(model, args).load_state_dict(adamw_state)


def train(output, stop_at: int | None = None, resume: bool = False):
    trainer = word_budget_trainer(
        output, max_tokens=36, callbacks=[StopAt(stop_at)] if stop_at else [], dropout=0.1,
        trainer_options={"muon": True}, max_steps=12, learning_rate=3e-3, warmup_steps=4, save_strategy="steps",
        save_steps=100,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer


def test_a_run_with_muon_resumes_to_the_uninterrupted_runs_weights(tmp_path):
    """The Trainer saves both optimizers' states and the schedule, and after loading them the schedule still sets
    both optimizers' learning rates: a run stopped in its warmup ends with the weights of the one never stopped."""
    whole = train(tmp_path / "whole")
    assert isinstance(whole.optimizer.optimizer, MuonWithAdamW)  # under Accelerate's wrapper
    train(tmp_path / "part", stop_at=2)
    resumed = train(tmp_path / "part", resume=True)
    rates = [group["lr"] for group in resumed.optimizer.param_groups]
    assert len(rates) == 2 and rates[0] == rates[1] == pytest.approx(0.0, abs=1e-12)  # the end of linear decay
    for (name, weight), other in zip(
        resumed.model.state_dict().items(), whole.model.state_dict().values(), strict=True
    ):
        assert torch.equal(weight, other), name
