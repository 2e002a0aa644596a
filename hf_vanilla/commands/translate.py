"""Translate a file or stdin with a saved model.

    hf-vanilla translate MODEL [--input FILE] [--beam N] ...

Sentences are batched by length; each may produce up to `a * source length + b` new tokens (the paper: a = 1,
b = 50). `--attention-plot PNG` draws the cross-attention of the first sentence.
"""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a saved model folder (with its tokenizer) or a Hub id")
    parser.add_argument("--input", help="text file, one sentence a line (default: stdin)")
    parser.add_argument("--output", help="where to write translations (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=32)
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
    parser.add_argument("--attention-plot", help="PNG of the cross-attention of the first sentence")
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


def run(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoTokenizer

    import hf_vanilla  # noqa: F401  (registers the model with the Auto classes)

    from ..inference import translate_lines
    from ..loading import load_model
    from ..pipeline_vanilla import decoding_budget

    torch.manual_seed(args.seed)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = load_model(args.model).to(device)
    source = open(args.input, encoding="utf-8") if args.input else sys.stdin
    with source:
        lines = [line.strip() for line in source]
    options = generation_options(args)
    translations = translate_lines(
        model,
        tokenizer,
        lines,
        batch_size=args.batch_size,
        length_ratio=args.max_len_a,
        length_offset=args.max_len_b,
        progress=not args.no_progress,
        **options,
    )
    text = "".join("\t".join(candidates) + "\n" for candidates in translations)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    if args.attention_plot and lines:
        from ..plotting import plot_cross_attention

        options.pop("num_return_sequences")
        budget = decoding_budget(len(tokenizer(lines[0])["input_ids"]), args.max_len_a, args.max_len_b)
        plot_cross_attention(model, tokenizer, lines[0], args.attention_plot, max_new_tokens=budget, **options)
        print(f"cross-attention of line 1 drawn to {args.attention_plot}", file=sys.stderr)
