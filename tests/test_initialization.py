"""The initialisation, against hand-computed bounds: Xavier-uniform everywhere, a smaller gain for q/k/v."""

import math

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn

from hf_vanilla.modeling_vanilla import VanillaAttention

from .conftest import make_model


def xavier_bound(weight: torch.Tensor, gain: float = 1.0) -> float:
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(6.0 / (fan_in + fan_out))


def assert_uniform_within(weight: torch.Tensor, bound: float) -> None:
    # Thousands of uniform draws reach close to the bound and never beyond it.
    assert weight.abs().max().item() <= bound
    assert weight.abs().max().item() > 0.95 * bound
    assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("gain", [2**-0.5, 1.0, 0.3])
def test_query_key_value_use_the_configured_gain_and_everything_else_plain_xavier(gain):
    model = make_model(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, qkv_init_gain=gain)
    attentions = [module for module in model.modules() if isinstance(module, VanillaAttention)]
    assert len(attentions) == 2 + 2 * 2  # encoder self, decoder self and cross, 2 layers each
    input_projections = set()
    for attention in attentions:
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            assert_uniform_within(projection.weight, xavier_bound(projection.weight, gain))
            assert torch.count_nonzero(projection.bias) == 0
            input_projections.add(projection)
    others = [m for m in model.modules() if isinstance(m, nn.Linear) and m not in input_projections]
    others.remove(model.lm_head)  # tied to the embeddings
    assert len(others) == 6 + 4 * 2  # out_proj of every attention, fc1 and fc2 of each of the 4 layers
    for linear in others:
        assert_uniform_within(linear.weight, xavier_bound(linear.weight))


def test_default_gain_equals_torch_multihead_attentions_packed_projection():
    # nn.MultiheadAttention draws its packed [3d, d] q/k/v weight with Xavier, i.e. the bound sqrt(6 / (3d + d));
    # fairseq reaches the same bound with gain 1/sqrt(2) on each [d, d] projection. Ours is the same distribution.
    d_model = 64
    model = make_model(d_model=d_model, encoder_ffn_dim=128, decoder_ffn_dim=128)
    reference = nn.MultiheadAttention(d_model, 4)
    packed_bound = math.sqrt(6.0 / (3 * d_model + d_model))
    assert_uniform_within(reference.in_proj_weight, packed_bound)
    query = model.model.encoder.layers[0].self_attn.q_proj.weight
    assert xavier_bound(query, model.config.qkv_init_gain) == pytest.approx(packed_bound)
    assert_uniform_within(query, packed_bound)


def test_embeddings_are_normal_with_a_zero_padding_row():
    model = make_model(d_model=64, vocab_size=500, encoder_ffn_dim=128, decoder_ffn_dim=128)
    embeddings = model.get_input_embeddings().weight
    assert torch.count_nonzero(embeddings[model.config.pad_token_id]) == 0
    assert embeddings[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)


def test_an_invalid_gain_is_refused():
    for value in (0, -1.0, True, "0.7"):
        with pytest.raises(StrictDataclassError, match="qkv_init_gain"):
            make_model(qkv_init_gain=value)
