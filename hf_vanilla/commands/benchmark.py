"""Speed and memory against MarianMT of identical shape and weights (from a source checkout).

    hf-vanilla benchmark [--preset small] [--threads 2] ...

The benchmark is lab code kept in the source repository (`benchmarks/`), not in the wheel: run this from a clone
(with `pip install -e '.[bench]'`). Its options are those of `benchmarks/benchmark.py --help`.
"""

import argparse
import runpy
import sys
from pathlib import Path


PASSES_OPTIONS_THROUGH = True  # the benchmark's own parser reads them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None of its own: `run` hands every option to the benchmark's parser."""


def benchmark_script() -> Path:
    """`benchmarks/benchmark.py` of the checkout this package is installed from, or of the current directory."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        script = root / "benchmarks" / "benchmark.py"
        if script.is_file():
            return script
    raise SystemExit(
        "error: the benchmark lives in the source repository (benchmarks/benchmark.py), not in the installed "
        "package; run `hf-vanilla benchmark` from a clone of hf_vanilla."
    )


def run(args: argparse.Namespace) -> None:
    script = benchmark_script()
    sys.argv = [str(script), *args.options]
    sys.path.insert(0, str(script.parents[1]))  # the benchmark imports its siblings as `benchmarks.*`
    runpy.run_path(str(script), run_name="__main__")
