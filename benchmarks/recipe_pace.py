"""A recipe's pace beside the main job's, each alone on this machine, so that a recipe bounded in updates can say what
its updates cost in minutes on issue 54's reference machine: a 2-core AMD EPYC where the main job, with dropout off
as it is there, makes 1250 updates in its 10 minutes.

    python -m benchmarks.recipe_pace --json docs/results/recipe-pace-cpu.json

The recipes train one after the other, with nothing else running, each as a user runs it (`hf-vanilla train
--config`): the main job with dropout off (`--dropout_min_epochs` past any budget), then our hour recipe
(`configs/multi30k_record.yaml`) on its BPE, made first as its README line makes it. Each is stopped by SIGTERM once
it has saved checkpoint-500; its pace is the updates from checkpoint-250 to checkpoint-500 over its training clock
between them, past the warmup and the dropout decision (update 200) and with the evaluations and saves the run makes.
The ratio of the two paces, measured in one run, carries to the reference machine. An arm of the hour recipe is
measured in its place: `--merges` for its BPE, `--options` added to its command (`--options "--max_steps 6800"`: the
updates it would make).
"""

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT, markdown, record
from hf_vanilla.training.arguments import parse_arguments
from hf_vanilla.training.train_state import read_train_state


REFERENCE_MAIN_JOB_PACE = 125.0  # updates a minute of the main job on the reference machine (1250 in 10 minutes)
WINDOW = (250, 500)  # the checkpoints whose clocks bound the measured updates
MAIN_JOB = ("the main job, dropout off", "configs/quickstart.yaml", ["--dropout_min_epochs", "1000"])
HOUR_RECIPE = ("our hour recipe", "configs/multi30k_record.yaml", [])
HOUR_RECIPE_MERGES = 10000  # the BPE its README line makes (benchmarks/subword_nmt_bpe.py)


def clock_at(output: Path, step: int) -> float | None:
    """The training seconds checkpoint-`step` of `output` recorded, once it is saved whole."""
    state = output / f"checkpoint-{step}" / "trainer_state.json"
    return read_train_state(state.parent)["train_seconds"] if state.is_file() else None


def max_steps_of(config: str, options: list[str]) -> int:
    """The budget in updates of `config` run with `options`, as `hf-vanilla train` reads them."""
    return parse_arguments(["--config", str(ROOT / config), *options])[1].max_steps


def measure(name: str, config: str, options: list[str], work: Path, local: list[str], timeout: float = 1800) -> dict:
    """Train `config` with `options` (and the `local` paths, not recorded) into `work` until checkpoint-500 is saved,
    stop it, and read its pace."""
    output = work / Path(config).stem
    command = [sys.executable, "-m", "hf_vanilla", "train", "--config", config, "--output_dir", str(output), *options]
    command += [*local, "--report_to", "none", "--disable_tqdm", "true", "--data_cache_dir", str(work / "data_cache")]
    with (work / f"{output.name}.log").open("w") as log:
        job = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while clock_at(output, WINDOW[1]) is None:
            if job.poll() is not None or time.monotonic() > deadline:
                job.kill()
                raise RuntimeError(f"{name} ended or ran out of time before checkpoint-{WINDOW[1]}: see {log.name}")
            time.sleep(1)
        job.send_signal(signal.SIGTERM)
        job.wait()
    seconds = clock_at(output, WINDOW[1]) - clock_at(output, WINDOW[0])
    updates = WINDOW[1] - WINDOW[0]
    max_steps = max_steps_of(config, options)
    result = {"recipe": name, "config": config, "options": " ".join(options), "max_steps": max_steps}
    return result | {"window": list(WINDOW), "seconds": seconds, "updates_per_minute": 60 * updates / seconds}


def table(document: dict) -> str:
    """Each recipe's pace here, its share of the main job's (the first result), and what its `max_steps` take on the
    reference machine."""
    main, *recipes = document["results"]

    def share(result: dict) -> float:
        return result["updates_per_minute"] / main["updates_per_minute"]

    def row(result: dict, on_reference: str) -> list[str]:
        return [result["recipe"], f"`{' '.join([result['config'], result['options']]).strip()}`",
                f"{result['updates_per_minute']:.1f}", f"{share(result):.2f}", on_reference]  # fmt: skip

    # The main job, bounded by its minutes, is the yardstick: its updates a minute there are the reference's
    rows = [row(main, "the yardstick")]
    for result in recipes:
        minutes = result["max_steps"] / (REFERENCE_MAIN_JOB_PACE * share(result))
        rows.append(row(result, f"{result['max_steps']} in {minutes:.0f} min"))
    header = ["recipe", "command's config and options", "updates a minute here, alone", "of the main job's",
              f"on the reference machine (main job {REFERENCE_MAIN_JOB_PACE:g} a minute)"]  # fmt: skip
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merges", type=int, default=HOUR_RECIPE_MERGES, help="the merges of the hour recipe's BPE")
    parser.add_argument("--options", default="", help="options added to the hour recipe, as one string")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    name, config, options = HOUR_RECIPE
    # An arm of the hour recipe is named by what it changes; its BPE is made as the recipe's README line makes it
    arm = [f"{args.merges} merges"] * (args.merges != HOUR_RECIPE_MERGES) + [args.options] * bool(args.options)
    hour_recipe = (", ".join([name, *arm]), config, [*options, *shlex.split(args.options)])
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        tokenizer = work / f"subword-nmt-{args.merges}"
        bpe = [sys.executable, "-m", "benchmarks.subword_nmt_bpe", "--merges", str(args.merges)]
        subprocess.run([*bpe, "--output", str(tokenizer)], cwd=ROOT, check=True)
        results = [measure(*MAIN_JOB, work, []), measure(*hour_recipe, work, ["--tokenizer", str(tokenizer)])]
    document = record("benchmarks.recipe_pace", results)
    args.json.write_text(json.dumps(document, indent=1) + "\n")
    print(table(document))


if __name__ == "__main__":
    main()
