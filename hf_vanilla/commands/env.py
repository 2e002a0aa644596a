"""Show the installed versions of the libraries hf_vanilla runs on, and whether each is in the tested range.

    hf-vanilla env

The range of a library runs from the floor in hf-vanilla's requirements to the newest release tested (the lock
that the README's commands install); CI runs the library tests at both ends.
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> None:
    from ..env import report

    print(report())
