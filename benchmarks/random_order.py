"""The suite in a random order and placement, several times: what finds a test that passes only after (or without)
another, or only on a worker that ran a third.

    pip install pytest-randomly   # not a test dependency: where it is installed it shuffles every run
    python -m benchmarks.random_order --runs 5 --json docs/results/random-order-cpu.json

Each run shuffles the modules and their tests with a seed of its own (pytest-randomly, which also reseeds `random`,
numpy and torch from it) and hands tests to the workers as they free up (`--dist worksteal`), without pytest's cache
(no last-failed-first). A failure is reproduced with the recorded seed: `python -m pytest -p randomly
-p no:cacheprovider --dist worksteal --randomly-seed=SEED`. The checkout must be clean: the record names its commit.
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from benchmarks import ROOT, record


ORDER_OPTIONS = ["-p", "randomly", "-p", "no:cacheprovider", "--dist", "worksteal"]


def outcome(junit: Path) -> dict:
    """Counts of a run's JUnit report, and the ids of the tests that failed or errored."""
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(f"{case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failed}


def run_once(seed: int, scratch: Path) -> dict:
    junit = scratch / f"run-{seed}.xml"
    command = [sys.executable, "-m", "pytest", "-q", *ORDER_OPTIONS, f"--randomly-seed={seed}", f"--junitxml={junit}"]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if not junit.is_file():
        raise SystemExit(f"pytest wrote no report (exit {completed.returncode}):\n{completed.stdout[-3000:]}")
    return {"seed": seed, "exit_code": completed.returncode, "seconds": round(seconds, 1), **outcome(junit)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        import pytest_randomly  # noqa: F401
    except ImportError:
        raise SystemExit("pytest-randomly is not installed: `pip install pytest-randomly` first.") from None
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    if changed.strip():
        raise SystemExit(f"The checkout has uncommitted changes, which the record could not name:\n{changed}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.runs):
            results.append(run_once(random.SystemRandom().randrange(2**32), Path(scratch)))
            print(json.dumps(results[-1]), flush=True)
            if args.json:  # after every run: a long series that is stopped keeps what it ran
                args.json.write_text(json.dumps(record("benchmarks.random_order", results), indent=1) + "\n")


if __name__ == "__main__":
    main()
