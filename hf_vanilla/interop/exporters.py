"""Export with transformers' own exporters (`transformers.exporters`: ONNX, OpenVINO), and run the export under
transformers' own `generate()`.

    hf-vanilla export onnx MODEL OUTPUT          # needs `pip install 'hf-vanilla[export]'`
    hf-vanilla export openvino MODEL OUTPUT      # needs `pip install 'hf-vanilla[openvino]'`

writes, beside the model's config, generation config and tokenizer, two `ExportedModel.save_pretrained` folders:

    encoder/   `OnnxExporter().export(model.get_encoder(), ...)`: input_ids, attention_mask -> last_hidden_state
    decoder/   `export_for_generation(model, ...)`: `prefill`, decoder tokens over an empty cache (it fills the
               cross-attention cache), and `decode`, one new token over a cached past of any length

What the library's `export_for_generation` does not do for an encoder-decoder model (transformers 5.23), done here:
- it captures the model's `forward` during `generate()`, which runs the encoder outside `forward`: the encoder is
  exported on its own;
- a capture that starts from the decoder start token alone meets a past of length 1 in the decode step, which
  `torch.export` specialises (the graph then refuses a past of 2: "Got invalid dimensions for input:
  input.cache.self_attention_cache.layers.0.keys ... index: 2 Got: 2 Expected: 1"): the capture starts
  from two decoder tokens;
- `multi_token_decode=True` merges the captured steps' `input_ids`, not `decoder_input_ids`, so the decode graph
  takes one new token: several new tokens over a past go through it one at a time.
`tests/test_exporters.py` fails the day the library does any of these itself.

In Python:

    model = ExportedVanillaForConditionalGeneration.from_pretrained(OUTPUT)
    model.generate(**tokenizer(["A dog runs."], return_tensors="pt"), num_beams=4)

runs the graphs with transformers' greedy, sampling and beam-search loops, the code that drives the PyTorch model,
so the tokens are the PyTorch model's wherever the logits agree to float rounding (tested on padded batches).
"""

import copy
import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.utils import can_return_tuple

from ..configuration_vanilla import VanillaTransformerConfig
from ..modeling_vanilla import (
    CACHE_FIELD,
    VanillaTransformerForConditionalGeneration,
    accepts_past_key_values,
    check_attention_mask,
    check_token_ids,
    known_kwargs,
)
from .positions import position_limit


# backend -> (exporter, its config, the packages exporting needs, the package running needs, our extra with them)
BACKENDS = {
    "onnx": ("OnnxExporter", "OnnxConfig", ("onnx", "onnxscript"), "onnxruntime", "export"),
    "openvino": ("OpenVINOExporter", "OpenVINOConfig", ("openvino",), "openvino", "openvino"),
}
MANIFEST = "hf_vanilla_export.json"  # names the backend; written last, so a folder holding it is complete


