"""Decoding for users: translating many sentences (a list, or a file streamed a buffer at a time) on PyTorch, ONNX
Runtime or CTranslate2, and generate()'s compiled speed path."""

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from .library_hooks import compile_on_every_device
from .packing import pack_by_budget
from .pipeline_vanilla import EXTRA_TARGET_TOKENS, decoding_budget, decoding_max_length


class GenerateTranslator:
    """Translates token-id batches with a model's `generate()`: our PyTorch model, or the ONNX Runtime runner
    (`interop.exporters`), which puts the exported graphs behind the same interface."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        length_ratio: float = 1.0,
        length_offset: int = EXTRA_TARGET_TOKENS,
        **generate_kwargs,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.length_ratio, self.length_offset, self.generate_kwargs = length_ratio, length_offset, generate_kwargs

    def __call__(self, sources: list[list[int]]) -> list[list[str]]:
        """For each source (token ids), its `num_return_sequences` candidates; the batch may produce at most
        `length_ratio * longest source + length_offset` new tokens (the paper: source length + 50)."""
        batch = self.tokenizer.pad({"input_ids": sources}, return_tensors="pt").to(self.model.device)
        max_length = decoding_max_length(batch["input_ids"].shape[1], self.length_ratio, self.length_offset)
        with torch.no_grad():
            output = self.model.generate(**batch, max_length=max_length, **self.generate_kwargs)
        texts = self.tokenizer.batch_decode(output, skip_special_tokens=True)
        per_source = len(texts) // len(sources)
        return [texts[i * per_source : (i + 1) * per_source] for i in range(len(sources))]


class CTranslate2Translator:
    """Translates token-id batches with a CTranslate2 export (`hf-vanilla export ctranslate2`), with the options of
    `generate()` that it has an equivalent for."""

    OPTIONS = {"num_beams": "beam_size", "length_penalty": "length_penalty", "num_return_sequences": "num_hypotheses"}
    SAMPLING = {"top_k": "sampling_topk", "top_p": "sampling_topp", "temperature": "sampling_temperature"}

    def __init__(
        self,
        folder: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        length_ratio: float = 1.0,
        length_offset: int = EXTRA_TARGET_TOKENS,
        device: str = "cpu",
        compute_type: str = "default",
        **generate_kwargs,
    ):
        import ctranslate2

        unknown = set(generate_kwargs) - set(self.OPTIONS) - set(self.SAMPLING) - {"do_sample"}
        if unknown:
            raise ValueError(f"CTranslate2 has no equivalent of {sorted(unknown)}; use --engine pytorch for them.")
        self.tokenizer, self.length_ratio, self.length_offset = tokenizer, length_ratio, length_offset
        # what `generate()` would take from the generation config saved with the export (beam 4, length penalty 0.6)
        saved = Path(folder, "generation_config.json")
        defaults = GenerationConfig.from_pretrained(folder).to_dict() if saved.is_file() else {}
        generate_kwargs = {
            **{k: defaults[k] for k in ("num_beams", "length_penalty") if k in defaults},
            **generate_kwargs,
        }
        self.options = {self.OPTIONS[k]: v for k, v in generate_kwargs.items() if k in self.OPTIONS}
        if generate_kwargs.get("do_sample"):
            self.options.update(beam_size=1, sampling_topk=0)  # CTranslate2's topk 1 means greedy; 0: the whole vocab
            self.options.update({self.SAMPLING[k]: v for k, v in generate_kwargs.items() if k in self.SAMPLING})
        elif set(generate_kwargs) & set(self.SAMPLING):
            raise ValueError("--top-k, --top-p and --temperature need --sample.")
        threads = torch.get_num_threads() if device == "cpu" else 1
        self.translator = ctranslate2.Translator(
            str(folder), device=device, compute_type=compute_type, inter_threads=1, intra_threads=threads
        )

    def __call__(self, sources: list[list[int]]) -> list[list[str]]:
        longest = max(map(len, sources))
        results = self.translator.translate_batch(
            [self.tokenizer.convert_ids_to_tokens(ids) for ids in sources],
            max_decoding_length=decoding_budget(longest, self.length_ratio, self.length_offset),
            **self.options,
        )
        return [
            [
                self.tokenizer.decode(self.tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)
                for tokens in result.hypotheses
            ]
            for result in results
        ]


def translate_buffer(
    translate, tokenizer: PreTrainedTokenizerBase, lines: Sequence[str], max_tokens: int, max_sentences: int
) -> list[list[str]]:
    """Candidates for each of `lines`, in input order. The non-blank lines are sorted by length into batches of at most
    `max_tokens` source tokens (padding included) and `max_sentences` sentences; a blank line gives no candidate and
    costs no model call."""
    results: list[list[str]] = [[] for _ in lines]
    indices = [i for i, line in enumerate(lines) if line.strip()]
    if not indices:
        return results
    encoded = tokenizer([lines[i].strip() for i in indices], add_special_tokens=True)["input_ids"]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    order = np.argsort(lengths, kind="stable")
    # A sentence longer than the budget counts as the whole budget, so it still goes, alone: a budget must not refuse
    # a line.
    bounds = pack_by_budget(np.minimum(lengths[order], max_tokens), max_tokens, max_sentences)
    for start, end in itertools.pairwise(bounds.tolist()):
        batch = order[start:end].tolist()
        for position, candidates in zip(batch, translate([encoded[p] for p in batch]), strict=True):
            results[indices[position]] = candidates
    return results


def translate_stream(
    translate,
    tokenizer: PreTrainedTokenizerBase,
    lines: Iterable[str],
    buffer_size: int = 2000,
    max_tokens: int = 4000,
    max_sentences: int = 128,
    progress: bool = False,
) -> Iterator[list[str]]:
    """Candidates for each line of `lines`, in order, one buffer of `buffer_size` lines at a time: memory follows the
    buffer, not the input, and a buffer's results come out as soon as it is done (Marian's `--maxi-batch`, fairseq's
    `--buffer-size`). If reading a line fails (invalid UTF-8, say), the lines before it are translated and yielded
    first, then the error is raised."""
    for name, value in (("buffer_size", buffer_size), ("max_tokens", max_tokens), ("max_sentences", max_sentences)):
        if value < 1:
            raise ValueError(f"`{name}` must be at least 1, got {value}.")
    lines = iter(lines)
    with tqdm(desc="translating", unit="line", disable=not progress) as bar:
        while True:
            buffer, failure = [], None
            try:
                buffer.extend(itertools.islice(lines, buffer_size))
            except ValueError as error:  # what was read before the bad line is translated first
                failure = error
            yield from translate_buffer(translate, tokenizer, buffer, max_tokens, max_sentences)
            bar.update(len(buffer))
            if failure is not None:
                raise failure
            if len(buffer) < buffer_size:
                return


def translate_lines(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lines: Sequence[str],
    batch_size: int = 32,
    length_ratio: float = 1.0,
    length_offset: int = EXTRA_TARGET_TOKENS,
    progress: bool = True,
    max_tokens: int | None = None,
    **generate_kwargs,
) -> list[list[str]]:
    """Translate `lines` with `model.generate()`, returning for each (in input order) its `num_return_sequences`
    candidates, none for a blank line. Sentences are batched by source length so little compute goes to padding:
    at most `batch_size` sentences and (if given) `max_tokens` source tokens a batch. Each batch may produce at most
    `length_ratio * longest_source + length_offset` new tokens (the paper: source length + 50)."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}.")
    model.eval()
    translate = GenerateTranslator(model, tokenizer, length_ratio, length_offset, **generate_kwargs)
    budget = max_tokens or np.iinfo(np.int64).max // 2
    stream = translate_stream(translate, tokenizer, lines, len(lines) or 1, budget, batch_size, progress=progress)
    return list(stream)


def static_cache_and_compile() -> dict:
    """`generate()` options for its own speed path: a preallocated (static) cache and the decoding step compiled
    with `torch.compile(fullgraph=True)`. transformers compiles only on accelerators unless asked, so every device is
    asked explicitly (`library_hooks.compile_on_every_device`). Greedy decoding and sampling use it; beam search runs
    the step eagerly."""
    config = compile_on_every_device(CompileConfig(fullgraph=True, dynamic=False))
    return dict(cache_implementation="static", compile_config=config)
