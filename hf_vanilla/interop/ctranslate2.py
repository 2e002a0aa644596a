"""Export to CTranslate2, the fast C++ inference engine, through its public model-spec API.

CTranslate2 converts built-in transformers models only; this fills its `TransformerSpec` from our modules, the
same way its own BART/Marian loader does. Needs `pip install ctranslate2`.
"""

import math
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..modeling_vanilla import sinusoidal_position_table
from .positions import position_limit


ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH", "silu": "SWISH", "gelu_new": "GELUTanh"}


def _copy(tensor):
    # CTranslate2 quantizes the arrays it is given in place: hand it copies, never the live model's weights.
    return tensor.detach().cpu().clone()


def _linear(spec, module, bias=None) -> None:
    spec.weight = _copy(module.weight)
    if module.bias is not None or bias is not None:
        spec.bias = _copy(module.bias if bias is None else bias)


def _layer_norm(spec, module) -> None:
    spec.gamma, spec.beta = _copy(module.weight), _copy(module.bias)


def _attention(spec, attention, fuse_linear, common_spec, self_attention: bool) -> None:
    q, k, v = (common_spec.LinearSpec() for _ in range(3))
    for part, module in ((q, attention.q_proj), (k, attention.k_proj), (v, attention.v_proj)):
        _linear(part, module)
    if self_attention:
        fuse_linear(spec.linear[0], [q, k, v])
    else:  # cross attention: queries from the decoder, keys and values from the encoder output
        fuse_linear(spec.linear[0], [q])
        fuse_linear(spec.linear[1], [k, v])
    _linear(spec.linear[-1], attention.out_proj)


def _stack(spec, stack, config, fuse_linear, common_spec, is_decoder: bool) -> None:
    spec.scale_embeddings = math.sqrt(config.d_model) if config.scale_embedding else 1.0
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _copy(stack.embed_tokens.weight)
    if config.position_embedding_type == "sinusoidal":
        table = sinusoidal_position_table(position_limit(config), config.d_model, config.sinusoid_layout)
        spec.position_encodings.encodings = table.to(stack.embed_tokens.weight.dtype)
    else:
        spec.position_encodings.encodings = _copy(stack.embed_positions.weight)
    if stack.layer_norm is not None:
        _layer_norm(spec.layer_norm, stack.layer_norm)
    for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
        _attention(layer_spec.self_attention, layer.self_attn, fuse_linear, common_spec, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        if is_decoder:
            _attention(layer_spec.attention, layer.encoder_attn, fuse_linear, common_spec, self_attention=False)
            _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
        _linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
        _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)


def build_ctranslate2_spec(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
    """A `ctranslate2.specs.TransformerSpec` holding the model's weights and the tokenizer's vocabulary."""
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    if config.encoder_attention_heads != config.decoder_attention_heads:
        raise ValueError("CTranslate2 needs the same number of attention heads in encoder and decoder.")
    if config.encoder_layers == 0 or config.decoder_layers == 0:
        raise ValueError("CTranslate2 needs at least one encoder and one decoder layer.")
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.encoder_attention_heads,
        pre_norm=config.normalize_before,
        activation=getattr(common_spec.Activation, ACTIVATIONS[config.activation_function]),
    )
    _stack(spec.encoder, model.model.encoder, config, fuse_linear, common_spec, is_decoder=False)
    _stack(spec.decoder, model.model.decoder, config, fuse_linear, common_spec, is_decoder=True)
    bias = model.final_logits_bias.squeeze(0) if model.final_logits_bias is not None else None
    _linear(spec.decoder.projection, model.lm_head, bias=bias)

    source_tokens = tokenizer.convert_ids_to_tokens(list(range(config.vocab_size)))
    target_tokens = tokenizer.convert_ids_to_tokens(list(range(config.decoder_vocab_size)))
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.config.bos_token = tokenizer.bos_token
    spec.config.eos_token = tokenizer.eos_token
    spec.config.unk_token = tokenizer.unk_token
    spec.config.decoder_start_token = target_tokens[config.decoder_start_token_id]
    return spec


def export_ctranslate2(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    quantization: str | None = None,
    force: bool = False,
) -> str:
    """Write a CTranslate2 model folder (`quantization`: None or float32 for the exact export, or int8,
    int8_float32, float16, ...)."""
    import ctranslate2

    class VanillaConverter(ctranslate2.converters.Converter):
        def _load(self):
            return build_ctranslate2_spec(model, tokenizer)

    return VanillaConverter().convert(str(output_dir), quantization=quantization, force=force)
