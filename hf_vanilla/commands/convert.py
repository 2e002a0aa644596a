"""Import a MarianMT / OPUS-MT checkpoint.

    hf-vanilla convert marian SOURCE OUTPUT

SOURCE is a saved MarianMT / OPUS-MT folder or Hub id (e.g. Helsinki-NLP/opus-mt-en-de); the weights are renamed,
never changed, and the tokenizer files are copied along, so OUTPUT translates with the pipeline.
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=["marian"], help="what the source checkpoint is")
    parser.add_argument("source", help="a saved MarianMT folder or Hub id")
    parser.add_argument("output", help="where to write the hf_vanilla folder")


def run(args: argparse.Namespace) -> None:
    from ..interop.marian import convert_marian_folder

    convert_marian_folder(args.source, args.output)
    print(f"converted {args.source} -> {args.output}")
