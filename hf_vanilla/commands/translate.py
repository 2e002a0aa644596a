"""Translate a file or stdin, line by line, as MT tools do.

    hf-vanilla translate MODEL [--input FILE] [--output FILE] [--engine ENGINE] [--beam N] ...

Line i of the output is the translation of line i of the input; a blank line gives a blank line. The input is read
a buffer at a time (--buffer-size lines), each buffer sorted by length into batches of at most --max-tokens source
tokens (and --batch-size sentences), and its translations written, in input order, as soon as it is done: memory
follows the buffer, not the file. Each sentence may produce up to `a * source length + b` new tokens (the paper:
a = 1, b = 50). With --nbest N a line holds N candidates separated by TABs. MODEL is a saved model folder (or Hub
id) for --engine pytorch, and the folder `hf-vanilla export onnx|openvino|ctranslate2` wrote for the others.
`--attention-plot PNG` draws the cross-attention of the first sentence (PyTorch).
"""

import argparse
import contextlib
import sys
from pathlib import Path


ENGINES = ("pytorch", "onnx", "openvino", "ctranslate2")
DEFAULT_MAX_TOKENS = {"cpu": 4000, "cuda": 16000}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a saved model folder (with its tokenizer), a Hub id, or an export folder")
    parser.add_argument("--input", help="text file, one sentence a line (default: stdin)")
    parser.add_argument("--output", help="where to write translations (default: stdout)")
    parser.add_argument("--engine", choices=ENGINES, default="pytorch", help="what runs the model (default: pytorch)")
    parser.add_argument("--compute-type", help="ctranslate2: int8, int8_float32, float32, ... (default: as exported)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the MODEL folder)")
    parser.add_argument("--buffer-size", type=int, default=2000, help="lines read, sorted and written together")
    parser.add_argument(
        "--max-tokens", type=int, help="source tokens a batch, padding included (cpu 4000, cuda 16000)"
    )
    parser.add_argument("--batch-size", type=int, default=128, help="sentences a batch, at most")
    parser.add_argument(
        "--errors", choices=("strict", "replace"), default="strict", help="invalid UTF-8: stop or U+FFFD"
    )
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the model's generation config)")
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--nbest", type=int, default=1, help="candidates per sentence, written TAB-separated")
    parser.add_argument("--sample", action="store_true", help="sample instead of searching")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len-a", type=float, default=1.0, help="max new tokens = a * source length + b")
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--attention-plot", help="PNG of the cross-attention of the first sentence (pytorch)")
    parser.add_argument("--no-progress", action="store_true")


