"""Export to ONNX, and run the export with ONNX Runtime under transformers' own `generate()`.

    hf-vanilla export onnx MODEL OUTPUT          # needs `pip install 'hf-vanilla[export]'`

writes two graphs (through `torch.onnx.export`) beside the model's config, generation config and tokenizer:

    encoder_model.onnx  input_ids, attention_mask [batch, source]
                        -> last_hidden_state [batch, source, d_model],
                           present.{i}.encoder.key / .value [batch, heads, source, d_head] for decoder layer i:
                           the cross-attention keys and values, computed once per source, as the PyTorch cache does
    decoder_model.onnx  decoder_input_ids [batch, new], encoder_attention_mask [batch, source],
                        past_key_values.{i}.decoder.key / .value [batch, heads, past, d_head] (past may be 0),
                        past_key_values.{i}.encoder.key / .value [batch, heads, source, d_head]
                        -> logits [batch, new, target vocabulary],
                           present.{i}.decoder.key / .value [batch, heads, past + new, d_head]

The input and output names are optimum's for seq2seq exports; any runtime can drive the two graphs (feed the
`present` outputs back as `past_key_values`). In Python:

    model = OnnxVanillaForConditionalGeneration.from_pretrained(OUTPUT)
    model.generate(**tokenizer(["A dog runs."], return_tensors="pt"), num_beams=4)

runs them with transformers' own greedy, sampling and beam-search loops, the code that drives the PyTorch model, so
the tokens are the PyTorch model's wherever the logits agree to float rounding (tested on padded batches).
"""

import importlib.util
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from ..configuration_vanilla import VanillaTransformerConfig
from ..modeling_vanilla import (
    VanillaGenerationMixin,
    VanillaTransformerForConditionalGeneration,
    check_attention_mask,
    check_token_ids,
)


def require(*modules: str) -> None:
    """Fail with the install command when an optional dependency of the export is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"The ONNX export needs {', '.join(missing)}: pip install 'hf-vanilla[export]'.")


ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"


def encoder_output_names(num_layers: int) -> list[str]:
    names = ["last_hidden_state"]
    for i in range(num_layers):
        names += [f"present.{i}.encoder.key", f"present.{i}.encoder.value"]
    return names


def decoder_input_names(num_layers: int) -> list[str]:
    names = ["decoder_input_ids", "encoder_attention_mask"]
    for i in range(num_layers):
        names += [f"past_key_values.{i}.decoder.{part}" for part in ("key", "value")]
        names += [f"past_key_values.{i}.encoder.{part}" for part in ("key", "value")]
    return names


def decoder_output_names(num_layers: int) -> list[str]:
    names = ["logits"]
    for i in range(num_layers):
        names += [f"present.{i}.decoder.key", f"present.{i}.decoder.value"]
    return names


# What torch.onnx.export traces: the PyTorch model's own modules, called the way generation calls them.


class EncoderGraph(nn.Module):
    """The encoder, then each decoder layer's cross-attention keys and values of its output."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        super().__init__()
        self.encoder = model.get_encoder()
        self.cross_attentions = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden_states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        keys_values = [attention.project_key_value(hidden_states, cache) for attention in self.cross_attentions]
        return hidden_states, keys_values


