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

from benchmarks import ROOT, markdown


RESULTS = ROOT / "docs" / "results"
DOCUMENTS = [ROOT / "README.md", ROOT / "model_card.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def provenance(document: dict, name: str) -> str:
    """Where a table's figures come from: the JSON, the command that wrote it, the commits it measured, the machine."""
    machine = document["machine"]
    commits = sorted({result.get("commit", document.get("commit", ""))[:7] for result in document["results"]})
    extra = "".join(f", {key.replace('_', ' ')}: {value}" for key, value in machine.items() if key in EXTRA_MACHINE)
    return (
        f"`docs/results/{name}`: `{document['command']}`, commit{'s' if len(commits) > 1 else ''} "
        f"{', '.join(commits)}, {machine['hardware']}{extra}, {machine['date']}."
    )


EXTRA_MACHINE = ("native_bf16", "sentences")


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


def corpus_of(result: dict) -> str:
    """The corpus a scale result measured (results from before the long-tail corpus name none)."""
    return result.get("corpus", "multi30k-words")


def render_scale(name: str = "scale-cpu.json") -> str:
    """The scale benchmark: per commit, corpus size and process count, the cold start and its stages, restarts,
    peak anonymous memory per process, cache sizes and the cgroup limit where one was set."""
    document = load(name)
    header = ["commit", "corpus", "pairs", "processes", "cold start to the 1st update", "reading", "BPE (sample)"]
    header += ["tokenizing"]
    header += ["batches", "restart", "second run", "peak anonymous MiB, rank 0", "rank 1", "tokenizing workers"]
    header += ["raw / tokenized cache (MB)", "cgroup limit: peak use, OOM kills"]
    rows = []
    for result in sorted(document["results"], key=lambda r: (r["pairs"], r["processes"], corpus_of(r), r["commit"])):
        cold = result["cold"]
        workers = [value for role, value in cold["peak_anonymous_mib"].items() if role.startswith("workers")]
        limit = cold.get("memory_limit")
        cells = [
            result["commit"][:7],
            corpus_of(result),
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
        rows.append(cells)
    return markdown(header, rows) + "\n\n" + provenance(document, name) + "\n"


def git_order(first: str, second: str) -> int:
    """-1 when commit `first` is an ancestor of `second`, 1 the other way round."""
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", first, second], cwd=ROOT, capture_output=True)
    return -1 if ancestor.returncode == 0 else 1


def render_scale_goals(name: str = "scale-cpu.json", large: str = "scale-cpu-36m.json") -> str:
    """The goals on the scale benchmark (`name` and the largest corpus's `large`), each with the figures that meet or
    miss it: the newest commit measured against the oldest of the same run."""
    by_age = functools.cmp_to_key(git_order)
    results, large_results = load(name)["results"], load(large)["results"]
    newest, *earlier = sorted({r["commit"] for r in results}, key=by_age, reverse=True)
    baseline = earlier[-1] if earlier else None  # the oldest: the path this round replaced
    newest_large = max({r["commit"] for r in large_results}, key=by_age)

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
                f"{theirs['cold']['wall_to_first_update_s']:.1f} s (goals: at most 1x, at most 360 s);"
            )
        if ours and "restart" in ours:
            lines.append(
                f"- restart / second run at 4.5M pairs, {processes} process(es): "
                f"{_seconds(ours['restart'])} / {_seconds(ours['second_run'])} (goal: at most 30 s);"
            )
    for pairs, goal, rows, commit in (
        (4_500_000, 1024, results, newest),
        (36_000_000, 1536, large_results, newest_large),
    ):
        measured = [r for r in rows if r["pairs"] == pairs and r["commit"] == commit]
        peaks = [peak for r in measured for peak in r["cold"]["peak_anonymous_mib"].values()]
        if peaks:
            lines.append(
                f"- peak anonymous memory of any process at {pairs / 1e6:g}M pairs: {max(peaks)} MiB "
                f"(goal: at most {goal} MiB; {commit[:7]});"
            )
    for r in large_results:
        limit = r["cold"].get("memory_limit")
        if limit and r["commit"] == newest_large:
            lines.append(
                f"- the cold start at {r['pairs'] / 1e6:g}M pairs inside one {limit['limit_gib']:g} GiB cgroup (the "
                f"training process and its tokenizing workers, page cache counted): peak use {limit['max_usage_mib']} "
                f"MiB, {limit['oom_kills']} OOM kills, {_seconds(r['cold'])} to the first update (goal: at most "
                f"600 s; {r['commit'][:7]})."
            )
    return "\n".join(lines) + "\n"


def render_bf16(name: str = "bf16-cpu.json") -> str:
    """float32 against bf16 autocast per preset: medians of a training step and a translation, and the speed-ups."""
    document = load(name)
    header = ["preset", "parameters", "training step, float32", "bf16", "bf16 speed-up"]
    header += ["translation, float32", "bf16", "bf16 speed-up"]
    rows = []
    for result in document["results"]:
        cells = [result["preset"], f"{result['parameters'] / 1e6:.1f}M"]
        for work in ("training_step", "translation"):
            medians = result[work]["median_s"]
            cells += [
                f"{medians['float32']:.3f} s",
                f"{medians['bf16']:.3f} s",
                f"{result[work]['bf16_speedup']:.2f}x",
            ]
        rows.append(cells)
    return markdown(header, rows) + "\n\n" + provenance(document, name) + "\n"


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _test_scores(run: dict) -> list[str]:
    return [f"{run['test']['test_bleu']:.2f}", f"{run['test']['test_chrf']:.2f}"]


def render_quickstart_bf16(name: str = "quickstart-cpu.json") -> str:
    """One seed of the main job in float32 and in bf16: updates, validation at the last step both reached, test."""
    document = load(name)
    bf16_seeds = {run["seed"] for run in document["results"] if run["bf16"]}
    runs = [run for run in document["results"] if run["seed"] in bf16_seeds]
    common = max(set.intersection(*({e["step"] for e in run["validation"]} for run in runs)))
    header = ["seed", "precision", "updates in 10 min", f"validation loss at update {common}"]
    header += [f"validation BLEU (greedy) at update {common}", "last validation BLEU (update)"]
    header += ["test2016 BLEU (beam 4)", "chrF"]
    rows = []
    for run in sorted(runs, key=lambda run: (run["seed"], run["bf16"])):
        at_common = next(e for e in run["validation"] if e["step"] == common)
        last = run["validation"][-1]
        validation = [f"{at_common['eval_loss']:.3f}", f"{at_common['eval_bleu']:.2f}"]
        validation.append(f"{last['eval_bleu']:.2f} ({last['step']})")
        precision = "bf16" if run["bf16"] else "float32"
        rows.append([str(run["seed"]), precision, str(run["updates"]), *validation, *_test_scores(run)])
    return markdown(header, rows) + "\n\n" + provenance(document, name) + "\n"


ENGINE_NAMES = {"pytorch": "PyTorch `generate()`", "onnxruntime float32": "ONNX Runtime float32"}


def engine_label(engine: str) -> str:
    return ENGINE_NAMES.get(engine, engine.replace("ctranslate2", "CTranslate2").replace("openvino", "OpenVINO"))


def render_engines(name: str = "engines-quickstart-cpu.json") -> str:
    """`hf-vanilla translate`'s engines on one trained model: quality, speed against PyTorch, identical outputs."""
    document = load(name)
    (report,) = document["results"]
    baseline = report["engines"]["pytorch"]["sentences_per_second"]
    rows = []
    for engine, row in report["engines"].items():
        speed = row["sentences_per_second"]
        scores = [f"{row['bleu']:.2f}", f"{row['chrf']:.2f}", f"{speed:.1f}", f"{speed / baseline:.2f}x"]
        rows.append([engine_label(engine), *scores, f"{row['identical_to_pytorch']}/{report['sentences']}"])
    header = ["engine", "test2016 BLEU", "chrF", "sentences/s", "vs PyTorch", "translations identical to PyTorch's"]
    passes = len(report["engines"]["pytorch"]["seconds"])
    setting = (
        f"{report['sentences']} sentences of {report['split']}, beam {report['num_beams']}, length penalty "
        f"{report['length_penalty']}, {report['threads']} threads, median of {passes} alternating passes."
    )
    return markdown(header, rows) + "\n\n" + setting + " " + provenance(document, name) + "\n"


def render_marian(name: str = "marian-small-cpu.json") -> str:
    """hf_vanilla against MarianMT at identical weights, with the other engines as further columns."""
    from benchmarks.benchmark import markdown_table

    document = load(name)
    (report,) = document["results"]
    shape = report["shape"]
    setting = (
        f"Preset {report['preset']} (d_model {shape['d_model']}, {shape['layers']}+{shape['layers']} layers, "
        f"{shape['heads']} heads, d_ff {shape['ffn']}, vocabulary {shape['vocab']}), {report['dtype']}, "
        f"{report['threads']} threads."
    )
    return markdown_table(report) + "\n\n" + setting + " " + provenance(document, name) + "\n"


def render_quickstart_budgets(names: tuple[str, ...] = ("quickstart-d6f7dae-cpu.json", "quickstart-budget-cpu.json")):
    """The main job's recipes side by side (one results file each, older first, named by the commit of its first
    run): a row per recipe and budget, with every seed's updates, test BLEU and weights kept, the mean BLEU and the
    longest whole job."""
    rows, sources = [], []
    for name in names:
        document = load(name)
        runs = [run for run in document["results"] if not run["bf16"]]
        recipe = runs[0]["commit"][:7]
        for minutes in sorted({run["minutes"] for run in runs}):
            budget = sorted((run for run in runs if run["minutes"] == minutes), key=lambda run: run["seed"])
            bleu = [run["test"]["test_bleu"] for run in budget]
            rows.append(
                [recipe, f"{minutes:g} min", " / ".join(str(run["seed"]) for run in budget),
                 " / ".join(str(run["updates"]) for run in budget), " / ".join(f"{value:.2f}" for value in bleu),
                 f"**{sum(bleu) / len(bleu):.2f}**", " / ".join(run["final_weights"] for run in budget),
                 _minutes(max(run["whole_job_wall_s"] for run in budget))]
            )  # fmt: skip
        sources.append(provenance(document, name))
    header = ["recipe (commit)", "budget", "seeds", "updates", "test2016 BLEU", "mean", "weights kept", "whole job"]
    signature = f"sacreBLEU `{load(names[-1])['results'][0]['bleu_signature']}`, beam 4; the longest whole job shown."
    return "\n\n".join([markdown(header, rows), signature, *sources]) + "\n"


def render_budget_search(name: str = "budget-search-cpu.json") -> str:
    """The recipe search: every arm's validation BLEU per budget, best first."""
    from benchmarks.budget_search import search_table

    document = load(name)
    return search_table(document["results"]) + "\n\n" + provenance(document, name) + "\n"


def render_cpu_processes(name: str = "cpu-processes-cpu.json") -> str:
    """Updates a second of the quickstart recipe as one process of all threads and as one 1-thread process a core."""
    from benchmarks.cpu_processes import rate_table

    document = load(name)
    return rate_table(document["results"]) + "\n\n" + provenance(document, name) + "\n"


def render_optimizer_step(name: str = "optimizer-step-cpu.json") -> str:
    """The main job's update with AdamW against Muon for the 2-D weights, in the same run."""
    from benchmarks.optimizer_step import table

    document = load(name)
    return table(document["results"]) + "\n\n" + provenance(document, name) + "\n"


def render_published_record(name: str = "wu2021-published-cpu.json") -> str:
    """Wu et al. 2021's recipe as published: the paper's score, then each seed as far as it got."""
    from benchmarks.published_record import table

    document = load(name)
    return table(document) + "\n\n" + provenance(document, name) + "\n"


def render_hour_record(name: str = "hour-record-cpu.json") -> str:
    """Our hour recipe's seeds, each with the validation scores that chose its weights."""
    from benchmarks.published_record import hour_table

    document = load(name)
    return hour_table(document) + "\n\n" + provenance(document, name) + "\n"


def render_recipe_pace(name: str = "recipe-pace-cpu.json") -> str:
    """A recipe's updates a minute beside the main job's, alone here, and its minutes on the reference machine."""
    from benchmarks.recipe_pace import table

    document = load(name)
    return table(document) + "\n\n" + provenance(document, name) + "\n"


def render_decode_search(name: str = "decode-search-cpu.json") -> str:
    """Validation BLEU of runs' last and averaged weights by beam size and length penalty."""
    from benchmarks.decode_search import table

    document = load(name)
    return table(document) + "\n\n" + provenance(document, name) + "\n"


def render_published_beside_ours(
    records: tuple[str, ...] = ("wu2021-published-cpu.json",), main_job: str = "quickstart-budget-cpu.json"
) -> str:
    """The paper's score beside the published recipe as run here, our hour recipe and the main job."""
    from benchmarks.published_record import beside_ours

    documents = {name: load(name) for name in (*records, main_job)}
    sources = [provenance(document, name) for name, document in documents.items()]
    return "\n\n".join([beside_ours([documents[name] for name in records], documents[main_job]), *sources]) + "\n"


def render_same_run(name: str = "same-run-cpu.json") -> str:
    """An uninterrupted run before and after a change: what differs, update by update."""
    from benchmarks.same_run import table

    document = load(name)
    return table(document) + "\n\n" + provenance(document, name) + "\n"


def render_test_command(name: str = "test-command-cpu.json") -> str:
    """One line: how long the README's test command took on a fresh clone, installs and tests apart."""
    document = load(name)
    (run,) = document["results"]
    return (
        f"Tests (fresh machine, CPU only): {run['summary']} in {_minutes(run['tests_s'])} after "
        f"{_minutes(run['installs_s'])} of installs, {provenance(document, name)}\n"
    )


def render_random_order(names: tuple[str, ...] = ("random-order-cpu.json", "random-order-head-cpu.json")) -> str:
    """Each run of the suite in a random order and placement, one record (one commit) after another: its seed,
    counts and failures."""
    header = ["commit", "pytest-randomly seed", "passed", "failed", "skipped", "time", "failures"]
    rows, sources = [], []
    for name in names:
        if not (RESULTS / name).is_file():
            continue
        document = load(name)
        rows += [
            [document["commit"][:7], str(run["seed"]), str(run["passed"]), str(run["failed"]), str(run["skipped"]),
             _minutes(run["seconds"]), ", ".join(f"`{test}`" for test in run["failures"]) or "none"]
            for run in document["results"]
        ]  # fmt: skip
        sources.append(provenance(document, name))
    return markdown(header, rows) + "\n\n" + "\n".join(sources) + "\n"


def render_fsdp_teardown(name: str = "fsdp-teardown-cpu.json") -> str:
    """One line: the FSDP2 test's two-process run, how many of its repeats failed."""
    document = load(name)
    runs = document["results"]
    mean = sum(run["seconds"] for run in runs) / len(runs)
    return (
        f"The FSDP2 test's two-process run (torchrun), repeated: {document['failed']} of {len(runs)} runs "
        f"failed, {mean:.0f} s a run on average, {provenance(document, name)}\n"
    )


def render_test_durations(name: str = "test-durations-cpu.json") -> str:
    """Seconds per test file and the slowest tests before and after, then the phases of a CI run."""
    from benchmarks.test_durations import ci_table, table

    document = load(name)
    runs = [result for result in document["results"] if "files" in result]
    ci = [ci_table(result) for result in document["results"] if "phases" in result]
    return "\n\n".join([table(runs), *ci, provenance(document, name)]) + "\n"


def render_translate_memory(name: str = "translate-memory-cpu.json") -> str:
    """Peak memory of `hf-vanilla translate` per file length: it follows the buffer, not the file."""
    document = load(name)
    rows = [
        [f"{r['lines']:,}", f"{r['peak_rss_mib']:.0f} MiB", f"{r['lines_per_second']:.0f}", str(r["aligned"])]
        for r in document["results"]
    ]
    table = markdown(["lines", "peak memory (VmHWM)", "lines/s", "output aligned line for line"], rows)
    return table + "\n\n" + provenance(document, name) + "\n"


def render_tokenize_speed(name: str = "tokenize-speed-cpu.json") -> str:
    """Sentences tokenized per second on one core, by each way there is, against `encode_batch_fast`."""
    document = load(name)
    rows = [
        [r["way"], f"{r['sentences_per_s'] / 1000:.1f}k", f"{r['vs_encode_batch_fast']:.2f}x"]
        for r in document["results"]
    ]
    table = markdown(["way (one core)", "sentences/s", "vs encode_batch_fast"], rows)
    return table + "\n\n" + provenance(document, name) + "\n"


def render_transformers_releases(name: str = "transformers-releases-cpu.json") -> str:
    from benchmarks.transformers_releases import markdown_table

    document = load(name)
    return markdown_table(document) + "\n\n" + provenance(document, name) + "\n"


def render_training_step(*names: str) -> str:
    """The Trainer's update, ours against Marian in the same run: one row per shape and optimizer."""
    from benchmarks.training_step import table

    documents = {name: load(name) for name in names}
    rows = table([result for document in documents.values() for result in document["results"]])
    return rows + "\n\n" + " ".join(provenance(document, name) for name, document in documents.items()) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "bf16": render_bf16,
    "engines": render_engines,
    "marian": render_marian,
    "marian-base-cuda": functools.partial(render_marian, "marian-base-cuda.json"),
    "quickstart-bf16": render_quickstart_bf16,
    "quickstart-budgets": render_quickstart_budgets,
    "quickstart-budgets-d9b3b48": functools.partial(render_quickstart_budgets, ("quickstart-d9b3b48-cpu.json",)),
    "cpu-processes": render_cpu_processes,
    "budget-search": render_budget_search,
    "budget-search-dropout": functools.partial(render_budget_search, "budget-search-dropout-cpu.json"),
    "hour-search": functools.partial(render_budget_search, "hour-search-cpu.json"),
    "hour-search-vocab": functools.partial(render_budget_search, "hour-search-vocab-cpu.json"),
    "hour-search-arms": functools.partial(render_budget_search, "hour-search-arms-cpu.json"),
    "hour-search-5750": functools.partial(render_budget_search, "hour-search-5750-cpu.json"),
    "hour-search-batch": functools.partial(render_budget_search, "hour-search-batch-cpu.json"),
    "hour-search-ffn-ls": functools.partial(render_budget_search, "hour-search-ffn-ls-cpu.json"),
    "budget-search-muon": functools.partial(render_budget_search, "budget-search-muon-cpu.json"),
    "budget-search-muon-10min": functools.partial(render_budget_search, "budget-search-muon-10min-cpu.json"),
    "optimizer-step": render_optimizer_step,
    "published-record": render_published_record,
    "published-beside-ours": functools.partial(
        render_published_beside_ours, ("wu2021-published-cpu.json", "hour-record-cpu.json")
    ),
    "hour-record": render_hour_record,
    "recipe-pace": render_recipe_pace,
    "decode-search": render_decode_search,
    "same-run": render_same_run,
    "test-command": render_test_command,
    "random-order": render_random_order,
    "fsdp-teardown": render_fsdp_teardown,
    "test-durations": render_test_durations,
    "translate-memory": render_translate_memory,
    "scale": render_scale,
    "scale-36m": functools.partial(render_scale, "scale-cpu-36m.json"),
    "scale-long-tail": functools.partial(render_scale, "scale-long-tail-cpu.json"),
    "scale-long-tail-128mib": functools.partial(render_scale, "scale-long-tail-128mib-cpu.json"),
    "scale-long-tail-36m": functools.partial(render_scale, "scale-long-tail-36m-cpu.json"),
    "scale-goals": render_scale_goals,
    "tokenize-speed": render_tokenize_speed,
    "training-step": functools.partial(
        render_training_step,
        "training-step-cpu.json",
        "training-step-fused-adamw-cpu.json",
        "training-step-compile-cpu.json",
    ),
    "transformers-releases": render_transformers_releases,
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
