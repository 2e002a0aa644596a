"""The architecture against independent truth: torch.nn's own Transformer layers, and values computed by hand."""

import copy
import math

import pytest
import torch
from torch import nn

from hf_vanilla.modeling_vanilla import VanillaAttention, sinusoidal_position_table

from .conftest import BOS, EOS, make_model, padded_batch, to_device


def reference_position_encoding(length: int, dim: int) -> torch.Tensor:
    """The paper's formula, written out element by element in Python floats (independent of the package)."""
    table = torch.zeros(length, dim, dtype=torch.float64)
    for pos in range(length):
        for j in range(dim):
            angle = pos / 10000 ** (2 * (j // 2) / dim)
            table[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


def copy_attention(ours: VanillaAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def copy_norm_and_ffn(ours, theirs, norms: list[tuple[nn.LayerNorm, nn.LayerNorm]]) -> None:
    theirs.linear1.load_state_dict(ours.feed_forward.fc1.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.fc2.state_dict())
    for our_norm, their_norm in norms:
        their_norm.load_state_dict(our_norm.state_dict())


def build_reference(model):
    """torch.nn encoder/decoder layers (post-LN, ReLU, batch_first, no final stack norm) holding our weights."""
    config = model.config
    layer_kwargs = dict(
        d_model=config.d_model, dropout=0.0, activation="relu", batch_first=True, layer_norm_eps=config.layer_norm_eps
    )
    encoder_layers, decoder_layers = [], []
    with torch.no_grad():
        for ours in model.model.encoder.layers:
            theirs = nn.TransformerEncoderLayer(
                nhead=config.encoder_attention_heads, dim_feedforward=config.encoder_ffn_dim, **layer_kwargs
            ).double()
            copy_attention(ours.self_attn, theirs.self_attn)
            copy_norm_and_ffn(
                ours, theirs, [(ours.self_attn_layer_norm, theirs.norm1), (ours.final_layer_norm, theirs.norm2)]
            )
            encoder_layers.append(theirs.eval())
        for ours in model.model.decoder.layers:
            theirs = nn.TransformerDecoderLayer(
                nhead=config.decoder_attention_heads, dim_feedforward=config.decoder_ffn_dim, **layer_kwargs
            ).double()
            copy_attention(ours.self_attn, theirs.self_attn)
            copy_attention(ours.encoder_attn, theirs.multihead_attn)
            copy_norm_and_ffn(
                ours,
                theirs,
                [
                    (ours.self_attn_layer_norm, theirs.norm1),
                    (ours.encoder_attn_layer_norm, theirs.norm2),
                    (ours.final_layer_norm, theirs.norm3),
                ],
            )
            decoder_layers.append(theirs.eval())
    return encoder_layers, decoder_layers


def reference_forward(model, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask):
    encoder_layers, decoder_layers = build_reference(model)
    d_model = model.config.d_model
    embedding = model.model.encoder.embed_tokens.weight  # shared by source, target and the output layer
    positions = reference_position_encoding(max(input_ids.shape[1], decoder_input_ids.shape[1]), d_model)

    def embed(ids):
        return embedding[ids] * math.sqrt(d_model) + positions[: ids.shape[1]]

    source_padding = attention_mask == 0
    memory = embed(input_ids)
    for layer in encoder_layers:
        memory = layer(memory, src_key_padding_mask=source_padding)

    target_length = decoder_input_ids.shape[1]
    causal = torch.triu(torch.ones(target_length, target_length, dtype=torch.bool), diagonal=1)
    hidden = embed(decoder_input_ids)
    for layer in decoder_layers:
        hidden = layer(
            hidden,
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=decoder_attention_mask == 0,
            memory_key_padding_mask=source_padding,
        )
    return memory, hidden @ embedding.T


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_matches_torch_nn_transformer_in_float64(attn_implementation, source_batch, device):
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # so the sinusoid table is built at float64 precision too
    try:
        model = make_model(attn_implementation=attn_implementation)
    finally:
        torch.set_default_dtype(previous_dtype)
    assert model.dtype == torch.float64
    input_ids, attention_mask = source_batch
    decoder_input_ids, decoder_attention_mask = padded_batch([[BOS, 8, 9, 10, 11], [BOS, 30], [BOS, 4, 5, EOS]])

    with torch.no_grad():
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
        )
        ours = copy.deepcopy(model).to(device)(**to_device(inputs, device))
        memory, logits = reference_forward(model, **inputs)  # on the CPU

    valid_source = attention_mask.bool()
    # Padded source positions are never attended to, so only real tokens' encoder states have to agree.
    assert (ours.encoder_last_hidden_state.cpu()[valid_source] - memory[valid_source]).abs().max() <= 1e-9
    assert (ours.logits.cpu() - logits).abs().max() <= 1e-9


def test_sinusoid_table_hand_values():
    table = sinusoidal_position_table(num_positions=4, dim=4)
    # PE(pos, 2i) = sin(pos / 10000^(2i/4)): the frequencies are 1 and 1/100.
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert table[1, 0].item() == pytest.approx(0.8414709848078965, abs=1e-15)  # sin(1)
    assert table[1, 1].item() == pytest.approx(0.5403023058681398, abs=1e-15)  # cos(1)
    assert table[2, 2].item() == pytest.approx(0.019998666693333080, abs=1e-15)  # sin(0.02)
    assert table[2, 3].item() == pytest.approx(0.9998000066665778, abs=1e-15)  # cos(0.02)
    assert table[3, 0].item() == pytest.approx(0.1411200080598672, abs=1e-15)  # sin(3)


def test_sinusoid_concatenated_layout_reorders_the_same_features():
    interleaved = sinusoidal_position_table(50, 8, "interleaved")
    concatenated = sinusoidal_position_table(50, 8, "concatenated")
    assert torch.equal(concatenated[:, :4], interleaved[:, 0::2])
    assert torch.equal(concatenated[:, 4:], interleaved[:, 1::2])


def test_sinusoid_table_matches_formula_at_d_model_512():
    table = sinusoidal_position_table(60, 512)
    reference = reference_position_encoding(60, 512)
    assert (table - reference).abs().max() <= 1e-12


def identity_attention(d_model: int, heads: int) -> VanillaAttention:
    model = make_model(d_model=d_model, encoder_attention_heads=heads, decoder_attention_heads=heads)
    attention = model.model.encoder.layers[0].self_attn
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            projection.weight.copy_(torch.eye(d_model))
            projection.bias.zero_()
    return attention


def test_one_head_attention_hand_computed():
    # x = [[1, 0], [0, 2]] with identity projections: scores = x xᵀ / sqrt(2) = [[1, 0], [0, 4]] / sqrt(2).
    attention = identity_attention(d_model=2, heads=1)
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    output, weights = attention(x)
    p0 = math.exp(1 / math.sqrt(2)) / (math.exp(1 / math.sqrt(2)) + 1)  # row 0: softmax([1/√2, 0])
    p1 = 1 / (1 + math.exp(4 / math.sqrt(2)))  # row 1: weight on token 0 of softmax([0, 4/√2])
    expected = torch.tensor([[[p0, 2 * (1 - p0)], [p1, 2 * (1 - p1)]]])
    assert torch.allclose(weights[0, 0], torch.tensor([[p0, 1 - p0], [p1, 1 - p1]]), atol=1e-6)
    assert torch.allclose(output, expected, atol=1e-6)


def test_scale_is_one_over_sqrt_d_head_not_d_model():
    # Two heads of d_head = 2 over d_model = 4: head 0 sees features 0-1, head 1 sees 2-3.
    attention = identity_attention(d_model=4, heads=2)
    x = torch.tensor([[[1.0, 0.0, 3.0, 0.0], [0.0, 2.0, 0.0, 1.0]]])
    _, weights = attention(x)
    for head, features in enumerate([x[0, :, 0:2], x[0, :, 2:4]]):
        scores = features @ features.T / math.sqrt(2)  # d_head = 2
        assert torch.allclose(weights[0, head], scores.softmax(-1), atol=1e-6)
        wrong = (features @ features.T / math.sqrt(4)).softmax(-1)  # what 1/sqrt(d_model) would give
        assert not torch.allclose(weights[0, head], wrong, atol=1e-3)
