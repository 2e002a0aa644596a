"""Exports through transformers' own exporters: the graphs compute the PyTorch model's logits, and their runners
under generate() give its tokens."""

import copy
import importlib.util
import json

import pytest
import torch

from .conftest import EOS, REVERSAL_SOURCES, decode_step_by_step, make_model, padded_batch


pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")  # the ONNX exporter
from hf_vanilla.interop.exporters import (  # noqa: E402
    MANIFEST,
    ExportedVanillaForConditionalGeneration,
    export_model,
)
from hf_vanilla.modeling_vanilla import CACHE_FIELD  # noqa: E402


HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
BACKENDS = ["onnx", pytest.param("openvino", marks=pytest.mark.skipif(not HAS_OPENVINO, reason="needs openvino"))]


@pytest.fixture(params=BACKENDS)
def exported(request, reversal_exports):
    """The reversal model exported by the command users run."""
    return reversal_exports[request.param]


def reversal_batch():
    return padded_batch([ids + [EOS] for ids in REVERSAL_SOURCES])


def test_the_graphs_compute_the_models_logits_step_by_step(reversal_model, exported):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    decoder_input_ids = torch.randint(3, 24, (len(input_ids), 6), generator=torch.Generator().manual_seed(0))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    expected, expected_cache = decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids)
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    with torch.no_grad():
        reference = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    encoded = exported_model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(encoded, reference, atol=1e-5, rtol=1e-5)
    got, cache = decode_step_by_step(exported_model, input_ids, attention_mask, decoder_input_ids)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    layers = zip(cache.self_attention_cache.layers, expected_cache.self_attention_cache.layers, strict=True)
    for ours, theirs in layers:
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-5)


def test_several_new_tokens_at_once_with_and_without_a_past(reversal_model, exported):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, 7, 13, 9, 5]] * len(input_ids))
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    whole = exported_model(**inputs, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(whole.logits, expected.logits, atol=1e-4, rtol=1e-4)
    first = exported_model(**inputs, decoder_input_ids=decoder_input_ids[:, :2])
    rest = exported_model(**inputs, decoder_input_ids=decoder_input_ids[:, 2:], cache=getattr(first, CACHE_FIELD))
    torch.testing.assert_close(rest.logits, expected.logits[:, 2:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "decoding",
    [dict(num_beams=1), dict(num_beams=4), dict(num_beams=4, length_penalty=1.0, num_return_sequences=2)],
    ids=["greedy", "beam4", "beam4-two-returned"],
)
def test_generate_gives_the_models_tokens_on_a_padded_batch(reversal_model, exported, decoding):
    model, _ = reversal_model
    input_ids, attention_mask = reversal_batch()
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **decoding)
    got = exported_model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **decoding)
    assert expected[0, 1:5].tolist() == [7, 13, 9, 5]  # the model really learned to reverse
    assert torch.equal(got, expected)


def test_generate_without_cache_gives_the_cached_tokens(exported):
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    input_ids, attention_mask = reversal_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=2)
    assert torch.equal(exported_model.generate(**inputs), exported_model.generate(**inputs, use_cache=False))


def test_the_export_folder_carries_what_generation_and_tokenization_need(reversal_model, exported):
    model, _ = reversal_model
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    assert exported_model.generation_config.num_beams == model.generation_config.num_beams == 4
    assert exported_model.config.to_diff_dict() == model.config.to_diff_dict()
    assert (exported / "tokenizer.json").exists()
    backend = json.loads((exported / MANIFEST).read_text())["backend"]
    assert exported_model.backend == backend
    if backend == "onnx":  # ONNX Runtime's workers sleep between steps
        for runner in [
            *exported_model.encoder.exported.runners.values(),
            *exported_model.decoder_graphs.runners.values(),
        ]:
            options = runner.session.get_session_options()
            assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_bad_input_and_folders_fail_clearly(reversal_model, exported, tmp_path):
    model, tokenizer = reversal_model
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(exported)
    with pytest.raises(ValueError, match="vocabulary is"):
        exported_model.generate(input_ids=torch.tensor([[5, 99, EOS]]), max_new_tokens=3)
    with pytest.raises(ValueError, match="no attentions"):
        exported_model.generate(input_ids=torch.tensor([[5, EOS]]), output_attentions=True, return_dict_in_generate=1)
    with pytest.raises(ValueError, match="export covers 1024"):
        exported_model.generate(input_ids=torch.full((1, 1025), 5), max_new_tokens=3)
    target_prefix = torch.ones(1, 1020, dtype=torch.long)  # generation reaches position 1025 on its sixth step
    with pytest.raises(ValueError, match="target reaches 1025 positions, but the export covers 1024"):
        exported_model.generate(
            input_ids=torch.tensor([[5, EOS]]), decoder_input_ids=target_prefix, min_new_tokens=10, max_new_tokens=10
        )
    with pytest.raises(ValueError, match="loss with the PyTorch model"):
        exported_model(input_ids=torch.tensor([[5, EOS]]), labels=torch.tensor([[5, EOS]]))
    with pytest.raises(FileExistsError, match="force"):
        export_model(model, tokenizer, exported)
    with pytest.raises(FileNotFoundError, match="hf-vanilla export onnx"):
        ExportedVanillaForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="float32"):  # a copy: rounding the shared model would change its logits
        export_model(copy.deepcopy(model).to(torch.bfloat16), tokenizer, tmp_path / "bf16")
    with pytest.raises(ValueError, match="opset_version` is for the onnx"):
        export_model(model, tokenizer, tmp_path / "openvino", backend="openvino", opset_version=18)
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
    export_model(model, None, tmp_path / "learned")
    assert model.training and model.config._attn_implementation == "sdpa"
    model.eval()
    exported_model = ExportedVanillaForConditionalGeneration.from_pretrained(tmp_path / "learned")
    input_ids, attention_mask = padded_batch([[5, 9, 14, 22, 7, 31, EOS], [40, 12, EOS], [18, 3, 27, 55, EOS]])
    decoder_input_ids = torch.tensor([[1, 44, 3, 17, 8]] * 3)
    expected, _ = decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids)
    got, cache = decode_step_by_step(exported_model, input_ids, attention_mask, decoder_input_ids)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    with pytest.raises(ValueError, match="export covers 128"):  # learned positions stop at their table
        exported_model.generate(input_ids=torch.full((1, 129), 5), max_new_tokens=3)


