"""Save/load is identity; ties survive it; the saved folder loads as remote code where hf_vanilla cannot."""

import json
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from hf_vanilla import VanillaTransformerForConditionalGeneration, VanillaTransformerModel

from .conftest import BOS, make_model, padded_batch, run_without_hf_vanilla


def logits_of(model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[BOS, 4, 5, 6]] * input_ids.shape[0])
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits


def embeddings(model):
    return model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight, model.lm_head.weight


@pytest.mark.parametrize(
    "share, tie",
    [(True, True), (True, False), (False, True), (False, False)],
    ids=["share+tie", "share-only", "tie-only", "neither"],
)
def test_round_trip_is_identity_and_keeps_ties(tmp_path, source_batch, share, tie):
    model = make_model(share_encoder_decoder_embeddings=share, tie_word_embeddings=tie)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.bin"))
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()

    assert torch.equal(logits_of(model, source_batch), logits_of(reloaded, source_batch))
    for m in (model, reloaded):
        encoder, decoder, output = embeddings(m)
        assert (encoder is decoder) == share
        assert (output is (encoder if share else decoder)) == tie
    # Tied copies are stored once; independent ones are all stored.
    stored = load_file(tmp_path / "model.safetensors")
    embedding_keys = {k for k in stored if "embed_tokens" in k or k.startswith("lm_head")}
    assert len(embedding_keys) == 3 - share - tie


def test_ties_hold_during_training_updates():
    model = make_model(share_encoder_decoder_embeddings=True, tie_word_embeddings=True).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    input_ids, attention_mask = padded_batch([[5, 6, 7, 2]])
    model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([[8, 9, 2]])).loss.backward()
    optimizer.step()
    encoder, decoder, output = embeddings(model)
    assert encoder.data_ptr() == decoder.data_ptr() == output.data_ptr()


def test_sinusoid_table_is_not_stored_but_rebuilt(tmp_path, source_batch):
    model = make_model()
    model.save_pretrained(tmp_path)
    assert not any("embed_positions" in key for key in load_file(tmp_path / "model.safetensors"))
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(reloaded.model.encoder.embed_positions.weight, model.model.encoder.embed_positions.weight)


def test_learned_positions_and_final_bias_are_stored(tmp_path, source_batch):
    model = make_model(position_embedding_type="learned", add_final_logits_bias=True, normalize_before=True)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert torch.equal(logits_of(model, source_batch), logits_of(reloaded, source_batch))


def test_auto_classes_in_process(tmp_path, source_batch):
    model = make_model()
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == "VanillaTransformerConfig"
    assert isinstance(AutoModel.from_pretrained(tmp_path), VanillaTransformerModel)
    lm = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert isinstance(lm, VanillaTransformerForConditionalGeneration)
    assert torch.equal(logits_of(model, source_batch), logits_of(lm, source_batch))


def test_saved_folder_is_a_remote_code_folder(tmp_path):
    make_model().save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_vanilla.py", "modeling_vanilla.py"} <= files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_vanilla.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla.VanillaTransformerForConditionalGeneration",
    }


REMOTE_LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["hf_vanilla"] = None  # as if the package were not installed: `import hf_vanilla` raises
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    folder, out = sys.argv[1], sys.argv[2]
    try:
        import hf_vanilla  # noqa: F401
        raise SystemExit("hf_vanilla is importable; the test would prove nothing")
    except ImportError:
        pass
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    base = AutoModel.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager").eval()
    lm = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager").eval()
    for obj in (config, base, lm):
        assert type(obj).__module__.startswith("transformers_modules"), type(obj).__module__
    inputs = torch.load(folder + "/inputs.pt", weights_only=True)
    with torch.no_grad():
        logits = lm(**inputs).logits
        hidden = base(**inputs).last_hidden_state
        generated = lm.generate(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6
        )
    save_file({"logits": logits, "hidden": hidden, "generated": generated.contiguous()}, out)
    print(type(config).__name__, type(base).__name__, type(lm).__name__)
    """
)


def test_remote_code_loads_in_a_fresh_process_without_hf_vanilla(tmp_path, source_batch):
    folder = tmp_path / "model"
    model = make_model(seed=5)
    model.save_pretrained(folder)
    input_ids, attention_mask = source_batch
    inputs = dict(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.tensor([[BOS, 4, 5, 6]] * 3)
    )
    torch.save(inputs, folder / "inputs.pt")
    stdout = run_without_hf_vanilla(REMOTE_LOADER, [str(folder), str(tmp_path / "out.safetensors")], tmp_path)
    assert "VanillaTransformerConfig VanillaTransformerModel VanillaTransformerForConditionalGeneration" in stdout
    remote = load_file(tmp_path / "out.safetensors")
    with torch.no_grad():
        assert torch.equal(remote["logits"], model(**inputs).logits)
        assert torch.equal(remote["hidden"], model.model(**inputs).last_hidden_state)
        expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6)
    assert torch.equal(remote["generated"], expected)


RESIZE_VARIANTS = {
    "shared, tied": {},
    "shared, untied head with logits bias": {"tie_word_embeddings": False, "add_final_logits_bias": True},
    "separate, tied": {"share_encoder_decoder_embeddings": False},
    "separate, untied head with logits bias": {
        "share_encoder_decoder_embeddings": False,
        "tie_word_embeddings": False,
        "add_final_logits_bias": True,
    },
}


@pytest.mark.parametrize("variant", RESIZE_VARIANTS)
def test_resized_vocabulary_keeps_the_old_tokens_and_saves_loads_and_generates(variant, tmp_path):
    model = make_model(**RESIZE_VARIANTS[variant])
    if model.final_logits_bias is not None:
        model.final_logits_bias.normal_()  # a converted Marian checkpoint's bias is not zero
    old_source, old_target = model.config.vocab_size, model.config.decoder_vocab_size
    input_ids, attention_mask = padded_batch([[5, 6, 7, 8, 2], [9, 10, 2]])
    decoder_input_ids = torch.tensor([[BOS, 11, 12], [BOS, 13, 14]])
    before = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits

    model.resize_token_embeddings(old_source + 6)  # what "add tokens" tutorials and run_translation.py call
    if model.config.share_encoder_decoder_embeddings:
        with pytest.raises(ValueError, match="resize_token_embeddings"):
            model.resize_decoder_token_embeddings(old_target + 3)
        new_source = new_target = old_source + 6
    else:
        model.resize_decoder_token_embeddings(old_target + 3)
        new_source, new_target = old_source + 6, old_target + 3
    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (new_source, new_target)

    after = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    assert after.shape[-1] == new_target
    assert torch.allclose(after[..., :old_target], before, atol=1e-6)  # the old vocabulary is untouched

    # the new ids are accepted everywhere: source, decoder input, labels, generation
    new_ids = torch.tensor([[new_source - 1, 5, 2]])
    labels = torch.tensor([[new_target - 1, 2]])
    loss = model(input_ids=new_ids, labels=labels).loss
    assert torch.isfinite(loss)
    generated = model.generate(input_ids=new_ids, num_beams=2, max_new_tokens=4)
    assert int(generated.max()) < new_target

    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert torch.allclose(reloaded(input_ids=new_ids, labels=labels).loss, loss, atol=1e-6)
    assert torch.equal(reloaded.generate(input_ids=new_ids, num_beams=2, max_new_tokens=4), generated)
