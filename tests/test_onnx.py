"""ONNX export: the graphs compute the PyTorch model's logits, and ONNX Runtime under generate() gives its tokens."""

import importlib.util

import numpy as np
import pytest
import torch

from .conftest import EOS, REVERSAL_SOURCES, decode_step_by_step, make_model, padded_batch


onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")  # torch.onnx.export's exporter
from hf_vanilla.interop.onnx import (  # noqa: E402
    DECODER_FILE,
    ENCODER_FILE,
    OnnxVanillaForConditionalGeneration,
    decoder_input_names,
    export_onnx,
)


@pytest.fixture(scope="module")
def exported(reversal_exports):
    """The reversal model exported by the command users run."""
    return reversal_exports["onnx"]


def reversal_batch():
    return padded_batch([ids + [EOS] for ids in REVERSAL_SOURCES])


def test_graphs_compute_the_models_logits_step_by_step(reversal_model, exported):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    decoder_input_ids = torch.randint(3, 24, (len(input_ids), 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    expected, cache = decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids)

    encoder = onnxruntime.InferenceSession(exported / ENCODER_FILE)
    decoder = onnxruntime.InferenceSession(exported / DECODER_FILE)
    hidden, *cross = encoder.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    with torch.no_grad():
        reference_hidden = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    np.testing.assert_allclose(hidden, reference_hidden.numpy(), atol=1e-5)
    for i, layer in enumerate(cache.cross_attention_cache.layers):
        np.testing.assert_allclose(cross[2 * i], layer.keys.numpy(), atol=1e-5)
        np.testing.assert_allclose(cross[2 * i + 1], layer.values.numpy(), atol=1e-5)

    layers = model.config.decoder_layers
    empty = np.zeros((*cross[0].shape[:2], 0, cross[0].shape[3]), dtype=np.float32)
    past = [empty] * (2 * layers)
    for t in range(decoder_input_ids.shape[1]):  # the first step starts from an empty past
        arrays = [decoder_input_ids[:, t : t + 1].contiguous().numpy(), attention_mask.numpy()]
        for i in range(layers):
            arrays += [past[2 * i], past[2 * i + 1], cross[2 * i], cross[2 * i + 1]]
        logits, *past = decoder.run(None, dict(zip(decoder_input_names(layers), arrays, strict=True)))
        np.testing.assert_allclose(logits[:, 0], expected[:, t].numpy(), atol=1e-4)
        assert past[0].shape[2] == t + 1


def test_decoder_graph_takes_several_new_tokens_at_once(reversal_model, exported):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, 7, 13, 9]] * len(input_ids))
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(exported)
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    got = onnx_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "decoding",
    [dict(num_beams=1), dict(num_beams=4), dict(num_beams=4, length_penalty=1.0, num_return_sequences=2)],
    ids=["greedy", "beam4", "beam4-two-returned"],
)
def test_generate_gives_the_models_tokens_on_a_padded_batch(reversal_model, exported, decoding):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(exported)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **decoding)
    got = onnx_model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **decoding)
    assert expected[0, 1:5].tolist() == [7, 13, 9, 5]  # the model really learned to reverse
    assert torch.equal(got, expected)


def test_generate_without_cache_gives_the_cached_tokens(exported):
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(exported)
    input_ids, attention_mask = reversal_batch()
    cached = onnx_model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=2)
    uncached = onnx_model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=2, use_cache=False
    )
    assert torch.equal(cached, uncached)


def test_export_folder_carries_what_generation_and_tokenization_need(reversal_model, exported):
    model, tokenizer = reversal_model
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(exported)
    assert onnx_model.generation_config.num_beams == model.generation_config.num_beams == 4
    assert onnx_model.config.to_diff_dict() == model.config.to_diff_dict()
    assert (exported / "tokenizer.json").exists()
    for session in (onnx_model.encoder.session, onnx_model.decoder_session):  # workers sleep between steps
        assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_bad_input_and_folders_fail_clearly(reversal_model, exported, tmp_path):
    model, tokenizer = reversal_model
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(exported)
    with pytest.raises(ValueError, match="vocabulary is"):
        onnx_model.generate(input_ids=torch.tensor([[5, 99, EOS]]), max_new_tokens=3)
    with pytest.raises(ValueError, match="no attentions"):
        onnx_model.generate(input_ids=torch.tensor([[5, EOS]]), output_attentions=True, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="ONNX export covers 1024"):
        onnx_model.generate(input_ids=torch.full((1, 1025), 5), max_new_tokens=3)
    with pytest.raises(ValueError, match="ONNX export covers 1024"):
        onnx_model.generate(input_ids=torch.tensor([[5, EOS]]), min_new_tokens=1030, max_new_tokens=1030, num_beams=1)
    with pytest.raises(ValueError, match="loss with the PyTorch model"):
        onnx_model(input_ids=torch.tensor([[5, EOS]]), labels=torch.tensor([[5, EOS]]))
    with pytest.raises(FileExistsError, match="force"):
        export_onnx(model, tokenizer, exported)
    with pytest.raises(FileNotFoundError, match="export onnx"):
        OnnxVanillaForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="float32"):
        export_onnx(model.to(torch.bfloat16), tokenizer, tmp_path / "bf16")
    model.float()
    assert not model.training


def test_every_architecture_variant_exports_and_the_model_is_left_as_it_was(tmp_path):
    """Learned positions, pre-LN, GELU, separate untied vocabularies with a final logits bias: the graphs follow
    the config, and export restores the model's attention implementation and training mode."""
    model = make_model(
        seed=3,
        attn_implementation="sdpa",
        position_embedding_type="learned",
        normalize_before=True,
        activation_function="gelu",
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
        decoder_vocab_size=45,
        add_final_logits_bias=True,
    )
    torch.nn.init.normal_(model.final_logits_bias)
    model.train()
    export_onnx(model, None, tmp_path / "learned")
    assert model.training and model.config._attn_implementation == "sdpa"
    model.eval()
    onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(tmp_path / "learned")
    input_ids, attention_mask = padded_batch([[5, 9, 14, 22, 7, 31, EOS], [40, 12, EOS], [18, 3, 27, 55, EOS]])
    decoder_input_ids = torch.tensor([[1, 44, 3, 17, 8]] * 3)
    expected, _ = decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids)
    # the same helper drives the ONNX model, with the same config-less cache transformers' examples build
    got, cache = decode_step_by_step(onnx_model, input_ids, attention_mask, decoder_input_ids)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    with pytest.raises(ValueError, match="ONNX export covers 128"):  # learned positions stop at their table
        onnx_model.generate(input_ids=torch.full((1, 129), 5), max_new_tokens=3)


def test_missing_optional_dependencies_name_the_extra(reversal_model, tmp_path, monkeypatch):
    model, tokenizer = reversal_model
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnxscript" else object())
    with pytest.raises(ImportError, match=r"onnxscript: pip install 'hf-vanilla\[export\]'"):
        export_onnx(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()
