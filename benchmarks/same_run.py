"""Whether a change left an uninterrupted run as it was: the main job's recipe at a fixed number of updates (no clock
decides anything), trained by the code of two commits, compared update by update.

    python -m benchmarks.same_run --before c193ad9 --json docs/results/same-run-cpu.json

Each commit is checked out into a scratch folder (`git worktree`) and runs `hf-vanilla train --config
configs/quickstart.yaml` with `OPTIONS` (its own recipe file: a commit that renamed a key reads its own spelling).
What is compared: the learning rate logged at every update, every logged loss, the weights the run ships (`final/`)
and which weights it chose. The time budget is set far beyond the run, so progress counts updates alone.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks import ROOT, commit_of, markdown, record


OPTIONS = ["--max_steps", "120", "--max_train_minutes", "600", "--warmup_steps", "20", "--max_train_examples", "3000"]
OPTIONS += ["--eval_steps", "60", "--save_steps", "60", "--logging_steps", "1", "--max_test_examples", "50"]
OPTIONS += ["--disable_tqdm", "true"]


def train(checkout: Path, output: Path, cache: Path) -> dict:
    """The recipe trained by the code in `checkout`: its logged values by name and update, its final weights."""
    command = [sys.executable, "-m", "hf_vanilla", "train", "--config", "configs/quickstart.yaml", *OPTIONS]
    command += ["--output_dir", str(output), "--data_cache_dir", str(cache)]
    subprocess.run(command, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, check=True)
    logged: dict[str, dict[int, float]] = {}
    with open(output / "log.csv", newline="") as log:
        for row in csv.DictReader(log):
            logged.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
    scores = json.loads((output / "test_scores.json").read_text())
    return {"logged": logged, "weights": load_file(output / "final" / "model.safetensors"), "scores": scores}


def compare(before: dict, after: dict) -> dict:
    rates, losses = (before["logged"][name] for name in ("learning_rate", "loss"))
    weights = before["weights"]
    return {
        "updates": len(rates),
        "learning_rates_identical": rates == after["logged"]["learning_rate"],
        "losses_identical": losses == after["logged"]["loss"],
        "final_weights_identical": weights.keys() == after["weights"].keys()
        and all(torch.equal(weights[key], after["weights"][key]) for key in weights),
        "final_weights": [before["scores"]["final_weights"], after["scores"]["final_weights"]],
        "test_bleu": [before["scores"]["test_bleu"], after["scores"]["test_bleu"]],
    }


def table(document: dict) -> str:
    rows = []
    for result in document["results"]:
        same = ("learning_rates_identical", "losses_identical", "final_weights_identical")
        rows.append(
            [f"{result['before']} -> {result['after']}", str(result["updates"])]
            + ["identical" if result[key] else "**differ**" for key in same]
            + [" / ".join(f"{bleu:.2f}" for bleu in result["test_bleu"])]
        )
    header = ["commits", "updates", "learning rate at every update", "loss at every update", "final weights",
              "test2016 BLEU (50 sentences), before / after"]  # fmt: skip
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = {}
        for name, revision in (("before", args.before), ("after", args.after)):
            checkout = Path(scratch) / name
            add = ["git", "worktree", "add", "--quiet", "--detach", str(checkout), revision]
            subprocess.run(add, cwd=ROOT, check=True)
            try:
                runs[name] = train(checkout, Path(scratch) / f"{name}-run", Path(scratch) / "cache")
                runs[f"{name}_commit"] = commit_of(checkout)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=ROOT, check=True)
    result = {"before": runs["before_commit"][:7], "after": runs["after_commit"][:7], "options": " ".join(OPTIONS)}
    result |= compare(runs["before"], runs["after"])
    document = record("benchmarks.same_run", [result])
    print(table(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
