"""Gradients and loss: checkpointing changes memory not gradients, the loss is exact under accumulation, it learns;
how much a model uses its source, and the alarm when it does not."""

import logging
import math

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from transformers import MarianConfig, MarianMTModel, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_pt_utils import LabelSmoother
from transformers.utils import find_labels

from hf_vanilla.modeling_vanilla import (
    ChunkedLinearCrossEntropy,
    label_smoothed_cross_entropy_sum,
    shift_tokens_right,
)
from hf_vanilla.training.callbacks import SourceNeglectCallback
from hf_vanilla.training.metrics import source_use_metrics, source_use_totals

from .conftest import BOS, EOS, PAD, make_model, padded_batch
from .conftest import TEST_CONFIG as TEST_SIZES


def labelled_batch():
    input_ids, attention_mask = padded_batch([[5, 6, 7, 8, EOS], [9, 10, EOS], [11, 12, 13, EOS]])
    labels, _ = padded_batch([[20, 21, 22, EOS], [23, EOS], [24, 25, 26, 27, EOS]], pad=-100)
    return input_ids, attention_mask, labels


def test_shift_tokens_right_hand_example():
    labels = torch.tensor([[7, 8, EOS, -100], [9, EOS, -100, -100]])
    assert shift_tokens_right(labels, PAD, BOS).tolist() == [[BOS, 7, 8, EOS], [BOS, 9, EOS, PAD]]
    model = make_model()
    assert torch.equal(model.prepare_decoder_input_ids_from_labels(labels), shift_tokens_right(labels, PAD, BOS))


def test_loss_is_token_mean_cross_entropy():
    model = make_model()
    input_ids, attention_mask, labels = labelled_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    expected = nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert torch.allclose(out.loss, expected, atol=1e-6)


def test_loss_is_exact_under_gradient_accumulation():
    # The Trainer passes num_items_in_batch = valid target tokens of the whole accumulated batch; the sum of the
    # micro-batch losses must then equal the loss of the full batch, whatever the micro-batches' token counts.
    model = make_model()
    input_ids, attention_mask, labels = labelled_batch()
    full = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    num_items = (labels != -100).sum()
    parts = [
        model(
            input_ids=input_ids[rows],
            attention_mask=attention_mask[rows],
            labels=labels[rows],
            num_items_in_batch=num_items,
        ).loss
        for rows in (slice(0, 1), slice(1, 3))
    ]
    assert torch.allclose(sum(parts), full, atol=1e-6)
    naive_mean = (
        sum(
            model(input_ids=input_ids[r], attention_mask=attention_mask[r], labels=labels[r]).loss
            for r in (slice(0, 1), slice(1, 3))
        )
        / 2
    )
    assert not torch.allclose(naive_mean, full, atol=1e-4)  # the pitfall the invariant guards against


def gradients(model, batch, **loss_options):
    input_ids, attention_mask, labels = batch
    model.zero_grad()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **loss_options).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def label_smoother_loss_and_gradients(model, batch, smoothing):
    """The reference: the Trainer's `LabelSmoother` over logits the model materialises."""
    input_ids, attention_mask, labels = batch
    model.zero_grad()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    loss = LabelSmoother(epsilon=smoothing)(outputs, labels) if smoothing else None
    if loss is None:
        loss = nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize(
    "variant",
    [{}, {"add_final_logits_bias": True}, {"share_encoder_decoder_embeddings": False, "tie_word_embeddings": False}],
)
def test_chunked_loss_equals_the_label_smoother_in_value_and_gradients(smoothing, variant):
    model = make_model(dropout=0.0, **variant).train()
    if model.final_logits_bias is not None:
        model.final_logits_bias.normal_()
    batch = labelled_batch()
    expected_loss, expected_gradients = label_smoother_loss_and_gradients(model, batch, smoothing)
    for chunk_size in (None, 1024):
        skip_logits = chunk_size is not None
        input_ids, attention_mask, labels = batch
        model.zero_grad()
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            label_smoothing=smoothing,
            loss_chunk_size=chunk_size,
        )
        assert (out.logits is None) == skip_logits
        assert torch.allclose(out.loss, expected_loss, atol=1e-6)
        out.loss.backward()
        for name, expected in expected_gradients.items():
            got = dict(model.named_parameters())[name].grad
            assert torch.allclose(got, expected, atol=1e-5), (name, skip_logits)


