"""Wu et al. 2021's Transformer-tiny on Multi30k as published (`configs/multi30k_wu2021.yaml`), or our recipe for
their score in an hour (`--config configs/multi30k_record.yaml`): what each seed's run trained and scored, read from
its output folder.

    python -m benchmarks.published_record --run 1 runs/wu2021-seed1 --run 2 runs/wu2021-seed2 \\
        --checkout CLONE --json docs/results/wu2021-published-cpu.json
    python -m benchmarks.published_record --config configs/multi30k_record.yaml --run 3 runs/record-seed3 \\
        --checkout CLONE --keep docs/results/hour-record-cpu.json --json docs/results/hour-record-cpu.json

Each run is `hf-vanilla train --config CONFIG --seed SEED --output_dir DIR`, run from the checkout `--checkout` (its
commit is recorded). For each: its validation loss and greedy BLEU at every epoch's end
(`log.csv`; a stop in mid-epoch adds one more), the epoch of the lowest loss and how many epochs followed it (fairseq's
`--patience 10` ends the run at 10), the updates made, and, once the run has ended (`test_scores.json`), its test2016
BLEU with beam 5 on the averaged last 10 epochs, scored as the paper scores (sacreBLEU `tokenize=none` on the
lowercased tokenised files: the signature says so). A run still going, or stopped before its end, is recorded as far as
it got. The hour recipe evaluates nothing during training; its validation split chooses between the last and the
averaged weights at the end, and both scores are recorded. `--keep` carries over the seeds of an earlier record of
the same recipe that are not run again (their folders may be gone), each with the commit it ran at.
"""

import argparse
import csv
import json
from pathlib import Path

from benchmarks import machine, markdown, record
from hf_vanilla.training.averaging import checkpoint_folders
from hf_vanilla.training.train_state import read_train_state


PUBLISHED_BLEU = 41.02  # Wu et al. 2021, Transformer-tiny, text only, test2016 En->De (their README-baseline.md)
PUBLISHED_CONFIG = "configs/multi30k_wu2021.yaml"
# What each recipe's rows are called beside the paper's
RECIPE_NAMES = {
    PUBLISHED_CONFIG: "their recipe as published, here",
    "configs/multi30k_record.yaml": "our hour recipe, here",
}


def validation_by_epoch(run_dir: Path) -> list[dict]:
    """Each evaluation of the run (one an epoch): its update, epoch, validation loss and greedy BLEU."""
    rows: dict[int, dict] = {}
    with open(run_dir / "log.csv", newline="") as log:
        for row in csv.DictReader(log):
            if row["name"] in ("eval_loss", "eval_bleu"):
                entry = rows.setdefault(int(row["step"]), {"step": int(row["step"]), "epoch": float(row["epoch"])})
                entry[row["name"]] = float(row["value"])
    return [rows[step] for step in sorted(rows)]


def describe_run(seed: int, run_dir: Path, train_args: str = "", config: str = PUBLISHED_CONFIG) -> dict:
    validation = validation_by_epoch(run_dir)
    # What patience counts: the evaluations at an epoch's end, not the one of a stop in mid-epoch (SIGTERM)
    epoch_ends = [entry for entry in validation if entry["epoch"] == round(entry["epoch"])]
    best = min(range(len(epoch_ends)), key=lambda i: epoch_ends[i]["eval_loss"]) if epoch_ends else None
    scores_file = run_dir / "test_scores.json"
    scores = json.loads(scores_file.read_text()) if scores_file.is_file() else None
    checkpoints = checkpoint_folders(run_dir)
    clock = read_train_state(checkpoints[-1]) if checkpoints else None
    result = {
        "seed": seed,
        "command": f"hf-vanilla train --config {config} --seed {seed} --output_dir {run_dir}"
        + (f" {train_args}" if train_args else ""),
        # The machine that trained it, from its scores; a run not ended is recorded where it runs.
        "trained_on": scores["hardware"] if scores else machine()["hardware"],
        "ended": scores is not None,
        "updates": scores["global_step"] if scores else int(checkpoints[-1].name.split("-")[1]) if checkpoints else 0,
        # The run's training clock, over every session of it: the scores' train_wall_seconds is the last session's
        "train_seconds": clock and clock["train_seconds"],
        "validation": validation,
        "lowest_loss_epoch": epoch_ends[best]["epoch"] if best is not None else None,
        "epochs_since_lowest_loss": len(epoch_ends) - 1 - best if best is not None else None,
    }
    if scores:
        result["test"] = {key: scores[key] for key in ("test_bleu", "test_chrf", "bleu_signature", "final_weights")}
        # Where no evaluation ran during training, the validation split chose the final weights at the end
        chosen_by = ("validation_bleu_last", "validation_bleu_averaged")
        result["test"] |= {key: scores[key] for key in chosen_by if key in scores}
    return result