def test_the_library_still_needs_what_export_model_adds(tmp_path):
    """`export_for_generation` alone, as its docs show it, on our model: no encoder component; a decode graph
    captured from one start token refuses a past of 2 tokens; with `multi_token_decode` it still takes one new token.
    The day one of these changes, `export_model` can drop its encoder export, its two-token capture or its
    token-at-a-time loop."""
    from transformers.exporters import OnnxConfig, OnnxExporter

    # One layer each: what the library decides is the graphs' components and inputs, whatever the depth.
    model = make_model(attn_implementation="eager", encoder_layers=1, decoder_layers=1)
    input_ids, attention_mask = padded_batch([[5, 6, 7, EOS], [8, EOS]])
    greedy = model.generation_config
    greedy.update(num_beams=1)
    exported = OnnxExporter().export_for_generation(
        model, {"input_ids": input_ids, "attention_mask": attention_mask}, OnnxConfig(dynamic=True),
        generation_config=greedy,
    )  # fmt: skip
    assert set(exported.components) == {"prefill", "decode"}  # the encoder runs outside forward in generate()
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    step = dict(attention_mask=attention_mask, encoder_outputs=encoder_outputs)
    start = torch.ones(2, 1, dtype=torch.long)
    cache = getattr(exported.runners["prefill"](**step, decoder_input_ids=start, **{CACHE_FIELD: None}), CACHE_FIELD)
    cache = getattr(exported.runners["decode"](**step, decoder_input_ids=start, **{CACHE_FIELD: cache}), CACHE_FIELD)
    with pytest.raises(Exception, match="Got: 2 Expected: 1"):
        exported.runners["decode"](**step, decoder_input_ids=start, **{CACHE_FIELD: cache})

    prefix = torch.ones(2, 2, dtype=torch.long)
    multi_token = OnnxExporter().export_for_generation(
        model, {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": prefix},
        OnnxConfig(dynamic=True), generation_config=greedy, multi_token_decode=True,
    )  # fmt: skip
    prefill = multi_token.runners["prefill"](**step, decoder_input_ids=prefix, **{CACHE_FIELD: None})
    with pytest.raises(Exception, match="(?s)decoder_input_ids.*Got: 2 Expected: 1"):
        multi_token.runners["decode"](**step, decoder_input_ids=prefix, **{CACHE_FIELD: getattr(prefill, CACHE_FIELD)})


def test_missing_optional_dependencies_name_the_extra(reversal_model, tmp_path, monkeypatch):
    model, tokenizer = reversal_model
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnxscript" else object())
    with pytest.raises(ImportError, match=r"onnxscript: pip install 'hf-vanilla\[export\]'"):
        export_model(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_refuses_a_release_that_names_the_cache_otherwise(exported, tmp_path):
    """The graphs' cache inputs carry the name the capturing release gave the cache (5.24 renamed it): the manifest
    records it, and a release with the other name is refused before it could feed the graphs without their cache."""
    import shutil

    manifest = json.loads((exported / MANIFEST).read_text())
    assert manifest["cache_name"] == CACHE_FIELD
    other = tmp_path / "export"
    shutil.copytree(exported, other)
    other_name = "past_key_values" if CACHE_FIELD == "cache" else "cache"
    (other / MANIFEST).write_text(json.dumps({**manifest, "cache_name": other_name}))
    with pytest.raises(ValueError, match=f"names the cache `{other_name}`.*installed one names it `{CACHE_FIELD}`"):
        ExportedVanillaForConditionalGeneration.from_pretrained(other)