def generation_options(args: argparse.Namespace) -> dict:
    options = {"num_return_sequences": args.nbest}
    if args.sample:
        options.update(do_sample=True, num_beams=1)
    elif args.beam is not None:
        options["num_beams"] = args.beam
    for name in ("length_penalty", "top_k", "top_p", "temperature"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def check_locations(args: argparse.Namespace) -> None:
    """Missing files and folders, named with the fix, before anything loads."""
    looks_local = Path(args.model).exists() or args.model.startswith((".", "/", "~")) or args.engine != "pytorch"
    if looks_local and not Path(args.model).is_dir():
        made_by = (
            "hf-vanilla train (runs/NAME/final)" if args.engine == "pytorch" else f"hf-vanilla export {args.engine}"
        )
        raise FileNotFoundError(f"MODEL {args.model}: no such folder; give the folder {made_by} wrote.")
    if args.input and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file.")


def check_engine_options(args: argparse.Namespace, device: str) -> None:
    """Options an engine has no equivalent for are refused, never ignored; so are sampling options without
    --sample, which every engine would otherwise drop (beam search and greedy decoding take no temperature)."""
    sampling = [name for name in ("top_k", "top_p", "temperature") if getattr(args, name) is not None]
    if sampling and not args.sample:
        raise ValueError("--top-k, --top-p and --temperature need --sample.")
    if args.engine != "pytorch" and args.attention_plot:
        raise ValueError(f"--attention-plot needs the PyTorch model; --engine {args.engine} cannot draw it.")
    if args.engine != "ctranslate2" and args.compute_type:
        raise ValueError("--compute-type is for --engine ctranslate2.")
    if args.engine in ("onnx", "openvino") and device != "cpu":
        raise ValueError(f"--engine {args.engine} runs on the CPU; drop --device.")


def build_translator(args: argparse.Namespace, tokenizer, device: str):
    """The batch translator of the chosen engine; PyTorch's and the exports' hold their model as `.model`."""
    import torch

    from ..inference import CTranslate2Translator, GenerateTranslator

    options = generation_options(args)
    budget = {"length_ratio": args.max_len_a, "length_offset": args.max_len_b}
    if args.engine == "ctranslate2":
        import ctranslate2

        ctranslate2.set_random_seed(args.seed)
        compute_type = args.compute_type or "default"
        return CTranslate2Translator(
            args.model, tokenizer, device=device, compute_type=compute_type, **budget, **options
        )
    torch.manual_seed(args.seed)
    if args.engine in ("onnx", "openvino"):
        from ..interop.exporters import ExportedVanillaForConditionalGeneration

        threads = torch.get_num_threads()
        model = ExportedVanillaForConditionalGeneration.from_pretrained(args.model, num_threads=threads)
        if model.backend != args.engine:
            raise ValueError(f"MODEL {args.model} is a {model.backend} export; use --engine {model.backend}.")
    else:
        from ..loading import load_model

        model = load_model(args.model).to(device).eval()
    return GenerateTranslator(model, tokenizer, **budget, **options)


def draw_attention(args: argparse.Namespace, model, tokenizer, sentence: str) -> None:
    """The cross-attention of `sentence`, decoded as the file was, drawn to `--attention-plot`."""
    from ..pipeline_vanilla import decoding_max_length
    from ..plotting import plot_cross_attention

    options = generation_options(args)
    options.pop("num_return_sequences")
    max_length = decoding_max_length(len(tokenizer(sentence)["input_ids"]), args.max_len_a, args.max_len_b)
    plot_cross_attention(model, tokenizer, sentence, args.attention_plot, max_length=max_length, **options)
    print(f"cross-attention of the first sentence drawn to {args.attention_plot}", file=sys.stderr)


def run(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoTokenizer

    from ..inference import translate_stream
    from ..pipeline_vanilla import check_tokenizer_matches_model
    from ..text_files import decode_lines

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_locations(args)
    check_engine_options(args, device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    translate = build_translator(args, tokenizer, device)
    if args.engine != "ctranslate2":  # PyTorch and ONNX carry the model's config; CTranslate2 its own vocabulary
        check_tokenizer_matches_model(tokenizer, translate.model.config)
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS.get(torch.device(device).type, DEFAULT_MAX_TOKENS["cpu"])
    files = contextlib.ExitStack()  # closes the files opened here, never stdin or stdout
    source = files.enter_context(open(args.input, "rb")) if args.input else sys.stdin.buffer
    target = files.enter_context(open(args.output, "w", encoding="utf-8")) if args.output else sys.stdout
    first_sentence = []

    def remember_the_first_sentence(lines):
        for line in lines:
            if not first_sentence and line.strip():
                first_sentence.append(line.strip())
            yield line

    fix = "fix the file, or pass --errors replace to translate it with U+FFFD in place of the bad bytes"
    lines = decode_lines(source, args.input or "<stdin>", errors=args.errors, fix=fix)
    stream = translate_stream(
        translate,
        tokenizer,
        remember_the_first_sentence(lines),
        buffer_size=args.buffer_size,
        max_tokens=max_tokens,
        max_sentences=args.batch_size,
        progress=not args.no_progress,
    )
    with files:
        for candidates in stream:
            target.write("\t".join(candidates) + "\n")
            target.flush()
    if args.attention_plot and first_sentence:
        draw_attention(args, translate.model, tokenizer, first_sentence[0])  # PyTorch: check_engine_options