class DecoderStepGraph(nn.Module):
    """One decoding step: new target tokens attend to the cached past and, through the cached cross-attention keys
    and values, to the source."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, past_key_values):
        # One (self key, self value, cross key, cross value) tuple per layer; the cross half marks itself updated.
        cache = EncoderDecoderCache(past_key_values)
        cross_keys = past_key_values[0][2]
        # The decoder reads only the shape of the encoder output once the cross-attention cache is filled (for the
        # padding mask); this stand-in has no consumer in the graph and is dropped from it.
        encoder_hidden_states = cross_keys.new_zeros(*encoder_attention_mask.shape, self.model.config.d_model)
        outputs = self.model(
            attention_mask=encoder_attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=(encoder_hidden_states,),
            past_key_values=cache,
            use_cache=True,
        )
        present = [(layer.keys, layer.values) for layer in cache.self_attention_cache.layers]
        return outputs.logits, present


def position_limit(config: VanillaTransformerConfig) -> int:
    """How many positions the exported graphs cover. A graph cannot extend the sinusoid table as the PyTorch model
    does, so the export carries at least 1024 positions (as the CTranslate2 export); learned ones stop at theirs."""
    if config.position_embedding_type == "sinusoidal":
        return max(config.max_position_embeddings, 1024)
    return config.max_position_embeddings


def check_within_position_limit(length: int, config: VanillaTransformerConfig, what: str) -> None:
    if length > position_limit(config):
        raise ValueError(
            f"{what} reaches {length} positions, but the ONNX export covers {position_limit(config)}; shorten it, "
            "lower `max_new_tokens`, or translate with the PyTorch model, which extends its sinusoids."
        )


@contextmanager
def prepared_for_export(model: VanillaTransformerForConditionalGeneration):
    """The model in eval mode, with eager attention (the one implementation every exporter traces: flash and flex
    kernels are not, so the graph does not depend on how the model was loaded) and sinusoid tables of
    `position_limit` positions; all restored after."""
    state = model.training, model.config._attn_implementation
    tables = [
        (stack.embed_positions, stack.embed_positions.weight) for stack in (model.model.encoder, model.model.decoder)
    ]
    model.eval()
    model.set_attn_implementation("eager")
    for positions, _ in tables:
        positions.reserve(position_limit(model.config))
    try:
        yield model
    finally:
        for positions, weight in tables:
            positions.weight = weight
        model.set_attn_implementation(state[1])
        model.train(state[0])


def _export_graphs(model: VanillaTransformerForConditionalGeneration, output_dir: Path, opset_version: int | None):
    config = model.config
    layers, limit = config.decoder_layers, position_limit(config)
    # Example: a padded batch of 2 sources of length 5; 2 new target tokens after 3 cached ones. The ranges say
    # what runs later: a single new token (1 is not special), an empty past at the first step.
    input_ids = torch.full((2, 5), config.eos_token_id, dtype=torch.long)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    decoder_input_ids = torch.full((2, 2), config.decoder_start_token_id, dtype=torch.long)
    batch = torch.export.Dim("batch", min=1)
    source = torch.export.Dim("source_length", min=1, max=limit)
    target = torch.export.Dim("target_length", min=1, max=limit)
    past = torch.export.Dim("past_length", min=0, max=limit - 1)
    with torch.no_grad():
        encoder = EncoderGraph(model).eval()
        _, cross = encoder(input_ids, attention_mask)
        torch.onnx.export(
            encoder,
            (input_ids, attention_mask),
            output_dir / ENCODER_FILE,
            input_names=["input_ids", "attention_mask"],
            output_names=encoder_output_names(layers),
            dynamic_shapes=({0: batch, 1: source}, {0: batch, 1: source}),
            opset_version=opset_version,
            dynamo=True,
            verbose=False,
        )
        # A distinct tensor for every input: the exporter would take one tensor passed twice for a single input.
        past_shape = (2, config.decoder_attention_heads, 3, cross[0][0].shape[-1])
        past_key_values = tuple((torch.randn(past_shape), torch.randn(past_shape), key, value) for key, value in cross)
        self_shape, cross_shape = {0: batch, 2: past}, {0: batch, 2: source}
        torch.onnx.export(
            DecoderStepGraph(model).eval(),
            (decoder_input_ids, attention_mask, past_key_values),
            output_dir / DECODER_FILE,
            input_names=decoder_input_names(layers),
            output_names=decoder_output_names(layers),
            dynamic_shapes=(
                {0: batch, 1: target},
                {0: batch, 1: source},
                tuple((self_shape, self_shape, cross_shape, cross_shape) for _ in range(layers)),
            ),
            opset_version=opset_version,
            dynamo=True,
            verbose=False,
        )


def export_onnx(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | Path,
    opset_version: int | None = None,
    force: bool = False,
) -> Path:
    """Write encoder_model.onnx and decoder_model.onnx (float32), the config, generation config and tokenizer.
    The model is left as it was."""
    require("onnx", "onnxscript")
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(
            f"Export a float32 model on the CPU (got {weight.dtype} on {weight.device}): `.float().cpu()`."
        )
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; pass force=True (--force) to overwrite it.")
    output_dir.mkdir(parents=True, exist_ok=True)
    with prepared_for_export(model), warnings.catch_warnings():
        # The exporter warns for every dynamic axis that its name "shares the same shape constraints" with itself.
        warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
        _export_graphs(model, output_dir, opset_version)
    model.config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return output_dir


# Running the export.


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().numpy())


def _initialized_layer(cache: DynamicCache, layer_idx: int) -> DynamicLayer | None:
    """The cache's layer `layer_idx` once it holds keys and values; a cache built without a config (as in
    transformers' examples) has no layer before its first `update`."""
    if layer_idx < len(cache.layers) and cache.layers[layer_idx].is_initialized:
        return cache.layers[layer_idx]
    return None


