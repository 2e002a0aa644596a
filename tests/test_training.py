"""Gradients and loss: checkpointing changes memory not gradients, the loss is exact under accumulation, it learns."""

import pytest
import torch
from torch import nn
from transformers.trainer_pt_utils import LabelSmoother

from hf_vanilla.modeling_vanilla import (
    ChunkedLinearCrossEntropy,
    label_smoothed_cross_entropy_sum,
    shift_tokens_right,
)

from .conftest import BOS, EOS, PAD, make_model, padded_batch


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
    for skip_logits in (False, True):
        input_ids, attention_mask, labels = batch
        model.zero_grad()
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            label_smoothing=smoothing,
            skip_logits=skip_logits,
        )
        assert (out.logits is None) == skip_logits
        assert torch.allclose(out.loss, expected_loss, atol=1e-6)
        out.loss.backward()
        for name, expected in expected_gradients.items():
            got = dict(model.named_parameters())[name].grad
            assert torch.allclose(got, expected, atol=1e-5), (name, skip_logits)


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


def test_skip_logits_needs_labels_and_smoothing_a_probability():
    model = make_model()
    input_ids, attention_mask, labels = labelled_batch()
    with pytest.raises(ValueError, match="skip_logits"):
        model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels.clamp(min=0), skip_logits=True
        )
    with pytest.raises(ValueError, match="label_smoothing"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, label_smoothing=1.0)


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


def test_tiny_model_learns_to_copy():
    torch.manual_seed(0)
    model = make_model(vocab_size=16, dropout=0.0, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    # Warm up, then decay to zero: a constant rate leaves the loss bouncing on some CPUs' kernels (seen on CI).
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=300, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(300):
        body = torch.randint(4, 16, (32, 6), generator=generator)
        sequence = torch.cat([body, torch.full((32, 1), EOS)], dim=1)
        loss = model(input_ids=sequence, attention_mask=torch.ones_like(sequence), labels=sequence).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < 0.15  # from ln(12) = 2.5 at chance; the mean of the last 20 (0.04-0.06 measured)
    model.eval()
    test = torch.tensor([[4, 9, 15, 7, 7, 12, EOS]])
    out = model.generate(input_ids=test, max_new_tokens=10, num_beams=1, do_sample=False)
    assert out[0, 1:].tolist() == test[0].tolist()