def test_chunked_loss_under_bf16_autocast_equals_the_label_smoother_within_bf16_tolerance():
    # What `--bf16` does on a CPU: Accelerate runs the forward under bf16 autocast, the chunked loss included.
    model = make_model(dropout=0.0, vocab_size=200, d_model=64).train()
    batch = labelled_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected_loss, expected_gradients = label_smoother_loss_and_gradients(model, batch, 0.1)
        input_ids, attention_mask, labels = batch
        model.zero_grad()
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            label_smoothing=0.1,
            loss_chunk_size=1024,
        )
    assert out.logits is None and out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert torch.allclose(out.loss, expected_loss, rtol=1e-2)  # bf16 keeps 8 bits of mantissa: ~0.4% per rounding
    out.loss.backward()
    _, float32_gradients = label_smoother_loss_and_gradients(model, batch, 0.1)
    for name, expected in expected_gradients.items():
        got = dict(model.named_parameters())[name].grad
        # as close to the bf16 reference as that reference is to float32: the same rounding, not another loss
        tolerance = 2 * (expected - float32_gradients[name]).norm() + 1e-3 * expected.norm()
        assert (got - expected).norm() <= tolerance, name


def test_bf16_training_runs_the_chunked_loss_and_learns(tmp_path):
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    from benchmarks.synthetic import word_level_tokenizer
    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    rows = [[4 + (i + j) % 40 for j in range(2 + i % 6)] + [EOS] for i in range(64)]
    data = Dataset.from_dict(
        {
            "input_ids": rows,
            "labels": rows,
            "source_length": list(map(len, rows)),
            "target_length": list(map(len, rows)),
        }
    )
    model = make_model(dropout=0.0, vocab_size=48).train()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=30,
        learning_rate=3e-3,
        warmup_steps=5,
        label_smoothing_factor=0.1,
        bf16=True,
        use_cpu=True,
        report_to=[],
        logging_steps=5,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForSeq2Seq(word_level_tokenizer(48), model=model),
        max_tokens=64,
    )
    assert trainer.accelerator.mixed_precision == "bf16"
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert all(map(math.isfinite, losses)) and losses[-1] < 0.8 * losses[0]
    assert losses[-1] < math.log(48)  # below a uniform guess over the vocabulary: it learnt


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_chunks_add_up_to_the_whole_batch(chunk_size):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 8, generator=generator, requires_grad=True)
    weight = torch.randn(13, 8, generator=generator, requires_grad=True)
    bias = torch.randn(13, generator=generator)
    labels = torch.randint(0, 13, (64,), generator=generator)
    labels[::5] = -100
    expected = label_smoothed_cross_entropy_sum(hidden @ weight.t() + bias, labels, 0.1)
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    total = ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, 0.1, chunk_size)
    assert torch.allclose(total, expected, atol=1e-5)
    for got, want in zip(torch.autograd.grad(3.0 * total, (hidden, weight)), expected_grads, strict=True):
        assert torch.allclose(got, 3.0 * want, atol=1e-5)  # the incoming gradient scales both


def test_the_loss_options_are_per_call_and_checked():
    model = make_model().train()
    input_ids, attention_mask, labels = labelled_batch()
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert model(**batch).logits is not None  # nothing asked: Marian's contract, in training too
    assert model(**batch, loss_chunk_size=16).logits is None
    assert model.eval()(**batch, loss_chunk_size=16).logits is None  # asked for, in any mode
    for bad in ({"label_smoothing": 1.0}, {"label_smoothing": -0.1}, {"loss_chunk_size": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            model(**batch, **bad)
    # Options, not label columns: the Trainer computes no loss for batches that lack one of these.
    assert find_labels(type(model)) == ["labels"]


def test_the_trainer_asks_the_model_for_the_smoothed_loss_and_leaves_its_config_alone(tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    model = make_model(dropout=0.0).train()
    config_before = model.config.to_dict()
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, use_cpu=True, report_to=[])
    trainer = TokenBudgetSeq2SeqTrainer(model=model, args=args, max_tokens=64)
    changed = {key for key, value in model.config.to_dict().items() if config_before.get(key) != value}
    assert trainer.label_smoother is None and changed <= {"use_cache"}  # the library's own Trainer sets use_cache
    input_ids, attention_mask, labels = labelled_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    expected, _ = label_smoother_loss_and_gradients(model, (input_ids, attention_mask, labels), 0.1)
    loss, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)
    assert outputs.logits is None and torch.allclose(loss, expected, atol=1e-6)  # chunked, smoothed
    model.eval()
    loss, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)
    assert outputs.logits is not None and torch.allclose(loss, expected, atol=1e-6)  # evaluation keeps its logits


