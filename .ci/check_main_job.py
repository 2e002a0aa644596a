"""Check what the README's main job left: its test score over a floor that follows the updates it made, and one
German line per English line.

    python3 .ci/check_main_job.py RUN_DIR TRANSLATIONS_FILE --inputs 2 --curve docs/results/quickstart-budget-cpu.json

The job trains for 10 minutes, so its update count, and with it its score, follows the machine's speed. The curve is
the recipe's recorded runs (`benchmarks.quickstart` at several budgets, every seed, one recipe in the file, whichever
commits ran it): at each budget the mean update
count and the mean test2016 BLEU, joined by straight lines, flat beyond the last point and through the origin before
the first. The floor is the curve at the updates this run made, minus `--margin` (3 BLEU: the seeds' spread plus a
machine's), so a slow machine neither fails by chance nor hides a regression that costs more than that.

A floor that follows the updates would also follow a slower training step down. So the pace is checked too: the
run's updates a minute of training must reach `--min_pace_share` (0.5: machines differ up to 2x) of the slowest
recorded budget's mean pace; a step twice as slow as recorded on a machine as fast fails, naming the pace.
"""

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path


def recorded_curve(results_file: Path) -> list[tuple[float, float]]:
    """(mean updates, mean test BLEU) per budget of the float32 runs of `results_file`, which holds one recipe's runs
    (whatever commit ran them: a changed recipe moves the file's runs to docs/results/archive/)."""
    budgets: dict[float, list[dict]] = {}
    for run in json.loads(results_file.read_text())["results"]:
        if not run["bf16"]:
            budgets.setdefault(run["minutes"], []).append(run)
    return sorted(
        (sum(r["updates"] for r in group) / len(group), sum(r["test"]["test_bleu"] for r in group) / len(group))
        for group in budgets.values()
    )


def recorded_pace(results_file: Path) -> float:
    """Updates a minute of training of the float32 runs of `results_file`: the mean of each budget's runs, the slowest
    budget's (a budget long enough to keep dropout trains slower)."""
    budgets: dict[float, list[float]] = {}
    for run in json.loads(results_file.read_text())["results"]:
        if not run["bf16"]:
            budgets.setdefault(run["minutes"], []).append(run["updates"] / (run["train_wall_s"] / 60))
    return min(sum(paces) / len(paces) for paces in budgets.values())


def expected_bleu(curve: list[tuple[float, float]], updates: int) -> float:
    """The curve at `updates`: linear between its points, through (0, 0) before the first, flat after the last."""
    points = [(0.0, 0.0), *curve]
    for (x0, y0), (x1, y1) in pairwise(points):
        if updates <= x1:
            return y0 + (y1 - y0) * (updates - x0) / (x1 - x0)
    return points[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("translations", type=Path)
    parser.add_argument("--inputs", type=int, required=True, help="how many lines the job gave `translate`")
    parser.add_argument("--curve", type=Path, required=True, help="the recipe's recorded runs (benchmarks.quickstart)")
    parser.add_argument("--margin", type=float, default=3.0, help="BLEU below the curve that still passes")
    parser.add_argument("--min_pace_share", type=float, default=0.5, help="of the recorded updates a minute")
    args = parser.parse_args()
    scores = json.loads((args.run_dir / "test_scores.json").read_text())
    lines = args.translations.read_text().splitlines()
    curve = recorded_curve(args.curve)
    floor = expected_bleu(curve, scores["global_step"]) - args.margin
    pace, recorded = scores["global_step"] / (scores["train_wall_seconds"] / 60), recorded_pace(args.curve)
    points = [(round(u), round(b, 2)) for u, b in curve]
    print(f"main job: {scores['global_step']} updates, {pace:.1f} a minute (recorded {recorded:.1f}), test2016 BLEU "
          f"{scores['test_bleu']:.2f}, floor {floor:.2f} (recorded curve {points} minus {args.margin}); translate "
          f"printed {len(lines)} line(s): {lines}")  # fmt: skip
    failures = []
    if pace < args.min_pace_share * recorded:
        failures.append(
            f"{pace:.1f} updates a minute is below {args.min_pace_share} of the recorded pace ({recorded:.1f}): "
            "a training step this slow is a regression, or the job did not run alone"
        )
    if scores["test_bleu"] < floor:
        failures.append(f"test BLEU {scores['test_bleu']:.2f} is below the floor {floor:.2f} at its updates")
    if len(lines) != args.inputs or not all(line.strip() for line in lines):
        failures.append(f"translate printed {len(lines)} line(s) for {args.inputs} input lines, or an empty one")
    if failures:
        sys.exit("main job: " + "; ".join(failures))


if __name__ == "__main__":
    main()
