"""The quickstart recipe searched for a time budget, on the validation split only.

    python -m benchmarks.budget_search --updates 800 --arms wsd wsd-decay0.6 --json docs/results/budget-search-cpu.json

Each arm is the README's main job (`configs/quickstart.yaml`) with some options changed, trained for `--minutes` of
wall time or for `--updates` updates. A machine's speed drifts from one run to the next, so arms that cost the same per
update compare best at equal updates: the count a budget buys on the machine. Evaluation during training is off, so
that every arm spends its budget on updates alone; at the end the recipe scores its last and its averaged weights on
the whole validation split (greedy) and keeps the better: that score is the arm's. The test split is cut to 8
sentences: nothing here looks at it. Arms run one after another, sharing the data cache; nothing else should share the
machine. `--json` is rewritten after every run, adding to what it already holds.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import ROOT, markdown, record


# Options over configs/quickstart.yaml. "today" is the recipe of d6f7dae: inverse square root with 400 updates of
# warmup, the last 3 checkpoints averaged (the final choice between the average and the last weights is this code's).
TODAY = ["--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", "400", "--lr_scheduler_kwargs", "{}"]
WSD = ["--lr_scheduler_type", "budget", "--warmup_steps", "200"]
WSD += ["--lr_scheduler_kwargs", '{"decay_share": 0.4}']
ARMS = {
    "today": TODAY,
    "wsd": WSD,
    "wsd-lr3e-3": [*WSD, "--learning_rate", "0.003"],
    "wsd-lr1e-3": [*WSD, "--learning_rate", "0.001"],
    "wsd-warmup100": [*WSD, "--warmup_steps", "100"],
    "wsd-decay0.6": [*WSD, "--lr_scheduler_kwargs", '{"decay_share": 0.6}'],
    "wsd-decay0.2": [*WSD, "--lr_scheduler_kwargs", '{"decay_share": 0.2}'],
    "wsd-linear": [*WSD, "--lr_scheduler_kwargs", '{"decay_share": 0.4, "decay_type": "linear"}'],
    "wsd-tokens4096": [*WSD, "--max_tokens", "4096"],
    "wsd-vocab6000": [*WSD, "--vocab_size", "6000"],
    "wsd-ls0": [*WSD, "--label_smoothing_factor", "0"],
    "wsd-dropout0": WSD,
    "wsd-decay1.0": [*WSD, "--lr_scheduler_kwargs", '{"decay_share": 1.0}'],
    # The recipe as configs/quickstart.yaml has it at the commit that runs the arm, and its preset's dropout.
    "recipe": [],
    "recipe-dropout0.05": [],
    "recipe-dropout0.1": [],
}
# Arms that change the model preset (configs/quickstart_model.json): the fields they set.
MODEL_CHANGES = {"wsd-dropout0": {"dropout": 0.0}, "recipe-dropout0.05": {"dropout": 0.05}}
MODEL_CHANGES["recipe-dropout0.1"] = {"dropout": 0.1}
SEARCH = ["--eval_strategy", "no", "--max_eval_examples", "1014", "--max_test_examples", "8", "--test_num_beams", "1"]
SEARCH += ["--translate_examples", "0", "--report_to", "none", "--disable_tqdm", "true"]


def arm_options(arm: str, scratch: Path) -> list[str]:
    """The arm's options; for an arm that changes the model preset, the changed preset is written into `scratch`."""
    if arm not in MODEL_CHANGES:
        return ARMS[arm]
    preset = json.loads((ROOT / "configs" / "quickstart_model.json").read_text()) | MODEL_CHANGES[arm]
    path = scratch / f"{arm}-model.json"
    path.write_text(json.dumps(preset))
    return [*ARMS[arm], "--model_config", str(path)]


def describe(arm: str) -> str:
    changes = " ".join(f"{key}={value}" for key, value in MODEL_CHANGES.get(arm, {}).items())
    return " ".join(ARMS[arm]) + (f" (model preset: {changes})" if changes else "")


def run_arm(arm: str, seed: int, budget: tuple[float | None, int | None], output: Path, threads: int | None) -> dict:
    """Train one arm for `budget` (minutes, or else updates) on `threads` threads (default: torch's choice); what
    its validation split says of the kept weights."""
    minutes, updates = budget
    limit = (
        ["--max_train_minutes", str(minutes)]
        if minutes
        else ["--max_steps", str(updates), "--max_train_minutes", "600"]
    )
    options = [*limit, "--seed", str(seed), *SEARCH, *arm_options(arm, output.parent)]
    command = [sys.executable, "-m", "hf_vanilla", "train", "--config", "configs/quickstart.yaml", *options]
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with (output.parent / f"{output.name}.log").open("w") as log:
        subprocess.run([*command, "--output_dir", str(output)], cwd=ROOT, env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)  # fmt: skip
    scores = json.loads((output / "test_scores.json").read_text())
    validation = {name: scores.get(f"validation_bleu_{name}") for name in ("last", "averaged")}
    return {
        "arm": arm,
        "options": describe(arm),
        "seed": seed,
        "minutes": minutes,
        "max_steps": None if minutes else updates,
        "updates": scores["global_step"],
        "validation_bleu": max(value for value in validation.values() if value is not None),
        "validation_bleu_last": validation["last"],
        "validation_bleu_averaged": validation["averaged"],
        "final_weights": scores["final_weights"],
        "hardware": scores["hardware"],
    }


def search_table(results: list[dict]) -> str:
    """One row per run, best validation BLEU first within each budget."""

    def budget(run: dict) -> str:
        return f"{run['minutes']:g} min" if run["minutes"] else f"{run['max_steps']} updates"

    ordered = sorted(results, key=lambda run: (budget(run), -run["validation_bleu"]))
    rows = [
        [budget(run), run["arm"], str(run["seed"]), str(run["updates"]), f"{run['validation_bleu']:.2f}",
         f"{run['validation_bleu_last']:.2f}", f"{run['validation_bleu_averaged'] or 0:.2f}", run["final_weights"],
         f"`{run['options'].strip() or 'the recipe as its commit has it'}`"]
        for run in ordered
    ]  # fmt: skip
    header = ["budget", "arm", "seed", "updates", "validation BLEU", "last", "averaged", "kept", "options"]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), required=True)
    parser.add_argument("--minutes", type=float, nargs="+", default=[])
    parser.add_argument("--updates", type=int, nargs="+", default=[])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, help="threads per run: 1 for two searches side by side")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        budgets = [(minutes, None) for minutes in args.minutes] + [(None, updates) for updates in args.updates]
        for budget in budgets:
            for seed in args.seeds:
                for arm in args.arms:
                    output = Path(scratch) / f"{arm}-{budget[0] or budget[1]}-seed{seed}"
                    document = record("benchmarks.budget_search", [run_arm(arm, seed, budget, output, args.threads)])
                    run = document["results"][0] | {"command": document["command"], "commit": document["commit"]}
                    results.append(run)
                    print(json.dumps(run), flush=True)
                    if args.json:
                        add_run(args.json, document, run)
    print(search_table(results))


def add_run(path: Path, document: dict, run: dict) -> None:
    """Adds `run` to the results at `path`, read again just before: two searches side by side share one file."""
    earlier = json.loads(path.read_text())["results"] if path.exists() else []
    path.write_text(json.dumps(document | {"results": [*earlier, run]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