def _hold(cache: DynamicCache, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Keep ONNX Runtime's outputs (already past + new) as the layer's cache, instead of `update`'s concatenation
    onto the past: a copy of the whole cache at every step. The first step goes through `update`, which creates
    the layer where needed."""
    layer = _initialized_layer(cache, layer_idx)
    if layer is None:
        cache.update(keys, values, layer_idx)
    else:
        layer.keys, layer.values = keys, values


def refuse_extra_outputs(output_attentions: bool | None, output_hidden_states: bool | None) -> None:
    if output_attentions or output_hidden_states:
        raise ValueError("The ONNX export returns no attentions or hidden states; use the PyTorch model for them.")


@dataclass
class OnnxEncoderOutput(BaseModelOutput):
    """The encoder output, with the decoder layers' cross-attention keys and values in one batch-first tensor
    [batch, 2 * layers, heads, source, d_head], so that `generate` expands it for beam search like the rest."""

    cross_attention_key_values: torch.Tensor | None = None


class OnnxEncoder(nn.Module):
    main_input_name = "input_ids"

    def __init__(self, session, config: VanillaTransformerConfig):
        super().__init__()
        self.session = session
        self.config = config

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> OnnxEncoderOutput:
        refuse_extra_outputs(output_attentions, output_hidden_states)
        check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        check_attention_mask(attention_mask, input_ids.shape, "attention_mask")
        check_within_position_limit(input_ids.shape[1], self.config, "The source")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        outputs = self.session.run(
            None, {"input_ids": _array(input_ids), "attention_mask": _array(attention_mask.long())}
        )
        hidden_states, *keys_values = (torch.from_numpy(array) for array in outputs)
        return OnnxEncoderOutput(
            last_hidden_state=hidden_states, cross_attention_key_values=torch.stack(keys_values, 1)
        )


class OnnxVanillaForConditionalGeneration(PreTrainedModel, VanillaGenerationMixin):
    """The two ONNX Runtime sessions of an `export_onnx` folder behind the model interface `generate()` drives."""

    config_class = VanillaTransformerConfig
    main_input_name = "input_ids"

    def __init__(self, config: VanillaTransformerConfig, encoder_session, decoder_session):
        super().__init__(config)
        self.encoder = OnnxEncoder(encoder_session, config)
        self.decoder_session = decoder_session
        self.decoder_input_names = decoder_input_names(config.decoder_layers)

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        providers: list[str] | None = None,
        session_options=None,
        num_threads: int | None = None,
    ) -> "OnnxVanillaForConditionalGeneration":
        """Open an `export_onnx` folder. Providers default to the CPU; without `session_options`, the sessions use
        `num_threads` threads (default: ONNX Runtime's choice) that sleep rather than spin between runs."""
        require("onnxruntime")
        import onnxruntime

        if session_options is None:
            session_options = onnxruntime.SessionOptions()
            # Between two decoder steps generate() runs its logits processors and beam bookkeeping in PyTorch;
            # spin-waiting workers would hold the cores meanwhile (measured on 2 cores: greedy 2.1x, beam 4 1.9x
            # slower with spinning).
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if num_threads:
                session_options.intra_op_num_threads = num_threads
        folder = Path(folder)
        missing = [name for name in (ENCODER_FILE, DECODER_FILE, "config.json") if not (folder / name).exists()]
        if missing:
            raise FileNotFoundError(
                f"{folder} lacks {missing}: write it with `hf-vanilla export onnx MODEL {folder}`."
            )
        providers = providers or ["CPUExecutionProvider"]

        def session(name):
            return onnxruntime.InferenceSession(folder / name, sess_options=session_options, providers=providers)

        model = cls(VanillaTransformerConfig.from_pretrained(folder), session(ENCODER_FILE), session(DECODER_FILE))
        if (folder / "generation_config.json").exists():
            model.generation_config = GenerationConfig.from_pretrained(folder)
        return model

    def save_pretrained(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "An ONNX model is its export folder: copy that, or export again with `hf-vanilla export onnx`."
        )

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # the sessions take and return host arrays

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self) -> OnnxEncoder:
        return self.encoder

    def _fill_cross_attention_cache(self, cache: EncoderDecoderCache, encoder_outputs: OnnxEncoderOutput) -> None:
        keys_values = encoder_outputs.cross_attention_key_values.unbind(1)
        for i in range(self.config.decoder_layers):
            cache.cross_attention_cache.update(keys_values[2 * i], keys_values[2 * i + 1], i)  # one contiguous copy
            cache.is_updated[i] = True

    def _decoder_feed(
        self, decoder_input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: EncoderDecoderCache
    ) -> dict[str, np.ndarray]:
        """The decoder graph's inputs, in `decoder_input_names` order; an empty past before the first step."""
        batch, heads, _, head_dim = cache.cross_attention_cache.layers[0].keys.shape
        empty = np.zeros((batch, heads, 0, head_dim), dtype=np.float32)
        arrays = [_array(decoder_input_ids), _array(attention_mask.long())]
        for i in range(self.config.decoder_layers):
            self_layer, cross_layer = (
                _initialized_layer(cache.self_attention_cache, i),
                cache.cross_attention_cache.layers[i],
            )
            past = [empty] * 2 if self_layer is None else [_array(self_layer.keys), _array(self_layer.values)]
            arrays += past + [_array(cross_layer.keys), _array(cross_layer.values)]
        return dict(zip(self.decoder_input_names, arrays, strict=True))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        encoder_outputs: OnnxEncoderOutput | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """Logits for `decoder_input_ids` (only the new ones when `past_key_values` holds the earlier ones)."""
        refuse_extra_outputs(output_attentions, output_hidden_states)
        if labels is not None:
            raise ValueError("The ONNX export computes logits only; compute the loss with the PyTorch model.")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        if not isinstance(encoder_outputs, OnnxEncoderOutput):
            raise TypeError("`encoder_outputs` must come from this model's encoder (`model.get_encoder()`).")
        if decoder_input_ids is None:
            raise ValueError("Pass `decoder_input_ids` (generate() does), starting with the decoder start token.")
        check_token_ids(decoder_input_ids, self.config.decoder_vocab_size, "decoder_input_ids")
        cross = encoder_outputs.cross_attention_key_values
        if attention_mask is None:
            attention_mask = torch.ones(cross.shape[0], cross.shape[3], dtype=torch.long)
        if past_key_values is None or not use_cache:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        if not isinstance(past_key_values, EncoderDecoderCache) or not isinstance(
            past_key_values.self_attention_cache, DynamicCache
        ):
            raise TypeError("The ONNX export keeps its cache in an EncoderDecoderCache of DynamicCaches.")
        if past_key_values.cross_attention_cache.get_seq_length() == 0:
            self._fill_cross_attention_cache(past_key_values, encoder_outputs)

        past_length = past_key_values.get_seq_length()
        check_within_position_limit(past_length + decoder_input_ids.shape[1], self.config, "The target")
        feed = self._decoder_feed(decoder_input_ids, attention_mask, past_key_values)
        logits, *present = (torch.from_numpy(array) for array in self.decoder_session.run(None, feed))
        for i in range(self.config.decoder_layers):
            _hold(past_key_values.self_attention_cache, i, present[2 * i], present[2 * i + 1])
        return Seq2SeqLMOutput(
            logits=logits,
            past_key_values=past_key_values if use_cache else None,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        )
