# Copyright 2026 The hf_vanilla Authors. Licensed under the Apache License, Version 2.0.
"""Configuration of the original Transformer (Vaswani et al. 2017, "Attention Is All You Need")."""

import transformers
from packaging.version import Version


# The oldest transformers release that this file and the two beside it (the model, the pipeline) run on, as remote
# code copied into every saved folder: `benchmarks/transformers_releases.py` checks each 5.x release from here to the
# newest (docs/results/transformers-releases-cpu.json). Older releases fail in the library with errors that do not
# say why, so the config, the first file a load runs, stops at once.
TRANSFORMERS_FLOOR = "5.10"
if Version(transformers.__version__).release < Version(TRANSFORMERS_FLOOR).release:
    raise ImportError(
        f"This hf_vanilla model needs transformers >= {TRANSFORMERS_FLOOR}, and transformers "
        f"{transformers.__version__} is installed: pip install -U 'transformers>={TRANSFORMERS_FLOOR}'"
    )

from huggingface_hub.dataclasses import strict  # noqa: E402
from transformers import PreTrainedConfig  # noqa: E402

from .pipeline_vanilla import CUSTOM_PIPELINES  # noqa: E402


# True for the installed package's class, whose import registered the translation pipeline (hf_vanilla/__init__.py);
# False for the copy of this file that `save_pretrained` writes beside the weights, loaded as remote code.
SERVED_BY_THE_PACKAGE = __name__.split(".")[0] == "hf_vanilla"

LEGACY_TRAINING_FIELDS = ("label_smoothing", "loss_chunk_size")

# The allowed values of the choice fields. Their annotations stay `str`: `@strict` checks a `Literal` before any
# validator runs, with a message that would replace ours ("`sinusoid_layout` must be one of [...]", which the
# command line and the tests show).
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")
ACTIVATION_FUNCTIONS = ("relu", "gelu", "swish", "silu", "gelu_new")

_POSITIVE_INT_FIELDS = (
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
)
_PROBABILITY_FIELDS = ("dropout", "attention_dropout", "activation_dropout")
_SPECIAL_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "unk_token_id")


