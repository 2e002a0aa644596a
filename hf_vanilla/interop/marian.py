"""Import MarianMT / OPUS-MT checkpoints: the same architecture with concatenated sinusoids, usually swish, a final
logits bias and pad as the decoder start token. The weights are renamed, never changed."""

import re
import shutil
from pathlib import Path

from transformers import GenerationConfig, MarianMTModel

from ..configuration_vanilla import VanillaTransformerConfig
from ..loading import load_state_dict_strictly
from ..modeling_vanilla import VanillaTransformerForConditionalGeneration


# Files of a Marian folder that are not weights or config: the tokenizer (SentencePiece models and vocabularies).
TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
)


def vanilla_config_from_marian(marian_config) -> VanillaTransformerConfig:
    """The variant fields that make our class compute exactly what `MarianMTModel` computes."""
    if marian_config.encoder_layerdrop or marian_config.decoder_layerdrop:
        raise ValueError("LayerDrop is not part of this architecture; the checkpoint cannot be converted exactly.")
    return VanillaTransformerConfig(
        vocab_size=marian_config.vocab_size,
        decoder_vocab_size=marian_config.decoder_vocab_size,
        d_model=marian_config.d_model,
        encoder_layers=marian_config.encoder_layers,
        decoder_layers=marian_config.decoder_layers,
        encoder_attention_heads=marian_config.encoder_attention_heads,
        decoder_attention_heads=marian_config.decoder_attention_heads,
        encoder_ffn_dim=marian_config.encoder_ffn_dim,
        decoder_ffn_dim=marian_config.decoder_ffn_dim,
        dropout=marian_config.dropout,
        attention_dropout=marian_config.attention_dropout,
        activation_dropout=marian_config.activation_dropout,
        activation_function=marian_config.activation_function,
        scale_embedding=marian_config.scale_embedding,
        share_encoder_decoder_embeddings=marian_config.share_encoder_decoder_embeddings,
        tie_word_embeddings=marian_config.tie_word_embeddings,
        max_position_embeddings=marian_config.max_position_embeddings,
        normalize_before=False,
        position_embedding_type="sinusoidal",
        sinusoid_layout="concatenated",
        add_final_logits_bias=True,
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        unk_token_id=None,
        decoder_start_token_id=marian_config.decoder_start_token_id,
    )


def rename_marian_weight(name: str) -> str | None:
    """Our parameter name for a Marian one, or None for what we do not store (the fixed position tables)."""
    if name.endswith("embed_positions.weight"):
        return None
    if name == "model.shared.weight":
        return "model.encoder.embed_tokens.weight"
    return re.sub(r"\.(fc[12])\.", r".feed_forward.\1.", name)


def convert_marian(marian: MarianMTModel | str | Path) -> VanillaTransformerForConditionalGeneration:
    """A `VanillaTransformerForConditionalGeneration` with the weights of a `MarianMTModel` (object or folder)."""
    if not isinstance(marian, MarianMTModel):
        marian = MarianMTModel.from_pretrained(marian)
    config = vanilla_config_from_marian(marian.config)
    config._attn_implementation = marian.config._attn_implementation
    model = VanillaTransformerForConditionalGeneration(config).to(marian.dtype)
    renamed = {}
    for name, tensor in marian.state_dict().items():
        target = rename_marian_weight(name)
        if target is not None:
            renamed[target] = tensor
    load_state_dict_strictly(model, renamed, source="the renamed MarianMT weights")
    model.generation_config = GenerationConfig.from_dict(marian.generation_config.to_dict())
    return model.eval()


def convert_marian_folder(source: str | Path, output: str | Path) -> VanillaTransformerForConditionalGeneration:
    """Convert a saved Marian folder, keeping its tokenizer files so the result translates with the pipeline."""
    model = convert_marian(source)
    model.save_pretrained(output)
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, Path(output) / name)
    return model
