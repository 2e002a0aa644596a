"""Render the results tables of README.md and docs/ from the JSONs in docs/results, so that every figure there is
one a script recorded, with its commit, machine and command.

    python -m benchmarks.report           # rewrite the tables in place
    python -m benchmarks.report --check   # exit 1, naming the file, if a committed table is not its rendering

A table lives between `<!-- table: NAME -->` and `<!-- /table -->` lines; NAME is one of `RENDERERS`, each of which
reads its JSON and returns the markdown (the table and a line saying where it comes from).
"""

import argparse
import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def provenance(document: dict, name: str) -> str:
    machine = document["machine"]
    commits = sorted({result["commit"][:7] for result in document["results"]})
    return (
        f"`docs/results/{name}`: `{document['command']}`, commits {', '.join(commits)}, {machine['hardware']}, "
        f"{machine['date']}."
    )


def _seconds(run: dict | None, stage: str | None = None) -> str:
    if run is None:
        return ""
    if stage is None:
        return f"{run['wall_to_first_update_s']:.1f} s"
    value = run["stages_s"].get("rank 0", {}).get(stage)
    return "" if value is None else f"{value:.1f} s"


def _mib(run: dict, key: str, role: str) -> str:
    value = run[key].get(role)
    return "" if value is None else str(value)


