"""The config: paper defaults, presets, serialisation and the errors that guard it (`@strict`'s, as every transformers
config raises, each carrying our message that names the field)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub.errors import StrictDataclassError
from transformers.pipelines import PIPELINE_REGISTRY

from hf_vanilla import VanillaTransformerConfig

from .conftest import make_model


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_are_transformer_base():
    config = VanillaTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (8, 8)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (2048, 2048)
    assert config.dropout == 0.1 and config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.activation_function == "relu" and config.scale_embedding
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert not config.normalize_before and not config.add_final_logits_bias
    assert (config.position_embedding_type, config.sinusoid_layout) == ("sinusoidal", "interleaved")
    assert config.decoder_vocab_size == config.vocab_size
    assert config.hidden_size == 512 and config.num_attention_heads == 8 and config.num_hidden_layers == 6


@pytest.mark.parametrize(
    "preset, expected",
    [
        ("base", (512, 6, 8, 2048, 0.1)),
        ("big", (1024, 6, 16, 4096, 0.3)),
        ("tiny", (128, 4, 4, 256, 0.3)),
    ],
)
def test_presets(preset, expected):
    config = VanillaTransformerConfig.from_json_file(CONFIGS / f"{preset}.json")
    got = (config.d_model, config.encoder_layers, config.encoder_attention_heads, config.encoder_ffn_dim)
    assert got + (config.dropout,) == expected
    assert (config.decoder_layers, config.decoder_attention_heads, config.decoder_ffn_dim) == expected[1:4]


def test_round_trip(tmp_path):
    config = VanillaTransformerConfig(
        vocab_size=100, normalize_before=True, position_embedding_type="learned", sinusoid_layout="concatenated"
    )
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "vanilla_transformer"
    reloaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert reloaded.to_dict() == config.to_dict()


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=30), "d_model"),
        (dict(decoder_attention_heads=5), "decoder_attention_heads"),
        (dict(d_model=0), "d_model"),
        (dict(encoder_layers=-1), "encoder_layers"),
        (dict(decoder_ffn_dim=0), "decoder_ffn_dim"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(max_position_embeddings=0), "max_position_embeddings"),
        (dict(dropout=1.0), "dropout"),
        (dict(attention_dropout=-0.1), "attention_dropout"),
        (dict(activation_dropout=1.5), "activation_dropout"),
        (dict(activation_function="tanh-ish"), "activation_function"),
        (dict(position_embedding_type="rotary"), "position_embedding_type"),
        (dict(sinusoid_layout="shuffled"), "sinusoid_layout"),
        (dict(vocab_size=10, pad_token_id=10), "pad_token_id"),
        (dict(vocab_size=10, eos_token_id=-1), "eos_token_id"),
        (dict(vocab_size=10, decoder_start_token_id=12), "decoder_start_token_id"),
        (dict(vocab_size=10, decoder_vocab_size=8), "share_encoder_decoder_embeddings"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps"),
        (dict(source_language="en"), "target_language"),
        (dict(source_language="en_US", target_language="de"), "source_language"),
    ],
)
def test_invalid_config_names_the_field(overrides, field):
    with pytest.raises(StrictDataclassError, match=field):
        VanillaTransformerConfig(**overrides)


def test_allowed_values_are_listed():
    with pytest.raises(StrictDataclassError, match=r"\['sinusoidal', 'learned'\]"):
        VanillaTransformerConfig(position_embedding_type="rope")


def test_separate_vocabularies_validate_against_the_smaller():
    config = VanillaTransformerConfig(vocab_size=100, decoder_vocab_size=50, share_encoder_decoder_embeddings=False)
    assert config.decoder_vocab_size == 50
    with pytest.raises(StrictDataclassError, match="eos_token_id"):
        VanillaTransformerConfig(
            vocab_size=100, decoder_vocab_size=50, share_encoder_decoder_embeddings=False, eos_token_id=60
        )


def test_save_validates_a_config_edited_after_construction(tmp_path):
    config = VanillaTransformerConfig()
    config.dropout = 2.0
    with pytest.raises(StrictDataclassError, match="dropout"):
        config.save_pretrained(tmp_path)


SAVE_ALONE = """
import sys
from tests.conftest import make_model
make_model(seed=0, source_language=sys.argv[1], target_language=sys.argv[2]).save_pretrained(sys.argv[3])
"""


def saved_config(model, folder: Path) -> dict:
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def test_two_language_pairs_in_one_process_each_save_the_json_they_save_alone(tmp_path):
    aliases, supported = dict(PIPELINE_REGISTRY.task_aliases), dict(PIPELINE_REGISTRY.supported_tasks)
    english_german = make_model(seed=0, source_language="en", target_language="de")
    first = saved_config(english_german, tmp_path / "en-de")
    french_english = make_model(seed=0, source_language="fr", target_language="en")
    assert saved_config(french_english, tmp_path / "fr-en")["custom_pipelines"].keys() == {
        "translation",
        "translation_fr_to_en",
    }
    assert saved_config(english_german, tmp_path / "en-de-again") == first
    assert first["custom_pipelines"].keys() == {"translation", "translation_en_to_de"}
    assert (dict(PIPELINE_REGISTRY.task_aliases), dict(PIPELINE_REGISTRY.supported_tasks)) == (aliases, supported)

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-c", SAVE_ALONE, "en", "de", str(tmp_path / "alone")], cwd=root, check=True, timeout=300
    )
    alone = json.loads((tmp_path / "alone" / "config.json").read_text())
    assert alone == first
