"""The FSDP2 test's sharded run, many times over: how often a rank fails (a gloo teardown abort was seen about 1 run in
16), with the end of each failing run's output.

    python -m benchmarks.fsdp_teardown --runs 50 --json docs/results/fsdp-teardown-cpu.json

Each run is the command `tests/test_multi_node.py::test_fsdp2_shards_our_model_on_the_cpu_as_one_process_computes_it`
launches: `tests/workers/fsdp_worker.py` under torchrun with 2 processes, on the reversal model the tests train.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT, record


WORKER = ROOT / "tests" / "workers" / "fsdp_worker.py"
TIMEOUT = 600  # seconds: a run that hangs counts as failed


def run_once(scratch: Path, reversal: Path, number: int) -> dict:
    from tests.conftest import torchrun

    output = scratch / f"run-{number}"
    output.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    try:
        completed = subprocess.run(
            [*torchrun(2), str(WORKER), str(output), "sharded", str(reversal)],
            env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        code, tail = completed.returncode, (completed.stdout + completed.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = None, f"no end after {TIMEOUT} s"
    seconds = round(time.perf_counter() - started, 1)
    wrote = (output / "fsdp.json").is_file()
    return {"run": number, "exit_code": code, "seconds": seconds, "wrote_result": wrote} | (
        {"output_tail": tail} if code != 0 else {}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.conftest import save_reversal_model

    results = []
    with tempfile.TemporaryDirectory() as scratch:
        reversal = Path(scratch) / "reversal"
        save_reversal_model(reversal)
        for number in range(1, args.runs + 1):
            results.append(run_once(Path(scratch), reversal, number))
            failed = sum(result["exit_code"] != 0 for result in results)
            print(f"run {number}: exit {results[-1]['exit_code']} ({failed} failed of {number})", flush=True)
            if args.json:  # after every run: a loop that is stopped keeps what it ran
                document = {**record("benchmarks.fsdp_teardown", results), "failed": failed}
                args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
