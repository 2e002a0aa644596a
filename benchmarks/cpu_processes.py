"""One training process of all the cores' threads against one process per core, at the quickstart shape.

    python -m benchmarks.cpu_processes --rounds 2 --json docs/results/cpu-processes-cpu.json

The README's main job trains as 1 process of 2 threads (`--cpu_processes 1`) or as 2 processes of 1 thread each,
data-parallel over gloo through Accelerate (`--cpu_processes 2`, which `hf-vanilla train` launches itself), with the
same tokens an update (2048: 1 x 2048 or 2 x 1024). Each arm trains the same `--updates` with no evaluation and no
checkpoint, alternating arms round by round so that a drift of the machine hits both; the rate is the Trainer's
`train_steps_per_second` (the training loop alone, start-up excluded). Nothing else should share the machine.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import ROOT, markdown, record


ARMS = {"1 process x all threads": 1, "1 process per core, 1 thread each": 0}  # 0: as many processes as cores


def train_rate(cpu_processes: int, updates: int, output: Path) -> dict:
    """Train the quickstart recipe for `updates` updates as `cpu_processes` processes; the loop's rate."""
    command = [sys.executable, "-m", "hf_vanilla", "train", "--config", "configs/quickstart.yaml"]
    command += ["--max_steps", str(updates), "--eval_strategy", "no", "--save_strategy", "no", "--average_last", "0"]
    command += [
        "--max_test_examples",
        "8",
        "--test_num_beams",
        "1",
        "--translate_examples",
        "0",
        "--report_to",
        "none",
    ]
    command += ["--disable_tqdm", "true", "--cpu_processes", str(cpu_processes), "--output_dir", str(output)]
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # each arm's own threads
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    metrics = [json.loads(line.replace("'", '"')) for line in result.stdout.splitlines() if "'train_runtime'" in line]
    scores = json.loads((output / "test_scores.json").read_text())
    return {
        "updates": scores["global_step"],
        "train_runtime_s": float(metrics[-1]["train_runtime"]),
        "updates_per_s": float(metrics[-1]["train_steps_per_second"]),
        "hardware": scores["hardware"],
    }


def rate_table(results: list[dict]) -> str:
    """Each arm's rate in every round, its mean, and the mean against the first arm's."""
    rows, first = [], None
    for arm in dict.fromkeys(result["arm"] for result in results):
        runs = [result for result in results if result["arm"] == arm]
        mean = sum(run["updates_per_s"] for run in runs) / len(runs)
        first = first or mean
        rounds = ", ".join(f"{run['updates_per_s']:.3f}" for run in runs)
        rows.append(
            [arm, f"{runs[0]['processes']} x {runs[0]['threads']}", rounds, f"{mean:.3f}", f"{mean / first:.2f}x"]
        )
    return markdown(["arm", "processes x threads", "updates/s, each round", "mean", "against the first"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for arm, processes in ARMS.items():
                processes = processes or cores
                rate = train_rate(processes, args.updates, Path(scratch) / f"{round_}-{processes}")
                results.append({"arm": arm, "processes": processes, "threads": cores // processes, **rate})
                print(json.dumps(results[-1]), flush=True)
    print(rate_table(results))
    if args.json:
        document = record("benchmarks.cpu_processes", results)
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