class HostReads(TorchFunctionMode):
    """Counts the tensor-to-Python conversions made under it: on an accelerator each one waits for the device."""

    CONVERSIONS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in self.CONVERSIONS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_a_training_step_reads_no_more_back_to_the_host_than_marianmt(attn_implementation):
    sizes = {name: TEST_SIZES[name] for name in ("vocab_size", "d_model", "encoder_layers", "decoder_layers")}
    marian = MarianMTModel(
        MarianConfig(**sizes, encoder_attention_heads=4, decoder_attention_heads=4, pad_token_id=PAD,
                     decoder_start_token_id=BOS, eos_token_id=EOS, attn_implementation=attn_implementation)
    )  # fmt: skip
    ours = make_model(attn_implementation=attn_implementation)
    input_ids, attention_mask, labels = labelled_batch()
    reads = {}
    for name, model, loss_options in (
        ("ours", ours, {"label_smoothing": 0.1, "loss_chunk_size": 4}),  # what our trainer asks for
        ("ours, plain loss", ours, {}),
        ("marian", marian, {}),
    ):
        with HostReads() as counter:
            model.train()(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **loss_options
            ).loss.backward()
        reads[name] = len(counter.calls)
    assert reads["marian"] > 0  # the counter sees the library's own reads (its mask builders' `.all()`)
    assert reads["ours"] <= reads["marian"] and reads["ours, plain loss"] <= reads["marian"], reads
    with HostReads() as counter:  # outside training a caller's ids are range-checked, which reads them
        ours.eval()(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert counter.calls.count("tolist") == 2


def test_gradient_checkpointing_gives_the_same_gradients():
    model = make_model(dropout=0.0).train()
    batch = labelled_batch()
    plain = gradients(model, batch)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    assert all(layer.gradient_checkpointing for layer in layers)
    checkpointed = gradients(model, batch)
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name


def copy_batch(generator: torch.Generator, rows: int = 32) -> torch.Tensor:
    """Random sequences of 6 ordinary tokens and EOS: source and target of the copy task."""
    body = torch.randint(4, 16, (rows, 6), generator=generator)
    return torch.cat([body, torch.full((rows, 1), EOS)], dim=1)


@pytest.fixture(scope="module")
def trained_copy_model():
    """A tiny model trained 300 updates to copy its source; returns it with its losses."""
    torch.manual_seed(0)
    model = make_model(vocab_size=16, dropout=0.0, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    # Warm up, then decay to zero: a constant rate leaves the loss bouncing on some CPUs' kernels (seen on CI).
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=300, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(300):
        sequence = copy_batch(generator)
        loss = model(input_ids=sequence, attention_mask=torch.ones_like(sequence), labels=sequence).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return model.eval(), losses


@pytest.fixture
def copy_training(trained_copy_model, own):
    return own(trained_copy_model)


def test_tiny_model_learns_to_copy(copy_training):
    model, losses = copy_training
    assert sum(losses[-20:]) / 20 < 0.15  # from ln(12) = 2.5 at chance; the mean of the last 20 (0.04-0.06 measured)
    test = torch.tensor([[4, 9, 15, 7, 7, 12, EOS]])
    out = model.generate(input_ids=test, max_new_tokens=10, num_beams=1, do_sample=False)
    assert out[0, 1:].tolist() == test[0].tolist()


def copy_task_batches(count: int = 3) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        sequence = copy_batch(generator, rows=8)
        batches.append({"input_ids": sequence, "attention_mask": torch.ones_like(sequence), "labels": sequence})
    return batches


def test_source_use_is_large_for_a_model_that_copies(copy_training):
    model, _ = copy_training
    metrics = source_use_metrics(source_use_totals(model, copy_task_batches()))
    # With the true source the copy is near certain; with another row's, each token is a guess among 12.
    assert metrics["eval_nll"] < 0.2
    assert metrics["eval_source_use"] > 1.5
    assert metrics["eval_source_use"] == pytest.approx(metrics["eval_nll_shuffled_source"] - metrics["eval_nll"])


def test_source_use_is_zero_for_a_model_that_ignores_its_source():
    model = make_model(dropout=0.0).eval()
    for layer in model.model.decoder.layers:  # cross-attention contributes nothing: the decoder is a language model
        nn.init.zeros_(layer.encoder_attn.out_proj.weight)
        nn.init.zeros_(layer.encoder_attn.out_proj.bias)
    input_ids, attention_mask, labels = labelled_batch()
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "source_length": None}
    metrics = source_use_metrics(source_use_totals(model, [batch]))
    assert metrics["eval_source_use"] == pytest.approx(0.0, abs=1e-6)
    # the NLL is the model's own token-mean loss (no label smoothing)
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    assert metrics["eval_nll"] == pytest.approx(loss.item(), rel=1e-5)


def test_source_use_skips_single_row_batches_and_reports_nothing_without_tokens():
    model = make_model(dropout=0.0).eval()
    input_ids, attention_mask, labels = labelled_batch()
    single = {"input_ids": input_ids[:1], "attention_mask": attention_mask[:1], "labels": labels[:1]}
    assert source_use_totals(model, [single]).tolist() == [0.0, 0.0, 0.0]
    assert source_use_metrics(source_use_totals(model, [single]), prefix="test") == {}


def evaluations(callback: SourceNeglectCallback, source_uses: list[float], warmup_steps: int) -> None:
    args = TrainingArguments(output_dir="unused", warmup_steps=warmup_steps, report_to=[])
    state = TrainerState(max_steps=10_000)
    for step, source_use in enumerate(source_uses, start=1):
        state.global_step = step * 100
        callback.on_evaluate(args, state, TrainerControl(), metrics={"eval_source_use": source_use})


def test_neglect_callback_warns_when_source_use_stays_near_zero_past_warmup(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vanilla.training.callbacks"):
        evaluations(SourceNeglectCallback(threshold=0.1, patience=2), [0.0, 0.01, 0.02, 0.03], warmup_steps=150)
    warnings = [record.getMessage() for record in caplog.records if "SOURCE NEGLECT" in record.getMessage()]
    # updates 100 (warm-up) is not counted; 200 is the first low one, 300 the second: warnings at 300 and 400
    assert len(warnings) == 2 and "At update 300 " in warnings[0]
    assert "qkv_init_gain" in warnings[0] and "normalize_before" in warnings[0]


def test_neglect_callback_is_quiet_for_a_model_that_uses_its_source_or_recovers(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vanilla.training.callbacks"):
        evaluations(SourceNeglectCallback(), [0.0, 0.0, 0.0, 0.05, 0.8, 0.05, 1.5, 2.0], warmup_steps=350)
    assert not [record for record in caplog.records if "SOURCE NEGLECT" in record.getMessage()]


def test_progress_bar_counts_to_the_update_where_the_time_budget_ends_also_after_a_resume(tmp_path):
    from hf_vanilla.training import callbacks
    from hf_vanilla.training.train_state import TrainState

    budget = TrainState(minutes=10)
    args, state, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerState(), TrainerControl()
    state.max_steps, state.is_world_process_zero = 3000, True
    progress = callbacks.TimeBudgetProgressCallback(budget)
    progress.on_train_begin(args, state, control)
    for step in range(1, 101):  # 100 updates in the first minute: the 10 minutes hold 1000, not 3000
        budget.elapsed, state.global_step = step * 0.6, step
        progress.on_step_end(args, state, control)
    assert progress.training_bar.total == 1000
    budget.elapsed, state.global_step = 599.4, 999  # near the end of the budget, at that pace
    progress.on_step_end(args, state, control)
    assert progress.training_bar.total == 1000 and progress.training_bar.n == 999
    progress.training_bar.close()

    budget.seconds_before = budget.elapsed = 300.0  # resumed at update 500, half the budget spent: 500 updates left
    state.global_step = 500
    resumed = callbacks.TimeBudgetProgressCallback(budget)
    resumed.on_train_begin(args, state, control)
    for step in range(501, 601):
        budget.elapsed, state.global_step = 300 + (step - 500) * 0.6, step
        resumed.on_step_end(args, state, control)
    assert resumed.training_bar.total == 1000
    resumed.training_bar.close()


def test_the_trainer_refuses_split_batches_which_would_cut_token_budget_batches(tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], accelerator_config={"split_batches": True}
    )
    with pytest.raises(ValueError, match="split_batches=True cannot split token-budget batches"):
        TokenBudgetSeq2SeqTrainer(model=make_model(), args=args, max_tokens=64)
