"""Bad input gets a clear, early error naming the argument and the fix (the table in docs/robustness.md).

Each case states what a user does wrong and the message they must get; data-file, config and training cases live
next to their features (test_training_recipe, test_configuration, test_training_e2e) and are listed in
docs/robustness.md.
"""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Seq2SeqTrainingArguments, pipeline

from benchmarks.synthetic import word_level_tokenizer
from hf_vanilla.loading import load_model
from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

from .conftest import BOS, EOS, TEST_CONFIG, make_model


VOCAB = TEST_CONFIG["vocab_size"]
SOURCE = torch.tensor([[5, 6, EOS]])
TARGET = torch.tensor([[BOS, 4]])


def ids(*values) -> torch.Tensor:
    return torch.tensor([list(values)])


# Each case: forward() keyword arguments replacing the good ones, the error type, the message pattern.
BAD_FORWARD_INPUTS = [
    pytest.param(
        dict(input_ids=ids(5, VOCAB, EOS)),
        ValueError,
        rf"`input_ids` holds ids in \[2, {VOCAB}\].*\[0, {VOCAB - 1}\]",
        id="id at vocab_size",
    ),
    pytest.param(dict(input_ids=ids(5, -1, EOS)), ValueError, r"`input_ids` holds ids in \[-1, 5\]", id="negative id"),
    pytest.param(
        dict(decoder_input_ids=ids(BOS, 99)), ValueError, "`decoder_input_ids` holds ids", id="decoder id out of range"
    ),
    pytest.param(
        dict(input_ids=torch.tensor([[5.0, 6.0, 2.0]])), TypeError, r"integer token ids.*\.long\(\)", id="float ids"
    ),
    pytest.param(dict(input_ids=torch.tensor([[True, False]])), TypeError, "integer token ids", id="bool ids"),
    pytest.param(
        dict(input_ids=torch.tensor([5, 6, EOS])), ValueError, r"\(batch_size, sequence_length\)", id="1-D ids"
    ),
    pytest.param(dict(input_ids=torch.zeros((0, 3), dtype=torch.long)), ValueError, "is empty", id="empty batch"),
    pytest.param(
        dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), ValueError, "is empty", id="zero-length source"
    ),
    pytest.param(
        dict(attention_mask=torch.ones(1, 4, dtype=torch.long)),
        ValueError,
        r"`attention_mask` has shape \(1, 4\)",
        id="mask longer than ids",
    ),
    pytest.param(
        dict(decoder_attention_mask=torch.ones(1, 5)),
        ValueError,
        "`decoder_attention_mask` has shape",
        id="decoder mask shape",
    ),
    pytest.param(
        dict(labels=ids(7, VOCAB + 3)), ValueError, rf"`labels` holds {VOCAB + 3}.*-100", id="labels out of range"
    ),
    pytest.param(
        dict(labels=torch.tensor([[7.0, 2.0]])), ValueError, "`labels` must be integer ids", id="float labels"
    ),
    pytest.param(
        dict(inputs_embeds=torch.zeros(1, 3, TEST_CONFIG["d_model"])),
        ValueError,
        "exactly one of `input_ids`",
        id="ids and embeddings",
    ),
    pytest.param(
        dict(input_ids=None, attention_mask=None),
        ValueError,
        "exactly one of `input_ids`",
        id="neither ids nor embeddings",
    ),
]


@pytest.mark.parametrize("changes, error, message", BAD_FORWARD_INPUTS)
def test_bad_forward_input(changes, error, message):
    inputs = dict(input_ids=SOURCE, attention_mask=torch.ones_like(SOURCE), decoder_input_ids=TARGET)
    inputs.update(changes)
    with pytest.raises(error, match=message):
        make_model()(**inputs)


def test_labels_with_minus_100_are_accepted():
    out = make_model()(input_ids=SOURCE, labels=ids(7, -100))
    assert torch.isfinite(out.loss)


def test_wrong_decoder_start_token_id_in_generate():
    with pytest.raises(ValueError, match=r"`decoder_input_ids` holds ids in \[500, 500\].*decoder_start_token_id"):
        make_model().generate(input_ids=SOURCE, decoder_start_token_id=500, max_new_tokens=3)


def test_decoder_without_encoder_output():
    with pytest.raises(ValueError, match="pass `encoder_hidden_states`"):
        make_model().model.decoder(input_ids=TARGET)


