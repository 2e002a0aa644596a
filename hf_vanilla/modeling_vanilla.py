# Copyright 2026 The hf_vanilla Authors. Licensed under the Apache License, Version 2.0.
"""The original Transformer (Vaswani et al. 2017, arXiv:1706.03762) as a transformers model.

Read top to bottom, the file follows the paper: positional encodings (§3.5), scaled dot-product and multi-head
attention (§3.2), the position-wise feed-forward network (§3.3), encoder and decoder layers with residual dropout
(§3.1, §5.4), the two stacks with scaled embeddings (§3.4), and the model heads.

This file is copied next to the weights for `trust_remote_code=True`, so it imports only torch, transformers and
`.configuration_vanilla`.
"""

import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla import VanillaTransformerConfig


logger = logging.get_logger(__name__)

# What `save_pretrained` writes into `config.auto_map`, so a saved folder loads through all three Auto classes with
# `trust_remote_code=True` (transformers itself records only the auto class of the object being saved).
REMOTE_CODE_AUTO_MAP = {
    "AutoConfig": "configuration_vanilla.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla.VanillaTransformerForConditionalGeneration",
}


# §6.1: "we used beam search with a beam size of 4 and length penalty α = 0.6": the generation config's defaults.
PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6}

# The generation config's length limit, as MarianMT's: a bare `generate()` or a Seq2SeqTrainer evaluation would
# otherwise get the library's silent 20. Where the project decodes (pipeline, translate, recipe) it passes the
# paper's tighter budget, source length + 50 (`pipeline_vanilla.decoding_budget`).
DEFAULT_MAX_LENGTH = 512

# transformers 5.24 renamed the cache that `generate()` hands every forward, and the output field that returns it,
# from `past_key_values` to `cache`; 5.23 and earlier use the old name. The installed library's output classes say
# which is current: our outputs use that field, and our forwards take the cache under either name.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(Seq2SeqLMOutput)} else "past_key_values"

# `create_causal_mask` took the cache as `past_key_values` (keyword-only on 5.5-5.8, fourth positional on 5.10-5.23)
# and takes it as `cache` from 5.24: it is passed by the name the installed function declares.
MASK_CACHE_PARAMETER = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"

# The keyword arguments a forward takes through `**kwargs`: the library's typed ones.
LIBRARY_KWARGS = TransformersKwargs.__required_keys__ | TransformersKwargs.__optional_keys__

