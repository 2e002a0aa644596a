"""Train the joint source+target BPE tokenizer and save it as a `tokenizer.json` folder.

hf-vanilla tokenizer --files TRAIN.en.gz TRAIN.de.gz --vocab-size 10000 --output DIR [--check HELD_OUT ...]
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", nargs="+", required=True, help="training text, source and target (.gz or plain)")
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--output", required=True, help="folder to write tokenizer.json and its config into")
    parser.add_argument("--check", nargs="*", default=[], help="held-out files to report round-trip and unk rate on")


def run(args: argparse.Namespace) -> None:
    from ..text_files import stream_lines
    from ..tokenization import train_bpe_tokenizer, unknown_token_rate

    def non_empty_lines(paths: list[str]):
        return (line for path in paths for line in stream_lines(path) if line)

    tokenizer = train_bpe_tokenizer(non_empty_lines(args.files), args.vocab_size, args.min_frequency)
    tokenizer.save_pretrained(args.output)
    print(f"saved a {len(tokenizer)}-entry tokenizer to {args.output}")
    for path in args.check:
        lines = list(non_empty_lines([path]))
        exact = sum(tokenizer.decode(tokenizer(line)["input_ids"], skip_special_tokens=True) == line for line in lines)
        unk = unknown_token_rate(tokenizer, lines)
        print(f"{path}: round trip exact {exact}/{len(lines)} ({exact / len(lines):.4%}), unknown tokens {unk:.4%}")