def test_edited_config_json_with_unknown_variant_is_refused_on_load(tmp_path):
    make_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["activation_function"] = "swiglu3"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"`activation_function` must be one of \[.*'relu'.*\], got 'swiglu3'"):
        load_model(tmp_path)


# Tokenizer and model that come from different runs


@pytest.mark.parametrize(
    "tokenizer_changes, message",
    [
        (dict(vocab_size=VOCAB + 40), rf"tokenizer has {VOCAB + 40} entries but the model's vocabulary only {VOCAB}"),
        (dict(pad_token="t9"), r"tokenizer's `pad_token_id` is 9 but the model's is 0"),
        (dict(eos_token="t7"), r"tokenizer's `eos_token_id` is 7 but the model's is 2"),
    ],
    ids=["tokenizer larger than model", "padding id differs", "end-of-sentence id differs"],
)
def test_mismatched_tokenizer_fails_when_pipeline_and_trainer_are_built(tokenizer_changes, message, tmp_path):
    tokenizer = word_level_tokenizer(tokenizer_changes.pop("vocab_size", VOCAB))
    for name, token in tokenizer_changes.items():
        setattr(tokenizer, name, token)
    model = make_model()
    with pytest.raises(ValueError, match=message):
        pipeline("translation", model=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match=message):
        TokenBudgetSeq2SeqTrainer(
            model=model,
            args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True),
            processing_class=tokenizer,
            max_tokens=64,
        )


def test_matching_tokenizer_is_accepted_and_translates_as_generate_does():
    model, tokenizer = make_model(), word_level_tokenizer(VOCAB)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    source = tokenizer(["t5 t6"], return_tensors="pt", return_token_type_ids=False)
    expected = tokenizer.decode(model.generate(**source, num_beams=1, max_new_tokens=2)[0], skip_special_tokens=True)
    assert translator("t5 t6", num_beams=1, max_new_tokens=2)[0]["translation_text"] == expected


@pytest.mark.parametrize(
    "text, error, message",
    [
        pytest.param("", ValueError, "empty string", id="empty string"),
        pytest.param(["t5", 7], TypeError, "takes strings, got int", id="number in the list"),
        pytest.param([], ValueError, "non-empty", id="empty list"),
    ],
)
def test_bad_pipeline_input(text, error, message):
    translator = pipeline("translation", model=make_model(), tokenizer=word_level_tokenizer(VOCAB))
    with pytest.raises(error, match=message):
        translator(text, num_beams=1, max_new_tokens=2)


# Checkpoints our commands load (translate, average, export, publish, the trainer's averaged model)


def edit_weights(folder, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(
            lambda w: w.pop("model.decoder.layers.1.feed_forward.fc2.weight"),
            r"missing keys: \['model\.decoder\.layers\.1\.feed_forward\.fc2\.weight'\]",
            id="missing weight",
        ),
        pytest.param(
            lambda w: w.update({"model.decoder.extra.weight": torch.zeros(3)}),
            r"unexpected keys: \['model\.decoder\.extra\.weight'\]",
            id="unexpected weight",
        ),
    ],
)
def test_checkpoint_that_does_not_match_is_an_error_not_random_weights(edit, message, tmp_path):
    make_model().save_pretrained(tmp_path)
    edit_weights(tmp_path, edit)
    with pytest.raises(ValueError, match=message + ".*Refusing to fill the gaps with random weights"):
        load_model(tmp_path)


def test_weights_of_the_wrong_shape(tmp_path):
    make_model().save_pretrained(tmp_path)
    edit_weights(tmp_path, lambda w: w.update({"model.encoder.layers.0.fc1.bias": torch.zeros(5)}))
    with pytest.raises((ValueError, RuntimeError), match=r"model\.encoder\.layers\.0\.(fc1|feed_forward\.fc1)"):
        load_model(tmp_path)


def test_truncated_safetensors(tmp_path):
    make_model().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="cannot be read.*truncated or corrupt"):
        load_model(tmp_path)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(OSError, match="model.safetensors"):
        load_model(tmp_path)


def test_translate_command_refuses_a_checkpoint_with_missing_weights(tmp_path):
    make_model().save_pretrained(tmp_path)
    word_level_tokenizer(VOCAB).save_pretrained(tmp_path)
    edit_weights(tmp_path, lambda w: w.pop("model.encoder.layers.0.self_attn.q_proj.weight"))
    result = subprocess.run(
        [sys.executable, "-m", "hf_vanilla", "translate", str(tmp_path)],
        input="t5 t6\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "missing keys" in result.stderr
    assert not result.stdout.strip(), "nothing may be translated with random weights"
