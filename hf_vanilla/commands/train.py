"""Train a translation model with the paper's recipe.

    hf-vanilla train --config RECIPE.yaml [--OPTION VALUE ...]

Every field of the recipe and of transformers' Seq2SeqTrainingArguments is an option (`hf-vanilla train --help`
lists them); a YAML file gives the defaults. Under Accelerate: accelerate launch -m hf_vanilla train --config ...
Without a launcher or an accelerator, `cpu_processes: N` makes it start itself as N processes (training/launcher.py).
"""

import argparse
import signal
import sys


PASSES_OPTIONS_THROUGH = True  # the training options are parsed by transformers' HfArgumentParser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None of its own: `run` hands every option to the recipe's parser."""


def run(args: argparse.Namespace) -> None:
    from accelerate import PartialState

    from ..training import TrainingInterrupted, parse_arguments, run_training
    from ..training.launcher import launch, processes_to_launch

    recipe, training_args = parse_arguments(args.options)  # every option checked before any process starts
    processes = processes_to_launch(recipe.cpu_processes)
    if processes > 1:
        sys.exit(launch(processes, args.options, recipe.max_tokens))
    try:
        run_training(recipe, training_args)
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)  # the shell's convention for "terminated by SIGTERM"
    # Every rank leaves together and closes its process group itself: a gloo group left to the interpreter's
    # teardown aborted a rank that finished first while the main one still wrote the run (SIGABRT, "terminate
    # called without an active exception", in CI).
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()
