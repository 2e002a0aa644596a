"""What `--muon` costs an update: the main job's training step with AdamW against the same step with Muon for the 2-D
weight matrices (AdamW for the rest), on the same model, batches and threads, through the Trainer's real path
(`training_step.update_steps`: forward and backward, clipping, the optimizer and scheduler steps).

Calls alternate (AdamW, Muon, AdamW, ...) after one warm-up call each, each call the same `--batches` batches; the
ratio is Muon's median seconds over AdamW's: the share of updates a time budget buys with Muon is its inverse, and a
search at equal updates compares the two at equal time only after that correction.

    python -m benchmarks.optimizer_step --threads 2 --json docs/results/optimizer-step-cpu.json
"""

import argparse
import copy
import itertools
import json
import statistics
import tempfile

from transformers import Seq2SeqTrainingArguments

from benchmarks import markdown, record
from benchmarks.benchmark import alternate
from benchmarks.training_step import RECIPE, SHAPES, main_job_setting, trainer_for, update_steps


def run(threads: int, repeats: int, batches: int) -> dict:
    tokenizer, models, dataset = main_job_setting("quickstart", threads)
    model = models["ours"]
    steps = {}
    with tempfile.TemporaryDirectory() as output:
        args = Seq2SeqTrainingArguments(output_dir=output, use_cpu=True, report_to=[], **RECIPE)
        for name, muon in (("adamw", False), ("muon", True)):
            trainer = trainer_for(copy.deepcopy(model), tokenizer, dataset, args, muon=muon)
            chosen = list(itertools.islice(trainer.get_train_dataloader(), batches))
            steps[name] = update_steps(trainer, chosen)
        seconds = alternate(steps, repeats, "cpu")
    median = {name: statistics.median(values) / batches for name, values in seconds.items()}
    return {
        "shape": {**SHAPES["quickstart"], "vocab": len(tokenizer)},
        "threads": threads,
        "batches": batches,
        "repeats": repeats,
        "seconds_per_update": {
            name: {"median": median[name], "all": [s / batches for s in seconds[name]]} for name in seconds
        },
        "muon_over_adamw": median["muon"] / median["adamw"],
    }


def table(results: list[dict]) -> str:
    rows = [
        [
            str(result["threads"]),
            f"{1000 * result['seconds_per_update']['adamw']['median']:.0f}",
            f"{1000 * result['seconds_per_update']['muon']['median']:.0f}",
            f"{result['muon_over_adamw']:.2f}x",
        ]
        for result in results
    ]
    return markdown(["threads", "AdamW ms/update", "Muon ms/update", "Muon / AdamW"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=10, help="updates per timed call")
    parser.add_argument("--json", help="write the results here (docs/results/...)")
    args = parser.parse_args()
    result = run(args.threads, args.repeats, args.batches)
    print(table([result]))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(record("benchmarks.optimizer_step", [result]), file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
