"""Show the installed versions of the libraries hf_vanilla runs on, and whether each is in the tested range.

    hf-vanilla env            # the table
    hf-vanilla env --check    # and exit 1 if Python, torch, transformers, datasets, tokenizers or accelerate is
                              # outside its tested range (CI's range legs run it)

The range of a library runs from the floor in hf-vanilla's requirements to the newest release tested (the lock
that the README's commands install); CI runs the library tests at both ends.
"""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="exit 1 if an axis is outside its tested range")


def run(args: argparse.Namespace) -> None:
    from ..env import outside_the_tested_range, report

    print(report())
    outside = outside_the_tested_range() if args.check else []
    if outside:
        sys.exit("hf-vanilla env --check: outside the tested range: " + "; ".join(outside))
