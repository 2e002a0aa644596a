"""output_attentions / output_hidden_states, inputs_embeds, variants, and clear errors for bad input."""

import pytest
import torch

from .conftest import BOS, EOS, TEST_CONFIG, make_model, padded_batch


@pytest.fixture
def batch():
    input_ids, attention_mask = padded_batch([[5, 6, 7, 8, EOS], [9, EOS]])
    return dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.tensor([[BOS, 4, 5]] * 2))


def test_attentions_and_hidden_states(batch):
    model = make_model()
    with torch.no_grad():
        out = model(**batch, output_attentions=True, output_hidden_states=True)
    layers, heads = TEST_CONFIG["encoder_layers"], TEST_CONFIG["encoder_attention_heads"]
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == layers + 1
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == layers
    assert out.encoder_attentions[0].shape == (2, heads, 5, 5)
    assert out.cross_attentions[0].shape == (2, heads, 3, 5)
    for attention in (*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions):
        assert torch.allclose(attention.sum(-1), torch.ones(()), atol=1e-5)
    # Padding gets no attention; the decoder never looks ahead.
    assert out.cross_attentions[-1][1, :, :, 2:].max() < 1e-12
    assert out.encoder_attentions[0][1, :, :, 2:].max() < 1e-12
    assert torch.triu(out.decoder_attentions[0][0, 0], diagonal=1).max() < 1e-12
    assert torch.equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


def test_inputs_embeds_match_input_ids(batch):
    model = make_model()
    embed = model.get_input_embeddings()
    with torch.no_grad():
        by_ids = model(**batch).logits
        by_embeds = model(
            inputs_embeds=embed(batch["input_ids"]),
            attention_mask=batch["attention_mask"],
            decoder_inputs_embeds=embed(batch["decoder_input_ids"]),
        ).logits
    assert torch.equal(by_ids, by_embeds)


@pytest.mark.parametrize(
    "variant",
    [
        dict(normalize_before=True),
        dict(position_embedding_type="learned"),
        dict(sinusoid_layout="concatenated"),
        dict(activation_function="swish"),
        dict(activation_function="gelu"),
        dict(add_final_logits_bias=True),
        dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=40),
    ],
    ids=lambda v: ",".join(f"{k}={w}" for k, w in v.items()),
)
def test_variants_run_and_cache_correctly(variant, batch):
    model = make_model(init_std=1.0, **variant)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8, num_beams=1)
    assert torch.equal(model.generate(**kwargs, use_cache=True), model.generate(**kwargs, use_cache=False))
    vocab = variant.get("decoder_vocab_size", TEST_CONFIG["vocab_size"])
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 3, vocab)


def test_pre_ln_has_final_stack_norms_and_post_ln_does_not():
    assert make_model(normalize_before=True).model.encoder.layer_norm is not None
    assert make_model().model.encoder.layer_norm is None


def test_sinusoids_extrapolate_beyond_the_table():
    model = make_model(max_position_embeddings=8)
    long_source = torch.tensor([[5] * 20 + [EOS]])
    with torch.no_grad():
        out = model(input_ids=long_source, decoder_input_ids=torch.tensor([[BOS]]))
    assert torch.isfinite(out.logits).all()
    table = model.model.encoder.embed_positions(0, 21)
    assert table.shape == (21, TEST_CONFIG["d_model"])
    assert torch.equal(table[:8], model.model.encoder.embed_positions.weight)


def test_learned_positions_refuse_too_long_input():
    model = make_model(position_embedding_type="learned", max_position_embeddings=8)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.tensor([[5] * 9]), decoder_input_ids=torch.tensor([[BOS]]))
