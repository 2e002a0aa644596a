"""Check what the README's main job left: its test score over a floor, and one German line per English line.

    python3 .ci/check_main_job.py RUN_DIR TRANSLATIONS_FILE --inputs 2 --min-bleu 25

The job is deterministic per seed up to its update count, which follows the machine's speed (10 minutes of
training): 25 BLEU on test2016 is what a machine half as fast as the README table's still clears. That machine made
2184 updates with seed 1 (docs/results/quickstart-cpu.json); at update 1000 its greedy validation BLEU was already
28.5, and the test score comes with beam search and averaged checkpoints on top.
"""

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("translations", type=Path)
    parser.add_argument("--inputs", type=int, required=True, help="how many lines the job gave `translate`")
    parser.add_argument("--min-bleu", type=float, required=True)
    args = parser.parse_args()
    scores = json.loads((args.run_dir / "test_scores.json").read_text())
    lines = args.translations.read_text().splitlines()
    print(f"main job: {scores['global_step']} updates, test2016 BLEU {scores['test_bleu']:.2f}; translate printed "
          f"{len(lines)} line(s): {lines}")  # fmt: skip
    failures = []
    if scores["test_bleu"] < args.min_bleu:
        failures.append(f"test BLEU {scores['test_bleu']:.2f} is below the floor {args.min_bleu}")
    if len(lines) != args.inputs or not all(line.strip() for line in lines):
        failures.append(f"translate printed {len(lines)} line(s) for {args.inputs} input lines, or an empty one")
    if failures:
        sys.exit("main job: " + "; ".join(failures))


if __name__ == "__main__":
    main()