def kept_runs(earlier: dict, config: str, rerun: set[int]) -> list[dict]:
    """The runs of the record `earlier` whose seeds are not in `rerun`, each marked with the commit it ran at."""
    recorded = earlier.get("config", PUBLISHED_CONFIG)
    if recorded != config:
        raise ValueError(f"--keep: that record is of {recorded}, these runs of {config}; keep a record of {config}")
    return [{"commit": earlier["commit"]} | run for run in earlier["results"] if run["seed"] not in rerun]


def table(document: dict) -> str:
    """The paper's row, then a row per seed: updates, the machine, whether the run ended, the epoch of its lowest
    validation loss and the epochs after it, its last validation BLEU (greedy) and its test BLEU (beam 5, the averaged
    last 10)."""
    rows = [
        [
            "Wu et al. 2021 (fairseq, 2 GPUs)",
            "as published",
            "at most 8000",
            "2 GPUs",
            "-",
            "-",
            "-",
            "-",
            f"{PUBLISHED_BLEU:.2f}",
        ]
    ]
    for run in document["results"]:
        last = run["validation"][-1] if run["validation"] else {}
        trained_on = run.get("trained_on", document["machine"]["hardware"])
        rows.append(
            [
                f"seed {run['seed']}",
                "ended" if run["ended"] else f"not ended (epoch {last.get('epoch', 0):.0f})",
                str(run["updates"]),
                trained_on.split(";")[0],
                f"{run['train_seconds'] / 3600:.2f} h, {run['updates'] / run['train_seconds']:.2f}/s"
                if run["train_seconds"]
                else "-",
                f"{run['lowest_loss_epoch']:.0f}" if run["lowest_loss_epoch"] is not None else "-",
                str(run["epochs_since_lowest_loss"]) if run["epochs_since_lowest_loss"] is not None else "-",
                f"{last['eval_bleu']:.2f}" if "eval_bleu" in last else "-",
                f"{run['test']['test_bleu']:.2f}" if "test" in run else "-",
            ]
        )
    header = ["run", "state", "updates", "machine", "training, updates a second", "lowest validation loss at epoch",
              "epochs after it", "last validation BLEU", "test2016 BLEU (tok, lc)"]  # fmt: skip
    return markdown(header, rows)


def hour_table(document: dict) -> str:
    """Our hour recipe's seeds: updates, training clock, the validation BLEU (greedy, the whole split) of the last and
    the averaged weights, which of them it kept, and the kept weights' test2016 BLEU (beam 5)."""
    rows = []
    for run in document["results"]:
        test = run.get("test", {})
        validation = [test.get(f"validation_bleu_{weights}") for weights in ("last", "averaged")]
        rows.append([
            str(run["seed"]), str(run["updates"]), run["trained_on"].split(";")[0],
            f"{run['train_seconds'] / 60:.0f}" if run["train_seconds"] else "-",
            *(f"{value:.2f}" if value is not None else "-" for value in validation),
            test.get("final_weights", "-"), f"{test['test_bleu']:.2f}" if test else "not ended",
            run.get("commit", document["commit"])[:7],
        ])  # fmt: skip
    header = ["seed", "updates", "machine", "training minutes", "validation BLEU, last", "validation BLEU, averaged",
              "kept", "test2016 BLEU (tok, lc)", "commit"]  # fmt: skip
    return markdown(header, rows)