def require(backend: str, *modules: str) -> None:
    """Fail with the install command when an optional dependency of the backend is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        extra = BACKENDS[backend][4]
        raise ImportError(f"The {backend} export needs {', '.join(missing)}: pip install 'hf-vanilla[{extra}]'.")


def check_within_position_limit(length: int, config: VanillaTransformerConfig, what: str) -> None:
    if length > position_limit(config):
        raise ValueError(
            f"{what} reaches {length} positions, but the export covers {position_limit(config)}; shorten it, "
            "lower `max_new_tokens`, or translate with the PyTorch model, which extends its sinusoids."
        )


@contextmanager
def prepared_for_export(model: VanillaTransformerForConditionalGeneration):
    """The model in eval mode, with eager attention (the one implementation every exporter traces, so the graph does
    not depend on how the model was loaded) and sinusoid tables of `position_limit` positions; all restored after."""
    state = model.training, model.config._attn_implementation
    stacks = (model.model.encoder, model.model.decoder)
    tables = [(stack.embed_positions, stack.embed_positions.weight) for stack in stacks]
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


def export_model(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | Path,
    backend: str = "onnx",
    opset_version: int | None = None,
    force: bool = False,
) -> Path:
    """Write the float32 encoder and decoder graphs of `backend`, the config, generation config and tokenizer.
    The model is left as it was."""
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; one of {list(BACKENDS)}.")
    exporter_name, config_name, packages, *_ = BACKENDS[backend]
    require(backend, *packages)
    if opset_version is not None and backend != "onnx":
        raise ValueError("`opset_version` is for the onnx backend.")
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(
            f"Export a float32 model on the CPU (got {weight.dtype} on {weight.device}): `.float().cpu()`."
        )
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; pass force=True (--force) to overwrite it.")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / MANIFEST).unlink(missing_ok=True)

    from transformers import exporters

    exporter = getattr(exporters, exporter_name)()
    export_config = getattr(exporters, config_name)(dynamic=True)
    if backend == "openvino":
        # OpenVINO's default folds the cache into the infer request's state; generate() keeps it, and beam search
        # reorders it, as a Python cache object, which the graph must take and return.
        export_config.stateful = False
    if opset_version is not None:
        export_config.opset_version = opset_version
    config = model.config
    # A padded batch of two sources of five tokens; two decoder tokens before the first capture (see above).
    sources = {
        "input_ids": torch.full((2, 5), config.eos_token_id, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
    }
    prefix = torch.full((2, 2), config.decoder_start_token_id, dtype=torch.long)
    greedy = copy.deepcopy(model.generation_config)
    greedy.update(num_beams=1, do_sample=False, length_penalty=1.0)
    with prepared_for_export(model), torch.no_grad():
        encoder = exporter.export(model.get_encoder(), sources, export_config)
        decoder = exporter.export_for_generation(
            model,
            {**sources, "decoder_input_ids": prefix},
            export_config,
            generation_config=greedy,
        )
    encoder.save_pretrained(output_dir / "encoder")
    decoder.save_pretrained(output_dir / "decoder")
    config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    # The graphs take the cache under the name `generate()` gave it during the capture: the installed release's.
    (output_dir / MANIFEST).write_text(json.dumps({"backend": backend, "cache_name": CACHE_FIELD}) + "\n")
    return output_dir


def refuse_extra_outputs(output_attentions: bool | None, output_hidden_states: bool | None) -> None:
    if output_attentions or output_hidden_states:
        raise ValueError("The export returns no attentions or hidden states; use the PyTorch model for them.")


class ExportedEncoder(nn.Module):
    """The encoder graph behind the module interface `generate()` calls (`model.get_encoder()`)."""

    main_input_name = "input_ids"

    def __init__(self, exported, config: VanillaTransformerConfig):
        super().__init__()
        self.exported, self.config = exported, config

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        refuse_extra_outputs(output_attentions, output_hidden_states)
        check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        check_attention_mask(attention_mask, input_ids.shape, "attention_mask")
        check_within_position_limit(input_ids.shape[1], self.config, "The source")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        outputs = self.exported(input_ids=input_ids, attention_mask=attention_mask.long())
        return BaseModelOutput(last_hidden_state=outputs.last_hidden_state)


def check_cache_name(captured: str, folder: Path) -> None:
    """An export's graphs name their cache inputs as the transformers release that captured them did (`cache` from
    5.24, `past_key_values` before); under a release with the other name, they would not be fed their cache."""
    if captured != CACHE_FIELD:
        raise ValueError(
            f"{folder} was exported under a transformers release that names the cache `{captured}`, and the installed "
            f"one names it `{CACHE_FIELD}`: export the model again under this release (`hf-vanilla export`), or run "
            f"the export with transformers {'< 5.24' if captured == 'past_key_values' else '>= 5.24'}."
        )


class ExportedVanillaForConditionalGeneration(PreTrainedModel, GenerationMixin):
    """The graphs of an `export_model` folder, run by the library's runners behind the model interface that
    `generate()` drives."""

    config_class = VanillaTransformerConfig
    main_input_name = "input_ids"

    def __init__(self, config: VanillaTransformerConfig, encoder, decoder, backend: str):
        super().__init__(config)
        self.encoder = ExportedEncoder(encoder, config)
        self.decoder_graphs, self.backend = decoder, backend  # not `decoder`: generate() reads its `.forward`

    @classmethod
    def from_pretrained(cls, folder: str | Path, num_threads: int | None = None, **runner_kwargs):
        """Open an `export_model` folder on the CPU. `runner_kwargs` go to the backend's runner (`ExportedModel.to`:
        `providers`, `session_options` for ONNX Runtime; `config` for OpenVINO). Without them, the backend runs
        float32 on `num_threads` threads (default: its own choice), and ONNX Runtime's workers sleep rather than spin
        between steps: between two decoder steps `generate()` runs its logits processors and beam bookkeeping in
        PyTorch, and spinning workers would hold the cores meanwhile."""
        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(
                f"{folder} is not a complete export (no {MANIFEST}): write it with `hf-vanilla export onnx MODEL "
                f"{folder}` (or `export openvino`)."
            )
        manifest = json.loads((folder / MANIFEST).read_text())
        backend = manifest["backend"]
        check_cache_name(manifest.get("cache_name", CACHE_FIELD), folder)
        require(backend, BACKENDS[backend][3])
        if backend == "onnx" and "session_options" not in runner_kwargs:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if num_threads:
                options.intra_op_num_threads = num_threads
            runner_kwargs["session_options"] = options
        if backend == "openvino" and "config" not in runner_kwargs:
            # The CPU plugin computes in bf16 where the CPU has it unless told otherwise; the export is float32 and
            # gives the PyTorch model's tokens only in float32.
            runner_kwargs["config"] = {"INFERENCE_PRECISION_HINT": "f32"}
            if num_threads:
                runner_kwargs["config"]["INFERENCE_NUM_THREADS"] = num_threads
        from transformers.exporters import ExportedModel

        encoder = ExportedModel.from_pretrained(folder / "encoder", device="cpu", **runner_kwargs)
        decoder = ExportedModel.from_pretrained(folder / "decoder", device="cpu", **runner_kwargs)
        model = cls(VanillaTransformerConfig.from_pretrained(folder), encoder, decoder, backend)
        model.generation_config = GenerationConfig.from_pretrained(folder)
        return model

    def save_pretrained(self, *args, **kwargs) -> None:
        raise NotImplementedError("An export is its folder: copy that, or export again with `hf-vanilla export`.")

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # the runners take and return host tensors

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self) -> ExportedEncoder:
        return self.encoder

    @can_return_tuple
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """Logits for `decoder_input_ids` (only the new ones when `cache`, or `past_key_values` as transformers
        < 5.24 names it, holds the earlier ones)."""
        known_kwargs(kwargs, ExportedVanillaForConditionalGeneration.forward)
        refuse_extra_outputs(output_attentions, output_hidden_states)
        if labels is not None:
            raise ValueError("The export computes logits only; compute the loss with the PyTorch model.")
        if decoder_input_ids is None:
            raise ValueError("Pass `decoder_input_ids` (generate() does), starting with the decoder start token.")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        # the one field the graphs were traced with (a tuple's first element, or a model output's)
        encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        if attention_mask is None:
            attention_mask = torch.ones(encoder_outputs.last_hidden_state.shape[:2], dtype=torch.long)
        if cache is None or not use_cache:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        past_length = cache.get_seq_length()
        check_token_ids(decoder_input_ids, self.config.decoder_vocab_size, "decoder_input_ids", past_length == 0)
        check_within_position_limit(past_length + decoder_input_ids.shape[1], self.config, "The target")
        step = dict(attention_mask=attention_mask.long(), encoder_outputs=encoder_outputs)
        if self.backend == "openvino":
            # OpenVINO 2026.4's CPU plugin crashed (SIGSEGV in `infer`) when it read the cache in place from the
            # previous step's outputs; it runs on copies of the inputs.
            step["share_inputs"] = False
        # The graphs take the cache under the name `generate()` gave it when they were captured, the installed
        # library's (`check_cache_name` refused an export captured under the other one).
        if past_length == 0:
            outputs = self.decoder_graphs.runners["prefill"](
                **step, decoder_input_ids=decoder_input_ids, **{CACHE_FIELD: cache}
            )
            logits, cache = [outputs.logits], getattr(outputs, CACHE_FIELD)
        else:  # the decode graph takes one new token (see the module docstring)
            logits = []
            for position in range(decoder_input_ids.shape[1]):
                outputs = self.decoder_graphs.runners["decode"](
                    **step, decoder_input_ids=decoder_input_ids[:, position : position + 1], **{CACHE_FIELD: cache}
                )
                logits.append(outputs.logits)
                cache = getattr(outputs, CACHE_FIELD)
        return Seq2SeqLMOutput(
            logits=torch.cat(logits, dim=1),
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            **{CACHE_FIELD: cache if use_cache else None},
        )
