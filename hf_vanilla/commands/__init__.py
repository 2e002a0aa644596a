"""The `hf-vanilla` command line: one module per subcommand, each with `add_arguments(parser)` and `run(args)`.

Every user-facing action of hf_vanilla is a subcommand; `hf-vanilla COMMAND --help` describes each.
"""

import argparse
import importlib


COMMANDS = ("train", "translate", "average", "convert", "export", "publish", "tokenizer", "benchmark")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vanilla", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    args.run(args)
