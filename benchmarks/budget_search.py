"""A recipe searched for a time budget, on the validation split only.

    python -m benchmarks.budget_search --updates 800 --arms wsd wsd-decay0.6 --json docs/results/budget-search-cpu.json
    python -m benchmarks.budget_search --config configs/quickstart.yaml --options "--data multi30k-tok" \
        --updates 6000 --arms model.dropout=0.1 model.dropout=0.3,label_smoothing_factor=0.2

Each arm is a recipe (`--config`, default the README's main job, `configs/quickstart.yaml`, with `--options` added to
every arm) with some options changed, trained for `--minutes` of wall time or for `--updates` updates. An arm is one
of `ARMS` by name, or written out: `key=value` pairs joined by commas, each a recipe option (`max_tokens=4096`) or,
as `model.key=value`, a field of the recipe's model preset (`model.dropout=0.3`). A machine's speed drifts from one
run to the next, so arms that cost the same per update compare best at equal updates: the count a budget buys on the
machine. Evaluation during training is off, so that every arm spends its budget on updates alone; at the end the
recipe scores its last and its averaged weights on the whole validation split (greedy) and keeps the better: that
score is the arm's. The test split is cut to 8 sentences: nothing here looks at it. Arms run one after another,
sharing the data cache; with `--minutes`, nothing else should share the machine; with `--updates` and `--threads 1`,
two searches run side by side alike. `--json` is rewritten after every run, adding to what it already holds. Runs
go to a temporary folder, or to `--workdir`, where a search cut short resumes each run from its last checkpoint:
a run bounded in updates ends exactly as one never stopped.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from benchmarks import ROOT, markdown, record


QUICKSTART = ROOT / "configs" / "quickstart.yaml"


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


def arm_changes(arm: str) -> tuple[list[str], dict]:
    """The recipe options and the model preset's fields an arm changes: a named arm's, or those it spells out."""
    if arm in ARMS:
        return ARMS[arm], MODEL_CHANGES.get(arm, {})
    options, model = [], {}
    for change in arm.split(","):
        key, separator, value = change.partition("=")
        if not separator or not key:
            raise ValueError(f"arm {arm!r}: {change!r} is not key=value; known arms: {sorted(ARMS)}")
        if key.startswith("model."):
            model[key.removeprefix("model.")] = yaml.safe_load(value)
        else:
            options += [f"--{key}", value]
    return options, model


def arm_options(arm: str, config: Path, scratch: Path) -> list[str]:
    """The arm's options; for an arm that changes the model preset of `config`, the changed preset is written into
    `scratch`."""
    options, model = arm_changes(arm)
    if not model:
        return options
    preset_path = ROOT / yaml.safe_load(config.read_text())["model_config"]
    path = scratch / f"{hashlib.sha256(arm.encode()).hexdigest()[:12]}-model.json"
    path.write_text(json.dumps(json.loads(preset_path.read_text()) | model))
    return [*options, "--model_config", str(path)]


def describe(arm: str) -> str:
    options, model = arm_changes(arm)
    changes = " ".join(f"{key}={value}" for key, value in model.items())
    return " ".join([*options, *([f"(model preset: {changes})"] if changes else [])])


def train_command(
    arm: str, seed: int, budget: tuple[float | None, int | None], output: Path, config: Path, common: Sequence[str]
) -> list[str]:
    """The command that trains one arm of the recipe `config` (with the `common` options) for `budget` (minutes, or
    else updates) into `output`, from its last checkpoint where an earlier search left some there."""
    minutes, updates = budget
    limit = (
        ["--max_train_minutes", str(minutes)]
        if minutes
        else ["--max_steps", str(updates), "--max_train_minutes", "600"]
    )
    options = [*limit, "--seed", str(seed), *SEARCH, *common, *arm_options(arm, config, output.parent)]
    if any(output.glob("checkpoint-*")):
        options += ["--resume_from_checkpoint", "last"]
    options += ["--output_dir", str(output)]
    return [sys.executable, "-m", "hf_vanilla", "train", "--config", str(config), *options]


def run_arm(
    arm: str,
    seed: int,
    budget: tuple[float | None, int | None],
    output: Path,
    threads: int | None,
    config: Path = QUICKSTART,
    common: Sequence[str] = (),
) -> dict:
    """Train one arm (`train_command`) on `threads` threads (default: torch's choice); what its validation split says
    of the kept weights."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with (output.parent / f"{output.name}.log").open("a") as log:  # a resumed run's log follows the first part's
        subprocess.run(train_command(arm, seed, budget, output, config, common), cwd=ROOT, env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)  # fmt: skip
    minutes, updates = budget
    scores = json.loads((output / "test_scores.json").read_text())
    validation = {name: scores.get(f"validation_bleu_{name}") for name in ("last", "averaged")}
    return {
        "arm": arm,
        "options": " ".join([*common, describe(arm)]),
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
    parser.add_argument("--arms", nargs="+", required=True, help=f"named ({', '.join(ARMS)}) or key=value,...")
    parser.add_argument("--config", type=Path, default=QUICKSTART, help="the recipe the arms change")
    parser.add_argument("--options", default="", help="recipe options every arm gets, as one string")
    parser.add_argument("--minutes", type=float, nargs="+", default=[])
    parser.add_argument("--updates", type=int, nargs="+", default=[])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, help="threads per run: 1 for two searches side by side")
    parser.add_argument("--workdir", type=Path, help="where the runs go and, cut short, resume (default: temporary)")
    args = parser.parse_args()
    for arm in args.arms:
        arm_changes(arm)  # a misspelt arm stops here, not after the runs before it
    results = []
    with contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory() as workdir:
        scratch = Path(workdir)
        scratch.mkdir(parents=True, exist_ok=True)
        budgets = [(minutes, None) for minutes in args.minutes] + [(None, updates) for updates in args.updates]
        for budget in budgets:
            for seed in args.seeds:
                for arm in args.arms:
                    name = hashlib.sha256(f"{args.options} {arm}".encode()).hexdigest()[:12]
                    output = scratch / f"{name}-{budget[0] or budget[1]}-seed{seed}"
                    run = run_arm(arm, seed, budget, output, args.threads, args.config, shlex.split(args.options))
                    document = record("benchmarks.budget_search", [run])
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
