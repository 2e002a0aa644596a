"""The `hf-vanilla` command line: one module per subcommand, each with `add_arguments(parser)` and `run(args)`.

Every user-facing action of hf_vanilla is a subcommand; `hf-vanilla COMMAND --help` describes each. A mistake (a
missing or wrong-shaped file, a bad option, data or a tokenizer that does not fit) ends the command with one line,
`hf-vanilla COMMAND: error: what and the fix`, and exit status 2; `hf-vanilla --debug COMMAND ...` (or
HF_VANILLA_DEBUG=1) shows the traceback instead.
"""

import argparse
import importlib
import os
import sys

from huggingface_hub.errors import StrictDataclassError

from ..env import extra_providing


# The installed product. The benchmarks (MarianMT comparisons, synthetic corpora, the results under docs/) are the lab:
# `python -m benchmarks.NAME` from a clone, not a subcommand of the wheel.
COMMANDS = ("train", "translate", "average", "convert", "export", "publish", "tokenizer", "env")
# What a user's mistake raises (bad values, an invalid config, missing files or models, a missing optional
# dependency), as opposed to a fault of ours, which keeps its traceback.
USER_ERRORS = (ValueError, StrictDataclassError, OSError, ImportError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vanilla", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (or HF_VANILLA_DEBUG=1)")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        subparser = subcommands.add_parser(
            name,
            help=module.__doc__.splitlines()[0],
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            add_help=not getattr(module, "PASSES_OPTIONS_THROUGH", False),
        )
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run, passes_options_through=getattr(module, "PASSES_OPTIONS_THROUGH", False))
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, options = parser.parse_known_args(argv)
    if options and not args.passes_options_through:
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    args.options = options
    try:
        args.run(args)
    except USER_ERRORS as error:
        if args.debug or os.environ.get("HF_VANILLA_DEBUG", "") not in ("", "0"):
            raise
        if isinstance(error, StrictDataclassError) and error.__cause__:  # a config's check: its own message
            error = error.__cause__
        message = " ".join(str(error).split()) or type(error).__name__  # one line, however the error was written
        if isinstance(error, ModuleNotFoundError) and error.name:
            extra = extra_providing(error.name.split(".")[0])
            if extra is not None:
                message = f"this command needs the [{extra}] extra: pip install 'hf-vanilla[{extra}]' ({message})"
        sys.stderr.write(f"hf-vanilla {args.command}: error: {message}\n")
        sys.exit(2)