def render_scale(name: str = "scale-cpu.json") -> str:
    """The scale benchmark: per commit, corpus size and process count, the cold start and its stages, restarts,
    peak anonymous memory per process, cache sizes and the cgroup limit where one was set."""
    document = load(name)
    header = (
        "| commit | pairs | processes | cold start to the 1st update | reading | BPE (sample) | tokenizing "
        "| batches | restart | second run | peak anonymous MiB, rank 0 | rank 1 | tokenizing workers "
        "| raw / tokenized cache (MB) | cgroup limit: peak use, OOM kills |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for result in sorted(document["results"], key=lambda r: (r["pairs"], r["processes"], r["commit"])):
        cold = result["cold"]
        workers = [value for role, value in cold["peak_anonymous_mib"].items() if role.startswith("workers")]
        limit = cold.get("memory_limit")
        cells = [
            result["commit"][:7],
            f"{result['pairs']:,}",
            str(result["processes"]),
            _seconds(cold),
            _seconds(cold, "reading"),
            _seconds(cold, "tokenizer"),
            _seconds(cold, "tokenizing"),
            _seconds(cold, "batches"),
            _seconds(result.get("restart")),
            _seconds(result.get("second_run")),
            _mib(cold, "peak_anonymous_mib", "rank 0"),
            _mib(cold, "peak_anonymous_mib", "rank 1"),
            " / ".join(map(str, workers)),
            f"{result['cache_mib']['raw_arrow']:.0f} / {result['cache_mib']['tokenized']:.0f}",
            (f"{limit['limit_gib']:g} GiB: {limit['max_usage_mib']} MiB, {limit['oom_kills']}" if limit else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + provenance(document, name) + "\n"


def git_order(first: str, second: str) -> int:
    """-1 when commit `first` is an ancestor of `second`, 1 the other way round."""
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", first, second], cwd=ROOT, capture_output=True)
    return -1 if ancestor.returncode == 0 else 1


def render_scale_goals(name: str = "scale-cpu.json", large: str = "scale-cpu-36m.json") -> str:
    """Issue 25's goals on the scale benchmark (`name` and the largest corpus's `large`), each with the figures that
    meet or miss it: the newest commit measured against the earlier one of the same run."""
    results = load(name)["results"] + load(large)["results"]
    newest, *earlier = sorted({r["commit"] for r in results}, key=functools.cmp_to_key(git_order), reverse=True)
    baseline = earlier[0] if earlier else None

    def row(pairs: int, processes: int, commit: str) -> dict | None:
        return next(
            (r for r in results if (r["pairs"], r["processes"], r["commit"]) == (pairs, processes, commit)), None
        )

    lines = []
    for processes in (1, 2):
        ours, theirs = row(4_500_000, processes, newest), baseline and row(4_500_000, processes, baseline)
        if ours and theirs:
            ratio = ours["cold"]["wall_to_first_update_s"] / theirs["cold"]["wall_to_first_update_s"]
            lines.append(
                f"- cold start to the first update at 4.5M pairs, {processes} process(es): "
                f"{ours['cold']['wall_to_first_update_s']:.1f} s, {ratio:.2f}x {baseline[:7]}'s "
                f"{theirs['cold']['wall_to_first_update_s']:.1f} s (goals: at most 2x, at most 360 s);"
            )
        if ours and "restart" in ours:
            lines.append(
                f"- restart / second run at 4.5M pairs, {processes} process(es): "
                f"{_seconds(ours['restart'])} / {_seconds(ours['second_run'])} (goal: at most 30 s);"
            )
    for pairs, goal in ((4_500_000, 1024), (36_000_000, 1536)):
        measured = [r for r in results if r["pairs"] == pairs and r["commit"] == newest]
        peaks = [peak for r in measured for peak in r["cold"]["peak_anonymous_mib"].values()]
        if peaks:
            lines.append(
                f"- peak anonymous memory of any process at {pairs / 1e6:g}M pairs: {max(peaks)} MiB "
                f"(goal: at most {goal} MiB);"
            )
    for r in results:
        limit = r["cold"].get("memory_limit")
        if limit and r["commit"] == newest:
            lines.append(
                f"- the cold start at {r['pairs'] / 1e6:g}M pairs inside one {limit['limit_gib']:g} GiB cgroup (the "
                f"training process and its tokenizing workers, page cache counted): peak use {limit['max_usage_mib']} "
                f"MiB, {limit['oom_kills']} OOM kills, {_seconds(r['cold'])} to the first update."
            )
    return "\n".join(lines) + "\n"


def render_bf16(name: str = "bf16-cpu.json") -> str:
    """float32 against bf16 autocast per preset: medians of a training step and a translation, and the speed-ups."""
    document = load(name)
    lines = [
        "| preset | parameters | training step, float32 | bf16 | bf16 speed-up | translation, float32 | bf16 "
        "| bf16 speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in document["results"]:
        cells = [result["preset"], f"{result['parameters'] / 1e6:.1f}M"]
        for work in ("training_step", "translation"):
            medians = result[work]["median_s"]
            cells += [
                f"{medians['float32']:.3f} s",
                f"{medians['bf16']:.3f} s",
                f"{result[work]['bf16_speedup']:.2f}x",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    machine = document["machine"]
    source = (
        f"`docs/results/{name}`: `{document['command']}`, commit {document['commit'][:7]}, {machine['hardware']}, "
        f"native bf16: {machine['native_bf16']}, {machine['date']}."
    )
    return "\n".join(lines) + "\n\n" + source + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "bf16": render_bf16,
    "scale": render_scale,
    "scale-36m": functools.partial(render_scale, "scale-cpu-36m.json"),
    "scale-goals": render_scale_goals,
}


def render(text: str) -> str:
    """`text` with every table block replaced by its rendering; an unknown NAME is an error naming it."""

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise KeyError(f"no renderer for table '{name}' (known: {sorted(RENDERERS)})")
        return match.group(1) + RENDERERS[name]() + match.group(4)

    return BLOCK.sub(replace, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 where a table differs")
    args = parser.parse_args()
    stale = []
    for path in DOCUMENTS:
        text = path.read_text()
        rendered = render(text)
        if rendered != text:
            stale.append(path)
            if not args.check:
                path.write_text(rendered)
    if args.check and stale:
        sys.exit(f"tables differ from their JSONs in {', '.join(map(str, stale))}: run python -m benchmarks.report")


if __name__ == "__main__":
    main()