def _is_positive_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""
    Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    Every field is a symbol of the paper and defaults to Transformer-base (§3, Table 3). The variant fields
    (`normalize_before`, `position_embedding_type`, `sinusoid_layout`, `activation_function`,
    `add_final_logits_bias`, the two sharing switches) default to the paper and exist so that one class can host
    checkpoints from MarianMT / OPUS-MT and fairseq.

    Args:
        vocab_size: size of the (joint) source vocabulary, and of the target vocabulary unless
            `decoder_vocab_size` is set.
        decoder_vocab_size: size of the target vocabulary; `None` means the same as `vocab_size`. Must equal
            `vocab_size` when `share_encoder_decoder_embeddings` is on.
        d_model: width of every sub-layer output (d_model in the paper).
        encoder_layers / decoder_layers: N, the number of identical layers per stack.
        encoder_attention_heads / decoder_attention_heads: h; d_head = d_model / h.
        encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner width of the position-wise feed-forward network.
        dropout: P_drop, applied to each sub-layer output before the residual add and to the embedding sums.
        attention_dropout: dropout on the attention probabilities (0 in the paper).
        activation_dropout: dropout after the FFN activation (0 in the paper).
        activation_function: FFN non-linearity, one of `ACTIVATION_FUNCTIONS` (`relu` in the paper).
        scale_embedding: multiply token embeddings by sqrt(d_model) (§3.4).
        share_encoder_decoder_embeddings: one embedding matrix for source and target tokens (§3.4).
        tie_word_embeddings: the pre-softmax projection shares the target embedding matrix (§3.4).
        max_position_embeddings: the longest sequence a `learned` position table covers. Sinusoids are computed
            for any length, so for them this only sizes the precomputed table, which grows on demand.
        layer_norm_eps: epsilon of every LayerNorm (PyTorch's default; the paper gives none).
        init_std: standard deviation of the token-embedding init; `None` means d_model**-0.5.
        qkv_init_gain: gain of the Xavier-uniform init of the query, key and value projections. The paper leaves
            initialisation open; the default 1/sqrt(2) is what `torch.nn.MultiheadAttention` (Xavier over its
            packed [3d, d] input projection) and fairseq's `MultiheadAttention` use. With plain Xavier (1.0) the
            post-LN recipe falls into source neglect on some seeds (see the README); every other projection keeps
            gain 1.
        normalize_before: pre-LN residual blocks `x + Dropout(Sublayer(LN(x)))` plus a final LayerNorm per stack
            (the paper is post-LN: `LN(x + Dropout(Sublayer(x)))`).
        position_embedding_type: `sinusoidal` (§3.5) or `learned`.
        sinusoid_layout: `interleaved` (paper: sin on even, cos on odd features) or `concatenated`
            (Marian/fairseq: all sines, then all cosines).
        add_final_logits_bias: add a (non-trained) bias buffer to the logits, as MarianMT checkpoints carry.
        source_language / target_language: the language codes the model translates between (`en`, `de`), set by
            the training recipe; with them `pipeline("translation_en_to_de", ...)` finds the model. Both or neither.

    Invalid values raise when the config is built or saved, through `@strict` as every transformers config: each
    `validate_*` method below is one group of checks, and the message names the field and what it accepts.
    """

    model_type = "vanilla_transformer"
    # What `Trainer.prediction_step` leaves out of the logits it gathers: the cache, under its name since transformers
    # 5.24 and the one before.
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    decoder_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    scale_embedding: bool = True
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 1024
    layer_norm_eps: float | int = 1e-5
    init_std: float | int | None = None
    qkv_init_gain: float | int = 2**-0.5
    normalize_before: bool = False
    position_embedding_type: str = "sinusoidal"
    sinusoid_layout: str = "interleaved"
    add_final_logits_bias: bool = False
    source_language: str | None = None
    target_language: str | None = None
    is_encoder_decoder: bool = True
    use_cache: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    unk_token_id: int | None = 3
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        # Training settings that configs saved by hf_vanilla 0.1 carried: a model holds no training state, and the
        # loss they set is now an argument of each `forward` call.
        for name in LEGACY_TRAINING_FIELDS:
            kwargs.pop(name, None)
        if SERVED_BY_THE_PACKAGE:
            # A saved folder's `custom_pipelines` are for Pythons without hf_vanilla; here `import hf_vanilla` serves
            # those tasks, and `pipeline()` would otherwise demand `trust_remote_code` for them. `to_dict` writes
            # them again.
            kwargs.pop("custom_pipelines", None)
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        super().__post_init__(**kwargs)

    def validate_sizes(self) -> None:
        for name in _POSITIVE_INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for stack in ("encoder", "decoder"):
            heads = getattr(self, f"{stack}_attention_heads")
            if self.d_model % heads != 0:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{stack}_attention_heads` ({heads}) so that "
                    f"every head gets d_model / h features; pick a head count that divides {self.d_model}."
                )

    def validate_probabilities(self) -> None:
        for name in _PROBABILITY_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}.")

    def validate_initialisation(self) -> None:
        if not _is_positive_number(self.layer_norm_eps):
            raise ValueError(f"`layer_norm_eps` must be a positive number, got {self.layer_norm_eps!r}.")
        if self.init_std is not None and not _is_positive_number(self.init_std):
            raise ValueError(f"`init_std` must be a positive number or None, got {self.init_std!r}.")
        if not _is_positive_number(self.qkv_init_gain):
            raise ValueError(f"`qkv_init_gain` must be a positive number, got {self.qkv_init_gain!r}.")

    def validate_choices(self) -> None:
        for name, allowed in (
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("sinusoid_layout", SINUSOID_LAYOUTS),
            ("activation_function", ACTIVATION_FUNCTIONS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"`{name}` must be one of {list(allowed)}, got {value!r}.")

    def validate_vocabularies(self) -> None:
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"`share_encoder_decoder_embeddings=True` needs one vocabulary, but `vocab_size` is "
                f"{self.vocab_size} and `decoder_vocab_size` is {self.decoder_vocab_size}; set "
                "`share_encoder_decoder_embeddings=False` or make the sizes equal."
            )

    def validate_special_tokens(self) -> None:
        # The library's `validate_token_ids` only warns about an id outside the vocabulary (some Hub configs store
        # -1); here it is an error. Source-side ids (pad, unk, eos) index the encoder vocabulary; every id the
        # decoder reads or emits must fit the decoder vocabulary, the smaller bound only when the two differ.
        limit = min(self.vocab_size, self.decoder_vocab_size)
        for name in _SPECIAL_TOKEN_FIELDS:
            value = getattr(self, name, None)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise ValueError(
                    f"`{name}` must be None or an id in [0, {limit - 1}] (the vocabulary), got {value!r}."
                )

    def validate_languages(self) -> None:
        languages = (self.source_language, self.target_language)
        if (languages[0] is None) != (languages[1] is None):
            raise ValueError(
                f"Set both `source_language` and `target_language` or neither, got {languages[0]!r} and "
                f"{languages[1]!r}."
            )
        for name, code in zip(("source_language", "target_language"), languages, strict=True):
            is_code = isinstance(code, str) and code[:1].isalpha() and code.replace("-", "").isalpha()
            if code is not None and not is_code:
                raise ValueError(f"`{name}` must be a language code such as 'en' or 'pt-BR', got {code!r}.")

    @property
    def translation_task(self) -> str | None:
        """`translation_<source>_to_<target>`, the task name transformers' docs and scripts use, when the model
        knows its languages."""
        if self.source_language is None:
            return None
        return f"translation_{self.source_language}_to_{self.target_language}"

    def remote_code_pipelines(self) -> dict:
        """The pipelines a saved folder lists for `pipeline(..., trust_remote_code=True)` where hf_vanilla is not
        installed: `translation`, and the model's `translation_<source>_to_<target>` when it knows its languages."""
        tasks = ["translation"] + ([self.translation_task] if self.translation_task else [])
        return {task: dict(CUSTOM_PIPELINES["translation"]) for task in tasks}

    def to_dict(self) -> dict:
        # Written from the fields, so that a config saves the same JSON in any process and whatever else was built.
        output = super().to_dict()
        output["custom_pipelines"] = {**(output.get("custom_pipelines") or {}), **self.remote_code_pipelines()}
        return output


__all__ = ["VanillaTransformerConfig"]