def seed_row(what: str, runs: list[dict], machine: str, seconds: str, signature: str) -> list[str]:
    """One row of `beside_ours`: the runs' seeds, updates, training minutes and test2016 BLEU, each and their mean."""
    bleu = [run["test"]["test_bleu"] for run in runs]
    return [
        what,
        " / ".join(str(run["seed"]) for run in runs),
        " / ".join(str(run["updates"]) for run in runs),
        " / ".join(f"{run[seconds] / 60:.0f}" for run in runs),
        machine.split(";")[0],
        " / ".join(f"{value:.2f}" for value in bleu),
        f"**{sum(bleu) / len(bleu):.2f}**",
        f"`{signature}`".replace("|", "\\|"),  # a bare | would end the table cell
    ]


def beside_ours(records: list[dict], main_job: dict) -> str:
    """The paper's score, then each recipe of `records` run here (the seeds that ended: the recipe as published, our
    hour recipe), then the main job at each of its budgets: the table a reader of a reimplementation looks for
    first."""
    rows = [
        ["Wu et al. 2021 (paper; fairseq)", "-", "at most 8000", "-", "2 GPUs", f"{PUBLISHED_BLEU:.2f}",
         f"**{PUBLISHED_BLEU:.2f}**", "fairseq's BLEU4 on the lowercased tokenised references (as `tok:none` here)"],
    ]  # fmt: skip
    for recipe in records:
        what = RECIPE_NAMES[recipe.get("config", PUBLISHED_CONFIG)]
        ended = [run for run in recipe["results"] if run["ended"] and "test" in run]
        for trained_on in sorted({run["trained_on"] for run in ended}):
            runs = [run for run in ended if run["trained_on"] == trained_on]
            rows.append(seed_row(what, runs, trained_on, "train_seconds", runs[0]["test"]["bleu_signature"]))
    runs = [run for run in main_job["results"] if not run["bf16"]]
    for minutes in sorted({run["minutes"] for run in runs}):
        budget = sorted((run for run in runs if run["minutes"] == minutes), key=lambda run: run["seed"])
        what = f"the main job, {minutes:g} minutes"
        rows.append(
            seed_row(what, budget, main_job["machine"]["hardware"], "train_wall_s", budget[0]["bleu_signature"])
        )
    header = ["run", "seeds", "updates", "training minutes", "machine", "test2016 BLEU", "mean", "BLEU signature"]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", metavar=("SEED", "DIR"), required=True)
    parser.add_argument("--checkout", type=Path, required=True, help="the checkout the runs ran from")
    parser.add_argument("--config", default=PUBLISHED_CONFIG, choices=list(RECIPE_NAMES), help="the runs' recipe")
    parser.add_argument("--train-args", default="", help="what each run's command added to the config's recipe")
    parser.add_argument("--keep", type=Path, help="an earlier record of the recipe: its seeds not run here are kept")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    results = [describe_run(int(seed), Path(folder), args.train_args, args.config) for seed, folder in args.run]
    document = record("benchmarks.published_record", results, checkout=args.checkout)
    document |= {"published_bleu": PUBLISHED_BLEU, "config": args.config}
    if args.keep:
        earlier = json.loads(args.keep.read_text())
        kept = kept_runs(earlier, args.config, {run["seed"] for run in results})
        document["results"] = sorted(kept + results, key=lambda run: run["seed"])
        # The commands that recorded the kept seeds, earliest first
        recorded_by = {"command": earlier["command"], "commit": earlier["commit"]}
        document["kept_from"] = [*earlier.get("kept_from", []), recorded_by]
    args.json.write_text(json.dumps(document, indent=1) + "\n")
    for result in results:
        print(
            f"seed {result['seed']}: {result['updates']} updates, {'ended' if result['ended'] else 'not ended'}, "
            f"lowest validation loss at epoch {result['lowest_loss_epoch']}, {result['epochs_since_lowest_loss']} "
            f"epochs since; test {result.get('test', {}).get('test_bleu', '-')}"
        )


if __name__ == "__main__":
    main()
