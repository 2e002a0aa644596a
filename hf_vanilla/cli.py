"""The `hf-vanilla` command line: `train`, `translate` and `average`."""

import argparse
import signal
import sys

import torch
from transformers import AutoTokenizer

from .loading import load_model
from .translation import plot_cross_attention, translate_lines


def add_translate_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
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


def run_translate(args: argparse.Namespace) -> None:
    import hf_vanilla  # noqa: F401  (registers the model with the Auto classes)

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = load_model(args.model).to(args.device)
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
        options.pop("num_return_sequences")
        budget = int(args.max_len_a * len(tokenizer(lines[0])["input_ids"]) + args.max_len_b)
        plot_cross_attention(model, tokenizer, lines[0], args.attention_plot, max_new_tokens=budget, **options)
        print(f"cross-attention of line 1 drawn to {args.attention_plot}", file=sys.stderr)


def add_average_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoints", nargs="*", help="checkpoint folders to average")
    parser.add_argument("--from", dest="run_dir", help="a training output folder: average its last checkpoints")
    parser.add_argument("--last", type=int, default=5, help="with --from: how many checkpoints (paper: 5, big: 20)")
    parser.add_argument("--output", required=True, help="folder for the averaged model")


def run_average(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    import hf_vanilla  # noqa: F401  (registers the model with the Auto classes)

    from .averaging import average_checkpoints, checkpoint_folders

    folders = list(args.checkpoints)
    if args.run_dir:
        folders += checkpoint_folders(args.run_dir)[-args.last :]
    if not folders:
        raise SystemExit("error: name checkpoint folders, or --from a training folder that has checkpoints")
    average_checkpoints(folders).save_pretrained(args.output)
    try:
        AutoTokenizer.from_pretrained(folders[-1]).save_pretrained(args.output)
    except (OSError, ValueError):
        print("note: no tokenizer in the checkpoints; copy it next to the averaged model", file=sys.stderr)
    print(f"averaged {len(folders)} checkpoints into {args.output}")


def main(argv: list[str] | None = None) -> None:
    """`hf-vanilla train ...` takes every option of `Seq2SeqTrainingArguments` and the recipe (see `--help`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from .training import TrainingInterrupted, parse_arguments, run_training

        try:
            run_training(*parse_arguments(argv[1:]))
        except TrainingInterrupted as stop:
            print(stop, file=sys.stderr)
            sys.exit(128 + signal.SIGTERM)  # the shell's convention for "terminated by SIGTERM"
        return
    parser = argparse.ArgumentParser(prog="hf-vanilla", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("train", help="train with the paper's recipe: hf-vanilla train --config RECIPE.yaml ...")
    translate = commands.add_parser("translate", help="translate a file or stdin with a saved model")
    add_translate_arguments(translate)
    translate.set_defaults(run=run_translate)
    average = commands.add_parser("average", help="average checkpoints into one model")
    add_average_arguments(average)
    average.set_defaults(run=run_average)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
