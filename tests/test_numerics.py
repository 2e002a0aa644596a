"""Finite masks: a fully padded row never turns into NaN, in float32, float16 and bfloat16, eager and sdpa."""

import pytest
import torch

from .conftest import BOS, EOS, make_model, padded_batch, to_device


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_fully_padded_source_row_stays_finite(attn_implementation, dtype, device):
    model = make_model(attn_implementation=attn_implementation)
    with torch.no_grad():  # trained models have attention logits of tens: -65504 + (-40) overflows float16 to -inf
        for name, parameter in model.named_parameters():
            if "q_proj" in name:
                parameter.mul_(40.0)
    model = model.to(device, dtype)
    input_ids, attention_mask = padded_batch([[5, 6, 7, EOS], [8, EOS]])
    attention_mask[1] = 0  # row 1: every source position is padding, so encoder and cross attention see nothing
    decoder_input_ids, decoder_attention_mask = padded_batch([[BOS, 9, 10], [BOS]])
    decoder_attention_mask[1] = 0  # and its target is padding too
    model.train()  # the gradient must be finite as well
    inputs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
    )
    out = model(**to_device(inputs, device))
    assert torch.isfinite(out.encoder_last_hidden_state).all()
    assert torch.isfinite(out.logits).all()
    out.logits.float().sum().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_tracks_float32(attn_implementation, dtype, device):
    model = make_model(attn_implementation=attn_implementation)
    input_ids, attention_mask = padded_batch([[5, 6, 7, EOS], [8, EOS]])
    decoder_input_ids = torch.tensor([[BOS, 9, 10], [BOS, 11, 12]])
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        reference = model(**inputs).logits  # float32 on the CPU
        half = model.to(device, dtype)(**to_device(inputs, device)).logits.float().cpu()
    assert (half - reference).abs().max() < 0.1 * reference.abs().max()


def test_masks_use_finite_minimums():
    model = make_model(attn_implementation="eager")
    input_ids, attention_mask = padded_batch([[5, 6, EOS], [8, EOS]])
    seen = []
    attention = model.model.encoder.layers[0].self_attn
    handle = attention.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
    )
    with torch.no_grad():
        model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    handle.remove()
    mask = seen[0]
    assert torch.isfinite(mask).all()
    assert mask[1, 0, 0, 2].item() == torch.finfo(mask.dtype).min  # the padded key
    assert mask[1, 0, 0, :2].eq(0).all()