# A keyword whose name says it carries a cache (`cache`, `past_key_values`, `kv_cache`, `layer_past`, ...).
# `cache_position`, which some releases still pass, names positions, and our positions come from the cache itself.
CACHE_LIKE_NAME = re.compile(r"(cache|past_key_values|past)$")


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: `[start, y_1, ..., y_{n-1}]` from labels `[y_1, ..., y_n]` (-100 -> pad)."""
    if pad_token_id is None or decoder_start_token_id is None:
        raise ValueError("`config.pad_token_id` and `config.decoder_start_token_id` must be set to shift labels.")
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


def take_past_key_values_as_cache(forward: Callable) -> Callable:
    """A forward taking `cache` also takes it as `past_key_values`, silently: the current name on releases before
    transformers 5.24, which pass it so."""

    @functools.wraps(forward)
    def forward_taking_either_name(*args, **kwargs):
        if "past_key_values" in kwargs:
            if kwargs.get("cache") is not None:
                raise ValueError("Pass the cache once: as `cache` or as `past_key_values`, not both.")
            kwargs["cache"] = kwargs.pop("past_key_values")
        return forward(*args, **kwargs)

    return forward_taking_either_name


# Each release's own convention for the old name: from 5.24 the library's deprecation warning, as its models give
# (`@deprecate_kwarg` on Marian's forwards); before it, the current name, taken silently.
accepts_past_key_values = (
    deprecate_kwarg("past_key_values", "5.40.0", new_name="cache", raise_if_both_names=True)
    if CACHE_FIELD == "cache"
    else take_past_key_values_as_cache
)


def known_kwargs(kwargs: dict, forward: Callable) -> dict:
    """The keyword arguments `forward` reads through `**kwargs`, the library's typed ones.

    A cache under any other name is an error: the model would decode without it and still return plausible text (a
    release that renames the cache again, a caller's typo). Any other unknown keyword is logged once and dropped, so
    that a model published today keeps working when a later transformers release passes one more argument."""
    unknown = sorted(set(kwargs) - LIBRARY_KWARGS)
    caches = [name for name in unknown if isinstance(kwargs[name], Cache) or CACHE_LIKE_NAME.search(name)]
    if caches:
        raise TypeError(
            f"{forward.__qualname__}() got a cache under a name it does not read: {caches}. It reads the cache as "
            "`cache` (or `past_key_values`). If transformers passed it, this model's code predates that transformers "
            "release: upgrade hf_vanilla, or install a transformers it was tested with (`hf-vanilla env`, the model "
            "card)."
        )
    if unknown:
        logger.warning_once(
            f"{forward.__qualname__}() ignores the keyword arguments {unknown}, which this model's code does not read "
            "(a transformers release newer than the model's code may pass them)."
        )
    return {name: value for name, value in kwargs.items() if name not in unknown}


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str, check_values: bool = True) -> None:
    """Fail early and clearly on ids an embedding cannot look up, instead of a cryptic index error. The range check
    (`check_values`) reads the ids back to the host, which on an accelerator waits for the device: it runs where ids
    come in from a caller (the source and the first decoder step of an inference forward or `generate` call), never in
    a training step or at a cached decoding step, whose ids the model chose."""
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer token ids, got dtype {input_ids.dtype}; cast with `.long()`.")
    if input_ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch_size, sequence_length), got {tuple(input_ids.shape)}.")
    if input_ids.numel() == 0:
        raise ValueError(f"`{name}` is empty (shape {tuple(input_ids.shape)}); pass at least one token per row.")
    if is_torchdynamo_compiling() or not check_values:
        return
    low, high = torch.stack(input_ids.aminmax()).tolist()  # one read back, not two
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` holds ids in [{low}, {high}], but the vocabulary is [0, {vocab_size - 1}]; the tokenizer "
            "and the model disagree (check `len(tokenizer)` against `config.vocab_size`, and the "
            "`decoder_start_token_id` given to `generate`)."
        )


def check_labels(labels: torch.Tensor, vocab_size: int, check_values: bool = True) -> None:
    """Labels are target ids or -100 (ignored); anything else would fail deep inside the loss. The range check reads
    the labels back to the host, so it runs outside training only (see `check_token_ids`)."""
    if labels.is_floating_point() or labels.dim() != 2:
        raise ValueError(
            f"`labels` must be integer ids of shape (batch_size, target_length), got {labels.dtype} "
            f"{tuple(labels.shape)}."
        )
    if is_torchdynamo_compiling() or not check_values:
        return
    invalid = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
    if invalid.any():
        raise ValueError(
            f"`labels` holds {labels[invalid][0].item()}, outside the target vocabulary [0, {vocab_size - 1}]; "
            "use -100 for positions the loss should ignore."
        )


def check_attention_mask(attention_mask: torch.Tensor | None, input_shape: torch.Size, name: str) -> None:
    """A 2D padding mask must line up with the ids it masks; 4D masks are the caller's business."""
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != input_shape:
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but the sequence it masks has shape "
            f"{tuple(input_shape)}; they must be equal."
        )


# §3.5 Positional Encoding


