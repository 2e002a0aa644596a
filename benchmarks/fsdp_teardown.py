"""The FSDP2 test, many times over: how often it fails (a rank aborting at gloo's teardown was seen about 1 run in
16), with the end of each failing run's output.

    python -m benchmarks.fsdp_teardown --runs 50 --json docs/results/fsdp-teardown-cpu.json

Each run is pytest on `TEST` alone, in one process (`-n 0`): the reversal model it needs comes from the build cache
after the first run, then one process and two under torchrun run `tests/workers/fsdp_worker.py`, and the test
compares them.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT, record


TEST = "tests/test_multi_node.py::test_fsdp2_shards_our_model_on_the_cpu_as_one_process_computes_it"
TIMEOUT = 900  # seconds: a run that hangs counts as failed


def run_once(number: int) -> dict:
    started = time.perf_counter()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", "0", TEST], cwd=ROOT, capture_output=True, text=True,
            timeout=TIMEOUT,
        )  # fmt: skip
        code, tail = completed.returncode, (completed.stdout + completed.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        code, tail = None, f"no end after {TIMEOUT} s"
    seconds = round(time.perf_counter() - started, 1)
    return {"run": number, "exit_code": code, "seconds": seconds} | ({"output_tail": tail} if code != 0 else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for number in range(1, args.runs + 1):
        results.append(run_once(number))
        failed = sum(result["exit_code"] != 0 for result in results)
        print(f"run {number}: exit {results[-1]['exit_code']} ({failed} failed of {number})", flush=True)
        if args.json:  # after every run: a loop that is stopped keeps what it ran
            document = {**record("benchmarks.fsdp_teardown", results), "failed": failed}
            args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
