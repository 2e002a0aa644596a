"""Validation BLEU against training minutes: the main job's recipes side by side, every budget and seed a line.

    python -m benchmarks.budget_plot docs/results/quickstart-d6f7dae-cpu.json docs/results/quickstart-budget-cpu.json \
        --output docs/quickstart_budget_curves.png

Reads `benchmarks.quickstart` results: each run's validation evaluations (greedy, the recipe's 200 validation
sentences, every 250 updates) and its training time. An update's minute is its share of the run's updates times the
run's training minutes: updates come at a steady rate, evaluations apart.
"""

import argparse
import json
from pathlib import Path

from hf_vanilla.plotting import _figure


COLOURS = ["tab:grey", "tab:blue", "tab:orange", "tab:green"]
STYLES = [":", "--", "-", "-.", (0, (1, 3))]
STYLE_NAMES = {":": "dotted", "--": "dashed", "-": "solid", "-.": "dash-dot", (0, (1, 3)): "sparse dots"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="benchmarks.quickstart JSONs, one recipe each")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    figure = _figure(7, 4.5)
    axis = figure.subplots()
    recipes = [[run for run in json.loads(path.read_text())["results"] if not run["bf16"]] for path in args.results]
    budgets = sorted({run["minutes"] for runs in recipes for run in runs})
    style_of = {minutes: STYLES[index % len(STYLES)] for index, minutes in enumerate(budgets)}
    for colour, runs in zip(COLOURS, recipes, strict=False):
        for index, run in enumerate(sorted(runs, key=lambda run: (run["minutes"], run["seed"]))):
            minutes = [point["step"] / run["updates"] * run["train_wall_s"] / 60 for point in run["validation"]]
            bleu = [point["eval_bleu"] for point in run["validation"]]
            label = runs[0]["commit"][:7] if index == 0 else None  # the recipe: its file's first run's commit
            style = style_of[run["minutes"]]
            axis.plot(minutes, bleu, linestyle=style, color=colour, marker=".", alpha=0.8, label=label)
    styles = ", ".join(f"{minutes:g} min {STYLE_NAMES[style]}" for minutes, style in style_of.items())
    axis.set_xlabel(f"training minutes\n(budgets: {styles})")
    axis.set_ylabel("validation BLEU (greedy, 200 sentences)")
    axis.grid(alpha=0.3)
    axis.legend(title="recipe (commit)")
    figure.tight_layout()
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