def sinusoidal_position_table(num_positions: int, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), computed in float64.

    `interleaved` places sin and cos in alternate features as the paper writes it; `concatenated` puts all sines
    first and all cosines after them, as Marian and fairseq do. Same frequencies, different feature order.
    """
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
    even_features = torch.arange(0, dim, 2, dtype=torch.float64)
    angles = positions / torch.pow(10000.0, even_features / dim)  # [num_positions, ceil(dim/2)]
    sines, cosines = torch.sin(angles), torch.cos(angles[:, : dim // 2])
    if layout == "concatenated":
        return torch.cat([sines, cosines], dim=-1)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = sines
    table[:, 1::2] = cosines
    return table


def position_range(past_length: torch.Tensor, seq_length: int) -> torch.Tensor:
    """Positions `past_length ... past_length + seq_length - 1` when a static cache counts its length in a 0-d
    tensor (so that `torch.compile` does not recompile at every step); the table was sized by `reserve`."""
    return past_length + torch.arange(seq_length, device=past_length.device)


class VanillaSinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoids (§3.5). The table is a non-persistent buffer: never saved, rebuilt by `_init_weights`."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.layout = config.sinusoid_layout
        table = sinusoidal_position_table(config.max_position_embeddings, config.d_model, self.layout)
        self.register_buffer("weight", table.to(torch.get_default_dtype()), persistent=False)

    def create_weight(self) -> torch.Tensor:
        num_positions, dim = self.weight.shape
        return sinusoidal_position_table(num_positions, dim, self.layout)

    def reserve(self, num_positions: int) -> None:
        """Extend the table to `num_positions` ahead of a static cache, which counts positions in a tensor."""
        if num_positions > self.weight.shape[0]:
            table = sinusoidal_position_table(num_positions, self.weight.shape[1], self.layout)
            self.weight = table.to(device=self.weight.device, dtype=self.weight.dtype)

    def forward(self, past_length: int | torch.Tensor, seq_length: int) -> torch.Tensor:
        """Encodings of positions `past_length ... past_length + seq_length - 1`, shape [seq_length, d_model]."""
        if isinstance(past_length, torch.Tensor):
            return self.weight[position_range(past_length, seq_length)]
        end = past_length + seq_length
        if end <= self.weight.shape[0]:
            return self.weight[past_length:end]
        # Longer than the precomputed table: sinusoids extrapolate, so compute them rather than cut the input.
        table = sinusoidal_position_table(end, self.weight.shape[1], self.layout)
        return table[past_length:end].to(device=self.weight.device, dtype=self.weight.dtype)


class VanillaLearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute positions (the paper's Table 3 row (E) alternative), limited to `max_position_embeddings`."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config.max_position_embeddings, config.d_model)

    def reserve(self, num_positions: int) -> None:
        """Refuse, before generation starts, a static cache longer than the learned table."""
        self._check_covers(num_positions, what="A static cache of this size")

    def _check_covers(self, num_positions: int, what: str) -> None:
        if num_positions > self.num_embeddings:
            raise ValueError(
                f"{what} needs positions up to {num_positions - 1}, but learned position embeddings cover only "
                f"{self.num_embeddings} (`config.max_position_embeddings`); shorten or split the input, or lower "
                "`max_length` / `max_new_tokens`."
            )

    def forward(self, past_length: int | torch.Tensor, seq_length: int) -> torch.Tensor:
        if isinstance(past_length, torch.Tensor):
            return self.weight[position_range(past_length, seq_length)]
        end = past_length + seq_length
        self._check_covers(end, what="Sequence")
        return self.weight[past_length:end]


POSITIONAL_EMBEDDINGS = {
    "sinusoidal": VanillaSinusoidalPositionalEmbedding,
    "learned": VanillaLearnedPositionalEmbedding,
}


# §3.2 Attention


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2.1 Scaled Dot-Product Attention: softmax(QKᵀ / sqrt(d_head) + mask) V.

    query [B, H, Tq, d_head], key/value [B, H, Tk, d_head], mask additive [B, 1, Tq, Tk] with finite minimums.
    Scores and softmax run in at least float32: in float16, "finite minimum + a negative score" overflows to -inf,
    and a fully masked row would then turn into NaN.
    """
    scores = torch.matmul(query, key.transpose(2, 3))
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1).to(value.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # [B, Tq, H, d_head]
    return output, weights


class VanillaInputProjection(nn.Linear):
    """A query, key or value projection: a plain linear layer that `_init_weights` draws with
    `config.qkv_init_gain` instead of Xavier's gain 1.

    A class rather than a set of names because the library calls `_init_weights(module)` with the module alone, not
    its name; the weights' names (`q_proj`, ...) and state dicts are those of `nn.Linear`."""


class VanillaAttention(nn.Module):
    """§3.2.2 Multi-Head Attention: h heads of d_head = d_model / h, concatenated and projected by W_O."""

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # 1/sqrt(d_head), not 1/sqrt(d_model)
        self.dropout = config.attention_dropout
        # SDPA falls back to `module.is_causal` when the mask is skipped, so every module states it explicitly.
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        self.q_proj = VanillaInputProjection(config.d_model, config.d_model)
        self.k_proj = VanillaInputProjection(config.d_model, config.d_model)
        self.v_proj = VanillaInputProjection(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        """[B, T, d_model] -> [B, H, T, d_head]"""
        return states.view(*states.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def project_key_value(
        self, key_value_states: torch.Tensor, cache: EncoderDecoderCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [B, H, Tk, d_head] of `key_value_states` [B, Tk, d_model], through the cache: for
        cross-attention, projected once per generation and then read back (the ONNX export computes them with the
        encoder)."""
        if self.is_cross_attention:
            layer_cache = cache.cross_attention_cache if cache is not None else None
            # The encoder output is fixed for a whole generation: project it once, then reuse it every step.
            if layer_cache is not None and cache.is_updated.get(self.layer_idx):
                return layer_cache.layers[self.layer_idx].keys, layer_cache.layers[self.layer_idx].values
        else:
            layer_cache = cache.self_attention_cache if cache is not None else None
        key = self._split_heads(self.k_proj(key_value_states))
        value = self._split_heads(self.v_proj(key_value_states))
        if layer_cache is not None:
            key, value = layer_cache.update(key, value, self.layer_idx)
            if self.is_cross_attention:
                cache.is_updated[self.layer_idx] = True
        return key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states [B, Tq, d_model] attends over key_value_states [B, Tk, d_model] (itself if None)."""
        query = self._split_heads(self.q_proj(hidden_states))
        key_value_states = key_value_states if self.is_cross_attention else hidden_states
        key, value = self.project_key_value(key_value_states, cache)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()  # concat heads
        return self.out_proj(attn_output), attn_weights


# §3.3 Position-wise Feed-Forward Networks


class VanillaFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately (activation configurable)."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


# §3.1 Encoder and Decoder Stacks, with §5.4 Residual Dropout


class VanillaResidualLayer(GradientCheckpointingLayer):
    """Shared wiring of encoder and decoder layers: each sub-layer sits in a residual block with a LayerNorm."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.dropout = config.dropout
        self.normalize_before = config.normalize_before

    def residual_block(
        self,
        hidden_states: torch.Tensor,
        layer_norm: nn.LayerNorm,
        sublayer: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Post-LN (paper): LN(x + Dropout(Sublayer(x))). Pre-LN: x + Dropout(Sublayer(LN(x)))."""
        sublayer_input = layer_norm(hidden_states) if self.normalize_before else hidden_states
        output = sublayer(sublayer_input)
        hidden_states = hidden_states + nn.functional.dropout(output, p=self.dropout, training=self.training)
        return hidden_states if self.normalize_before else layer_norm(hidden_states)


class VanillaEncoderLayer(VanillaResidualLayer):
    """Encoder layer: self-attention, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None):
        super().__init__(config)
        self.self_attn = VanillaAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = VanillaFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        hidden_states = self.residual_block(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0],
        )
        return self.residual_block(hidden_states, self.final_layer_norm, self.feed_forward)


class VanillaDecoderLayer(VanillaResidualLayer):
    """Decoder layer: masked self-attention, attention over the encoder output, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.self_attn = VanillaAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = VanillaFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        hidden_states = self.residual_block(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0],
        )
        hidden_states = self.residual_block(
            hidden_states,
            self.encoder_attn_layer_norm,
            lambda x: self.encoder_attn(
                x,
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )[0],
        )
        return self.residual_block(hidden_states, self.final_layer_norm, self.feed_forward)


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """Weight init, tying and the library switches shared by every hf_vanilla model."""

    config_class = VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaEncoderLayer", "VanillaDecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]  # the cache argument, either name
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def save_pretrained(self, save_directory: str, *args, **kwargs) -> None:
        # Every folder (Trainer checkpoints included) loads and translates with trust_remote_code=True where
        # hf_vanilla is not installed: the library copies this file and its relative imports (the config and the
        # pipeline), `auto_map` points the Auto classes at them and the config lists the pipeline (its `to_dict`).
        # Both model classes are named whichever is saved, as the library's own `register_for_auto_class` would
        # name only the saved one.
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **REMOTE_CODE_AUTO_MAP}
        super().save_pretrained(save_directory, *args, **kwargs)

    def _resize_token_embeddings(
        self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        # The library's version also resizes an untied output layer, which with separate vocabularies belongs to the
        # target side: here the source embeddings change, and the whole target side with them when they are shared.
        embeddings = self._get_resized_embeddings(
            self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        self.set_input_embeddings(embeddings)
        if self.config.share_encoder_decoder_embeddings:
            self._target_vocabulary_resized(embeddings.num_embeddings, mean_resizing)
        return embeddings

    def resize_decoder_token_embeddings(
        self, new_num_tokens: int, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize a separate target vocabulary: decoder embeddings, output layer and logits bias (as MarianMT's).
        With shared embeddings `resize_token_embeddings` resizes both sides."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "`resize_decoder_token_embeddings` resizes a separate target vocabulary, but this model shares its "
                "embeddings (`share_encoder_decoder_embeddings=True`): call `resize_token_embeddings` instead."
            )
        decoder = self.get_decoder()
        decoder.embed_tokens = self._get_resized_embeddings(
            decoder.embed_tokens, new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        self._target_vocabulary_resized(decoder.embed_tokens.num_embeddings, mean_resizing)
        self.tie_weights()
        return decoder.embed_tokens

    def _target_vocabulary_resized(self, size: int, mean_resizing: bool) -> None:
        """Bring what depends on the target vocabulary to `size` entries (the generation head adds its layers)."""
        self.config.decoder_vocab_size = size

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # transformers gates every tie on `config.tie_word_embeddings`; ours are two independent switches
        # (share source/target embeddings, tie the output projection), so each class lists exactly the ties its
        # config asks for in `_tied_weights_keys`, built in `__init__`.
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys or {})

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform for every projection, with `config.qkv_init_gain` for queries, keys and values (the paper
        leaves initialisation open; see the config); N(0, d_model^-0.5) for embeddings (and an untied output layer).
        """
        embedding_std = self.config.init_std or self.config.d_model**-0.5
        output_layer = getattr(self, "lm_head", None)
        if isinstance(module, nn.Linear) and module is not output_layer:
            gain = self.config.qkv_init_gain if isinstance(module, VanillaInputProjection) else 1.0
            init.xavier_uniform_(module.weight, gain=gain)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VanillaSinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight())
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=embedding_std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, VanillaTransformerForConditionalGeneration):
            if not self.config.tie_word_embeddings:
                init.normal_(module.lm_head.weight, mean=0.0, std=embedding_std)
            if module.final_logits_bias is not None:
                init.zeros_(module.final_logits_bias)


class VanillaStack(VanillaTransformerPreTrainedModel):
    """What both stacks share: token embeddings scaled by sqrt(d_model) (§3.4) plus positions (§3.5), dropped out."""

    def __init__(self, config: VanillaTransformerConfig, vocab_size: int, layer_class: type, num_layers: int):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = POSITIONAL_EMBEDDINGS[config.position_embedding_type](config)
        self.layers = nn.ModuleList([layer_class(config, layer_idx) for layer_idx in range(num_layers)])
        # Pre-LN leaves the last residual sum un-normalised, so each stack ends with its own LayerNorm.
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.post_init()

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int, name: str
    ) -> torch.Tensor:
        """dropout(token embeddings * sqrt(d_model) + positions) [B, T, d] of `input_ids` or `inputs_embeds`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of `{name}` and its `inputs_embeds`.")
        if inputs_embeds is None:
            # Values are read on the host only for a caller's ids (see `check_token_ids`): not in training, where
            # the trainer checked the tokenizer against the model and a read would stall an accelerator every step.
            first_step = isinstance(past_length, int) and past_length == 0
            check_values = first_step and not self.training
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, name, check_values=check_values)
            inputs_embeds = self.embed_tokens(input_ids)
        # Scaling after the branch keeps `inputs_embeds=get_input_embeddings()(ids)` identical to `input_ids=ids`.
        positions = self.embed_positions(past_length, inputs_embeds.shape[1])
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        return nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

    def final_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden_states) if self.layer_norm is not None else hidden_states


class VanillaEncoder(VanillaStack):
    """§3.1 Encoder: N layers of self-attention and feed-forward over the embedded source."""

    _can_record_outputs = {"hidden_states": VanillaEncoderLayer, "attentions": VanillaAttention}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config, config.vocab_size, VanillaEncoderLayer, config.encoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        """input_ids [B, S] (1 = token, 0 = padding in attention_mask [B, S]) -> last_hidden_state [B, S, d]."""
        hidden_states = self.embed(input_ids, inputs_embeds, past_length=0, name="input_ids")
        check_attention_mask(attention_mask, hidden_states.shape[:2], "attention_mask")
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.final_norm(hidden_states))


class VanillaDecoder(VanillaStack):
    """§3.1 Decoder: N layers of masked self-attention, encoder-decoder attention and feed-forward."""

    _can_record_outputs = {
        "hidden_states": VanillaDecoderLayer,
        "attentions": OutputRecorder(VanillaAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config, config.decoder_vocab_size, VanillaDecoderLayer, config.decoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids [B, T] attend causally to themselves and to encoder_hidden_states [B, S, d]; with `cache` (or,
        as transformers < 5.24 names it, `past_key_values`), input_ids are only the new ones."""
        kwargs = known_kwargs(kwargs, VanillaDecoder.forward)
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends over the source: pass `encoder_hidden_states` [batch, src_len, d].")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        if cache is not None and cache.is_compileable:  # a static cache, sized ahead
            self.embed_positions.reserve(cache.self_attention_cache.get_max_length())
        hidden_states = self.embed(input_ids, inputs_embeds, past_length=past_length, name="decoder_input_ids")
        check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask")
        if attention_mask is not None and not is_torchdynamo_compiling():
            batch_size, new_length = hidden_states.shape[:2]
            total_length = int(past_length) + new_length  # a static cache's length is a tensor
            check_attention_mask(attention_mask, (batch_size, total_length), "decoder_attention_mask")

        # The mask builders read only the shape, dtype and device of `inputs_embeds`.
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            **{MASK_CACHE_PARAMETER: cache.self_attention_cache if cache is not None else None},
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so gradient checkpointing sees it
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=self.final_norm(hidden_states), **{CACHE_FIELD: cache}
        )


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The bare encoder-decoder, returning the decoder's last hidden states."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.encoder = VanillaEncoder(config)
        self.decoder = VanillaDecoder(config)
        self._tied_weights_keys = (
            {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}
            if config.share_encoder_decoder_embeddings
            else {}
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.decoder.embed_tokens = value

    @can_return_tuple
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`): source token ids.
        attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`): 1 for tokens, 0 for padding.
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, starting with
            `config.decoder_start_token_id`. With `cache`, only the new ones.
        decoder_attention_mask (`torch.Tensor` of shape `(batch_size, past + target_length)`): target padding.
        encoder_outputs: precomputed encoder output (as `generate` passes it), skipping the encoder.
        cache (`EncoderDecoderCache`): the keys and values of the earlier decoder steps, which the output returns
            updated; `past_key_values` is the same, under the name transformers < 5.24 gives it.
        """
        kwargs = known_kwargs(kwargs, VanillaTransformerModel.forward)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# §5.4 Label Smoothing: the training loss


def label_smoothed_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Sum over the labelled positions of (1 - ε) · (-log p(y)) + ε · mean over the vocabulary of (-log p).

    logits [N, V] (computed in float32), labels [N] with -100 where ignored. With ε = 0 this is the cross entropy;
    with ε > 0 it is the Trainer's `LabelSmoother`: the target mixes the one-hot label with a uniform distribution.
    """
    return smoothed_nll_sum_from_log_probs(logits.float().log_softmax(dim=-1), labels, smoothing)


def smoothed_nll_sum_from_log_probs(log_probs: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    nll = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    per_token = nll if smoothing == 0 else (1 - smoothing) * nll - smoothing * log_probs.mean(dim=-1)
    return per_token.masked_fill(labels == -100, 0.0).sum()


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """`label_smoothed_cross_entropy_sum(hidden @ weightᵀ + bias, labels)` a chunk of rows at a time, never holding
    the [N, V] logits: each chunk's loss and its gradient, softmax - target distribution, are computed in the
    forward pass and folded into the gradients of `hidden` and `weight` at once (the logits of a whole batch are
    N x V floats, 4096 x 32k = 0.5 GB, and most of a small model's training step goes to writing and reading them).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, smoothing, chunk_size):
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if needs_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs_grad else None
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk_size):
            rows, chunk_labels = hidden[start : start + chunk_size], labels[start : start + chunk_size]
            logits = torch.matmul(rows, weight.t()).float()
            if bias is not None:
                logits = logits + bias.float()
            log_probs = logits.log_softmax(dim=-1)
            total += smoothed_nll_sum_from_log_probs(log_probs, chunk_labels, smoothing)
            if needs_grad:
                # d loss / d logits = softmax - ((1 - ε) one_hot(y) + ε / V), zero on unlabelled rows.
                grad_logits = log_probs.exp_().sub_(smoothing / logits.shape[-1])
                target = chunk_labels.clamp(min=0).unsqueeze(-1)
                grad_logits.scatter_add_(-1, target, torch.full(target.shape, smoothing - 1.0, device=target.device))
                grad_logits = grad_logits.mul_((chunk_labels != -100).unsqueeze(-1)).to(hidden.dtype)
                grad_hidden[start : start + chunk_size] = torch.matmul(grad_logits, weight)
                grad_weight += torch.matmul(grad_logits.t(), rows).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, (grad_weight * grad_total).to(ctx.weight_dtype), None, None, None, None


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The encoder-decoder with the pre-softmax linear projection to target-vocabulary logits (§3.4)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=False)
        # A buffer, as in MarianMT: converted checkpoints carry it, training leaves it alone.
        bias = torch.zeros(1, config.decoder_vocab_size) if config.add_final_logits_bias else None
        self.register_buffer("final_logits_bias", bias)
        tied_to = "model.encoder" if config.share_encoder_decoder_embeddings else "model.decoder"
        self._tied_weights_keys = (
            {"lm_head.weight": f"{tied_to}.embed_tokens.weight"} if config.tie_word_embeddings else {}
        )
        self.post_init()
        self.generation_config.update(**PAPER_DECODING, max_length=DEFAULT_MAX_LENGTH)

    def _target_vocabulary_resized(self, size: int, mean_resizing: bool) -> None:
        super()._target_vocabulary_resized(size, mean_resizing)
        if not self.config.tie_word_embeddings:  # a tied head follows the embeddings in `tie_weights`
            self.lm_head = self._get_resized_lm_head(self.lm_head, size, mean_resizing=mean_resizing)
        if self.final_logits_bias is not None:  # new entries start at 0, as MarianMT's
            bias = self.final_logits_bias.new_zeros(1, size)
            kept = min(size, self.final_logits_bias.shape[-1])
            bias[:, :kept] = self.final_logits_bias[:, :kept]
            self.final_logits_bias = bias

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The pre-softmax linear projection: [B, T, d_model] -> [B, T, target vocabulary]."""
        logits = self.lm_head(hidden_states)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias.to(logits.dtype)
        return logits

    def translation_loss(
        self,
        hidden_states: torch.Tensor,
        logits: torch.Tensor | None,
        labels: torch.Tensor,
        num_items_in_batch: torch.Tensor | int | None,
        label_smoothing: float,
        loss_chunk_size: int | None,
    ) -> torch.Tensor:
        """Cross entropy summed over the labelled positions (label-smoothed by `label_smoothing`), divided by
        `num_items_in_batch` when the Trainer passes it (exact under gradient accumulation), else by their count.
        Labels are aligned with the decoder positions already: the decoder inputs are the labels shifted right.
        Without `logits`, computed from `hidden_states` `loss_chunk_size` positions at a time."""
        if logits is not None:
            total = label_smoothed_cross_entropy_sum(logits.flatten(0, 1), labels.flatten(), label_smoothing)
        else:
            bias = self.final_logits_bias[0] if self.final_logits_bias is not None else None
            total = ChunkedLinearCrossEntropy.apply(
                hidden_states.flatten(0, 1),
                self.lm_head.weight,
                bias,
                labels.flatten(),
                label_smoothing,
                loss_chunk_size,
            )
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum()
        elif isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by `DataCollatorForSeq2Seq(model=...)` to build teacher-forcing inputs."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, -100 where ignored. Without
            `decoder_input_ids`, they are shifted right to make them. The loss is the token-level cross entropy,
            summed and divided by `num_items_in_batch` when the Trainer passes it (exact under gradient
            accumulation), else averaged over the labelled tokens: MarianMT's contract.

        Two loss options come through `kwargs`, as the Trainer's `num_items_in_batch` does, for this call only:
        - `label_smoothing` (`float`, default 0): ε of §5.4, the target mixing the one-hot label with a uniform
          distribution (the Trainer's `LabelSmoother`);
        - `loss_chunk_size` (`int`, default None): compute the loss that many target positions at a time without the
          [batch, length, vocab] logits, which are then returned as `None`.
        They belong to the call, not the model, so a saved model never carries them; our trainer passes them. The
        loss is computed here, inside the wrapped model's forward, because under DDP and FSDP only there are the
        output layer's weights whole and their gradients synchronised. They are not named parameters: the Trainer
        takes every forward parameter whose name holds "label" for a label column (`find_labels`), and would then
        skip the loss of every batch that lacks one.
        """
        label_smoothing = kwargs.pop("label_smoothing", 0.0)
        loss_chunk_size = kwargs.pop("loss_chunk_size", None)
        if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1), got {label_smoothing!r}.")
        if loss_chunk_size is not None and (isinstance(loss_chunk_size, bool) or loss_chunk_size <= 0):
            raise ValueError(f"`loss_chunk_size` must be a positive integer or None, got {loss_chunk_size!r}.")
        kwargs = known_kwargs(kwargs, VanillaTransformerForConditionalGeneration.forward)
        if labels is not None:
            check_labels(labels, self.config.decoder_vocab_size, check_values=not self.training)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        skip_logits = labels is not None and loss_chunk_size is not None
        logits = None if skip_logits else self.output_logits(hidden_states)
        loss = None
        if labels is not None:
            loss = self.translation_loss(
                hidden_states, logits, labels, kwargs.get("num_items_in_batch"), label_smoothing, loss_chunk_size
            )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VanillaDecoder",
    "VanillaEncoder",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
