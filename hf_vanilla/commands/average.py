"""Average checkpoints into one model.

    hf-vanilla average [CHECKPOINT ...] [--from RUN --last N] --output DIR

The paper averages the last 5 checkpoints of a base model and the last 20 of a big one.
"""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoints", nargs="*", help="checkpoint folders to average")
    parser.add_argument(
        "--from",
        dest="run_dir",
        help="a training output folder: average its last checkpoints (of the decay, on the budget schedule)",
    )
    parser.add_argument("--last", type=int, default=5, help="with --from: how many checkpoints (paper: 5, big: 20)")
    parser.add_argument("--output", required=True, help="folder for the averaged model")


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from ..training.averaging import average_checkpoints, last_checkpoints

    folders = list(args.checkpoints)
    if args.run_dir and args.last < 1:
        raise ValueError(f"--last {args.last}: average at least 1 checkpoint of {args.run_dir}")
    if args.run_dir:
        folders += last_checkpoints(args.run_dir, args.last)
    if not folders:
        raise ValueError(
            "no checkpoints: name checkpoint folders, or --from a training folder that has checkpoint-N in it"
        )
    average_checkpoints(folders).save_pretrained(args.output)
    try:
        AutoTokenizer.from_pretrained(folders[-1]).save_pretrained(args.output)
    except (OSError, ValueError):
        print("note: no tokenizer in the checkpoints; copy it next to the averaged model", file=sys.stderr)
    print(f"averaged {len(folders)} checkpoints into {args.output}")
