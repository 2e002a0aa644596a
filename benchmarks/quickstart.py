"""The README's main job, as a user runs it: a fresh clone of the committed code, fresh data caches, the quickstart
recipe (10 minutes of training on Multi30k En->De, then test2016 with beam search), once per seed and precision;
`--minutes` sets another budget (a machine that much slower), `--commit` runs an earlier recipe (its code and
config) beside today's.

    python -m benchmarks.quickstart --seeds 1 2 3 --bf16-seeds 1 --json docs/results/quickstart-cpu.json
    python -m benchmarks.quickstart --minutes 5 --commit d6f7dae --json docs/results/quickstart-cpu.json  # adds runs

Each result keeps the test scores the recipe wrote, the updates the 10-minute budget allowed (on a faster machine
more updates, so a higher BLEU: the budget makes the score follow the machine), every validation evaluation from
`log.csv`, and the wall time of the whole job. Runs go one after another; nothing else should share the machine.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import commit_of, fresh_clone, record


def validation_curve(log_csv: Path) -> list[dict]:
    """Every validation evaluation of the run: step, loss, BLEU, chrF (greedy, the recipe's validation sample)."""
    evaluations: dict[int, dict] = {}
    with log_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["name"] in ("eval_loss", "eval_bleu", "eval_chrf"):
                evaluations.setdefault(int(row["step"]), {"step": int(row["step"])})[row["name"]] = float(row["value"])
    return [evaluations[step] for step in sorted(evaluations)]


def run_main_job(clone: Path, seed: int, bf16: bool, minutes: float, work: Path, extra: list[str]) -> dict:
    output = work / f"seed{seed}-{'bf16' if bf16 else 'fp32'}-{minutes:g}min"
    command = ["hf-vanilla", "train", "--config", "configs/quickstart.yaml", "--seed", str(seed)]
    command += ["--output_dir", str(output), "--bf16", str(bf16).lower(), "--max_train_minutes", f"{minutes:g}"]
    command += extra
    env = {
        **os.environ,
        "PYTHONPATH": str(clone),  # the clone's code, whatever checkout the environment was installed from
        "HF_DATASETS_CACHE": str(output / "datasets-cache"),  # so BPE and tokenizing run, as on a fresh machine
        "PYTHONUNBUFFERED": "1",
    }
    started = time.perf_counter()
    with (work / f"{output.name}.log").open("w") as log:
        subprocess.run([sys.executable, "-m", "hf_vanilla", *command[1:]], cwd=clone, env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)  # fmt: skip
    whole_job = time.perf_counter() - started
    scores = json.loads((output / "test_scores.json").read_text())
    return {
        "commit": commit_of(clone),
        "minutes": minutes,
        "seed": seed,
        "bf16": bf16,
        "command": " ".join(command),
        "updates": scores["global_step"],
        "train_wall_s": scores["train_wall_seconds"],
        "whole_job_wall_s": round(whole_job, 1),
        "test": {key: scores[key] for key in ("test_bleu", "test_chrf", "bleu_raw_references", "test_nll")},
        "bleu_signature": scores["bleu_signature"],
        "validation": validation_curve(output / "log.csv"),
        "final_weights": scores.get("final_weights", "averaged"),  # before the choice, always the average
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--bf16-seeds", type=int, nargs="*", default=[], help="seeds to run again under --bf16")
    parser.add_argument("--minutes", type=float, default=10.0, help="the training budget (--max_train_minutes)")
    parser.add_argument("--commit", help="run this commit's recipe instead of the checkout's (e.g. d6f7dae)")
    parser.add_argument("--json", type=Path, help="results file; runs already in it are kept")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="more training options after --: -- --max_steps 20")
    parser.add_argument("--work", type=Path, help="keep the clone and runs here (default: removed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        clone = fresh_clone(work)
        if args.commit:
            subprocess.run(["git", "checkout", "--quiet", args.commit], cwd=clone, check=True)
        runs = [(seed, False) for seed in args.seeds] + [(seed, True) for seed in args.bf16_seeds]
        results = json.loads(args.json.read_text())["results"] if args.json and args.json.exists() else []
        for seed, bf16 in runs:
            result = run_main_job(clone, seed, bf16, args.minutes, work, [o for o in args.extra if o != "--"])
            print(json.dumps({k: v for k, v in result.items() if k != "validation"}), flush=True)
            results.append(result)
            if args.json:  # after every run, so that a later failure keeps the runs before it
                document = record("benchmarks.quickstart", results, checkout=clone)
                args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
