"""What the data path costs as the corpus grows to the paper's size, on this machine, through the real command.

For each corpus size it writes a synthetic corpus of real text (two random Multi30k training pairs joined into one,
~24 words a side; validation and test are Multi30k's own), then runs `hf-vanilla train --config configs/quickstart.yaml
--data DIR` for a few updates and measures:
- cold start: wall time from launch to the first update, and each stage the run logs on the way (reading, BPE on a
  sample, tokenizing, batches, model, first update), with empty caches;
- a restart (`--resume_from_checkpoint last`) and a second run with the same data: wall time to their first update;
- peak resident memory (the kernel's VmHWM, and the largest anonymous part seen) of each rank process and of the
  tokenizing workers, with 1 process and with 2 (`accelerate launch`, CPU, gloo), and which rank built the cache;
- the caches' size on disk (raw Arrow table, tokenizer, tokenized corpus).

    python -m benchmarks.scale --sizes 30000 450000 4500000 --work /tmp/scale \\
        --json docs/results/scale-cpu.json --plot docs/scale_cpu.png [--checkout ../other-commit]

`--checkout DIR` measures the `hf_vanilla` of another checkout (a worktree of an earlier commit) with the same
corpora, so two data paths are compared in one run; every result records the commit it measured.

Corpora and caches live under --work (several GB at 4.5M pairs; never in the repository). Run it with nothing else on
the machine: it measures wall time.
"""

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks import ROOT, commit_of, record
from benchmarks.report import corpus_of
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.text_files import stream_lines


STAGE = re.compile(r"\[rank (\d+)\] startup: (.+?) took ([\d.]+) s")
TRAINING = ["--config", "configs/quickstart.yaml", "--max_eval_examples", "16", "--max_test_examples", "16"]
TRAINING += ["--average_last", "0", "--report_to", "none", "--max_train_minutes", "60", "--disable_tqdm", "true"]


CORPORA = {
    "multi30k-words": "two Multi30k pairs joined a line (Multi30k's ~20k word types)",
    "long-tail": "the same with made-up names, numbers and compounds from a Zipf law over millions of types",
}
# The long tail: made-up types drawn by a Zipf law over LONG_TAIL_TYPES ranks, as WMT's names, numbers and compounds.
LONG_TAIL_TYPES = 3_000_000
LONG_TAIL_ZIPF = 1.1
LONG_TAIL_WORDS_PER_LINE = 3
SYLLABLES = "ka lo mi ren sto vik ha dor el bru sen tal qui ma zo fer ung lis pa rok ne dal iv osk".split()


def long_tail_word(rank: int, german_words: list[str]) -> str:
    """Type `rank` of the long tail: a name of syllables, a number, or a German compound of two Multi30k words, in
    turn (each kind a third of the types and of the draws)."""
    index, kind = divmod(rank, 3)
    if kind == 0:
        digits = []
        while True:
            index, digit = divmod(index, len(SYLLABLES))
            digits.append(SYLLABLES[digit])
            if index == 0:
                return "".join(digits).capitalize()
    if kind == 1:
        return f"{index * 7919 % 10**7:,}" if index % 2 else str(index * 104729 % 10**9)
    first, second = index * 2654435761 % len(german_words), index * 40503 % len(german_words)
    return german_words[first] + german_words[second].lower()


def joined_lines(english: np.ndarray, german: np.ndarray, count: int, rng: np.random.Generator) -> tuple[list, list]:
    first, second = (rng.integers(0, len(english), count) for _ in range(2))
    joined_english = [f"{a} {b}" for a, b in zip(english[first], english[second], strict=True)]
    joined_german = [f"{a} {b}" for a, b in zip(german[first], german[second], strict=True)]
    return joined_english, joined_german


def insert_long_tail(lines: list[str], words: list[list[str]], positions: np.ndarray) -> list[str]:
    """Each line with its made-up words put in at the same word position on both sides (names and numbers are
    copied by a translation)."""
    inserted = []
    for line, line_words, position in zip(lines, words, positions, strict=True):
        split = line.split(" ")
        at = position % (len(split) + 1)
        inserted.append(" ".join(split[:at] + line_words + split[at:]))
    return inserted


def write_corpus(folder: Path, pairs: int, long_tail: bool = False, seed: int = 0) -> None:
    """`train.{en,de}`: `pairs` lines, each two random Multi30k training pairs joined (and with `long_tail`,
    LONG_TAIL_WORDS_PER_LINE made-up words drawn from the long tail in each pair); `val`/`test2016` copied."""
    multi30k, _ = BUNDLED_CORPORA["multi30k"]
    if (folder / "done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    english = np.array(list(stream_lines(multi30k / "train.en.gz")), dtype=object)
    german = np.array(list(stream_lines(multi30k / "train.de.gz")), dtype=object)
    german_words = sorted({word for line in german for word in line.split() if word.isalpha() and len(word) > 3})
    rng = np.random.default_rng(seed)
    with open(folder / "train.en", "w") as en, open(folder / "train.de", "w") as de:
        for start in range(0, pairs, 100_000):
            count = min(100_000, pairs - start)
            english_lines, german_lines = joined_lines(english, german, count, rng)
            if long_tail:
                ranks = (rng.zipf(LONG_TAIL_ZIPF, (count, LONG_TAIL_WORDS_PER_LINE)) - 1) % LONG_TAIL_TYPES
                words = [[long_tail_word(rank, german_words) for rank in row] for row in ranks.tolist()]
                positions = rng.integers(0, 1 << 30, count)
                english_lines = insert_long_tail(english_lines, words, positions)
                german_lines = insert_long_tail(german_lines, words, positions)
            en.write("".join(f"{line}\n" for line in english_lines))
            de.write("".join(f"{line}\n" for line in german_lines))
    for split in ("val", "test2016"):
        for language in ("en", "de"):
            shutil.copy(multi30k / f"{split}.{language}.gz", folder / f"{split}.{language}.gz")
    (folder / "done").touch()


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    if "VmHWM" not in fields:  # a process that has exited and not been reaped yet has no memory left to report
        raise ProcessLookupError(pid)
    return {name: int(fields[name].split()[0]) * 1024 for name in ("VmHWM", "RssAnon", "RssFile")}


def _roles(root: psutil.Process) -> dict[int, str]:
    """pid -> "rank N" for the training processes, "workers of rank N" for the processes they fork."""
    processes = [root, *root.children(recursive=True)]
    ranks = {}
    for process in processes:
        try:
            command = " ".join(process.cmdline())
            environment = process.environ()
        except psutil.Error:
            continue
        if "hf_vanilla" in command and "train" in command and "accelerate" not in command:
            ranks[process.pid] = int(environment.get("RANK", 0))
    roles = {}
    for process in processes:
        if process.pid not in ranks:
            continue
        try:
            parent = process.ppid()
        except psutil.Error:
            continue
        roles[process.pid] = f"workers of rank {ranks[parent]}" if parent in ranks else f"rank {ranks[process.pid]}"
    return roles


class MemoryLimit:
    """A cgroup (v1 memory controller) capping a command and its children at `gib` GiB, page cache included: a run
    that completes inside it fits that memory, whatever part of its RSS is reclaimable memory-mapped file pages."""

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self, gib: float):
        self.folder = self.ROOT / f"hf-vanilla-scale-{os.getpid()}"
        self.folder.mkdir()
        (self.folder / "memory.limit_in_bytes").write_text(str(int(gib * 2**30)))
        self.gib = gib

    def enter(self) -> None:  # in the child, before exec
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def report(self) -> dict:
        oom = dict(line.split() for line in (self.folder / "memory.oom_control").read_text().splitlines())
        max_usage = int((self.folder / "memory.max_usage_in_bytes").read_text())
        return {
            "limit_gib": self.gib,
            "max_usage_mib": round(max_usage / 2**20),
            "oom_kills": int(oom.get("oom_kill", 0)),
        }

    def remove(self) -> None:
        self.folder.rmdir()


def run_and_watch(
    command: list[str],
    env: dict,
    log: Path,
    until_first_update: bool = False,
    limit: MemoryLimit | None = None,
    checkout: Path = ROOT,
) -> dict:
    """Run `command` in `checkout`, sampling every process's memory, until it exits (or its first update, then stop
    it)."""
    start = time.monotonic()
    peaks: dict[str, dict[str, int]] = {}
    first_update, at_first_update = None, {}
    with open(log, "w") as output:
        preexec = limit.enter if limit else None
        process = subprocess.Popen(
            command, cwd=checkout, env=env, stdout=output, stderr=subprocess.STDOUT, preexec_fn=preexec
        )
        root = psutil.Process(process.pid)
        while process.poll() is None:
            for pid, role in _roles(root).items():
                try:
                    status = _status(pid)
                except OSError:
                    continue
                peak = peaks.setdefault(role, {"VmHWM": 0, "RssAnon": 0, "processes": set()})
                peak["VmHWM"] = max(peak["VmHWM"], status["VmHWM"])
                peak["RssAnon"] = max(peak["RssAnon"], status["RssAnon"])
                peak["processes"].add(pid)
            if first_update is None and "startup: first update" in log.read_text(errors="replace"):
                first_update = time.monotonic() - start
                at_first_update = {role: dict(peak) for role, peak in peaks.items()}
                if until_first_update:  # measured: stop the whole tree (a launcher turns SIGTERM into an error)
                    for child in [*root.children(recursive=True), root]:
                        child.kill()
            time.sleep(0.2)
    text = log.read_text(errors="replace")
    if (process.returncode != 0 and not until_first_update) or first_update is None:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}); see {log}:\n{text[-3000:]}")
    stages: dict[str, dict[str, float]] = {}
    for rank, stage, seconds in STAGE.findall(text):
        name = re.sub(r"^reading \d+ training pairs", "reading", stage.split(" (")[0])
        stages.setdefault(f"rank {rank}", {})[name] = float(seconds)
    return {
        **({"memory_limit": limit.report()} if limit else {}),
        "wall_to_first_update_s": round(first_update, 1),
        "wall_s": round(time.monotonic() - start, 1),
        "stages_s": stages,
        "built_cache": [rank for rank, stage, _ in STAGE.findall(text) if stage.startswith("tokenizing (built")],
        "opened_cache": [rank for rank, stage, _ in STAGE.findall(text) if stage.startswith("tokenizing (opened")],
        # up to the first update: the data path and the model (what grows with the corpus, if anything)
        "peak_rss_mib": {role: round(peak["VmHWM"] / 2**20) for role, peak in sorted(at_first_update.items())},
        "peak_anonymous_mib": {role: round(peak["RssAnon"] / 2**20) for role, peak in sorted(at_first_update.items())},
        # the whole run, the final test translation (beam search) included
        "peak_rss_whole_run_mib": {role: round(peak["VmHWM"] / 2**20) for role, peak in sorted(peaks.items())},
        "worker_processes": {role: len(peak["processes"]) for role, peak in peaks.items() if "workers" in role},
    }


def folder_size_mib(folder: Path) -> float:
    return round(sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20, 1)


def train_command(processes: int, data: Path, output: Path, cache: Path, *extra: str) -> list[str]:
    options = [*TRAINING, "--data", str(data), "--output_dir", str(output), "--data_cache_dir", str(cache), *extra]
    if processes == 1:
        return [sys.executable, "-m", "hf_vanilla", "train", *options]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate_cpu.yaml"]
    return [*launcher, "--num_processes", str(processes), "-m", "hf_vanilla", "train", *options, "--use_cpu", "true"]


def measure(
    size: int,
    processes: int,
    work: Path,
    restarts: bool,
    memory_limit_gib: float | None = None,
    checkout: Path = ROOT,
    corpus: str = "multi30k-words",
) -> dict:
    data = work / f"corpus-{corpus}-{size}"
    write_corpus(data, size, long_tail=corpus == "long-tail")
    run = work / f"run-{corpus}-{size}-{processes}p"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    env = {
        **os.environ,
        "HF_DATASETS_CACHE": str(run / "hf-datasets-cache"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(checkout),
    }
    if processes > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    cache = run / "hf-vanilla-cache"
    steps = ["--max_steps", "3", "--save_steps", "3"]
    result = {"corpus": corpus, "pairs": size, "processes": processes, "commit": commit_of(checkout)}
    limit = MemoryLimit(memory_limit_gib * processes) if memory_limit_gib else None
    cold = train_command(processes, data, run / "out", cache, *steps)
    result["command"] = " ".join(cold)
    try:
        result["cold"] = run_and_watch(cold, env, run / "cold.log", limit=limit, checkout=checkout)
    finally:
        if limit:
            limit.remove()
    result["cache_mib"] = {
        "raw_arrow": folder_size_mib(run / "hf-datasets-cache"),
        "tokenizer": folder_size_mib(cache / "tokenizers"),
        "tokenized": folder_size_mib(cache / "tokenized"),
    }
    if restarts:
        resume = train_command(
            processes, data, run / "out", cache, "--max_steps", "4", "--resume_from_checkpoint", "last"
        )
        result["restart"] = run_and_watch(resume, env, run / "restart.log", True, checkout=checkout)
        second = train_command(processes, data, run / "out-2", cache, *steps)
        result["second_run"] = run_and_watch(second, env, run / "second.log", True, checkout=checkout)
    shutil.rmtree(run, ignore_errors=True)
    return result


def plot(results: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.5))
    time_axes, memory_axes = figure.subplots(1, 2)

    def curve(result: dict) -> tuple:
        return result["commit"], result["processes"], corpus_of(result)

    for commit, processes, corpus in sorted({curve(r) for r in results}):
        rows = [r for r in results if curve(r) == (commit, processes, corpus)]
        rows.sort(key=lambda r: r["pairs"])
        sizes, label = [r["pairs"] for r in rows], f"{commit[:7]}, {corpus}, {processes}p"
        time_axes.plot(sizes, [r["cold"]["wall_to_first_update_s"] for r in rows], "o-", label=f"cold, {label}")
        restarted = [r for r in rows if "restart" in r]
        if restarted:
            restart_times = [r["restart"]["wall_to_first_update_s"] for r in restarted]
            time_axes.plot([r["pairs"] for r in restarted], restart_times, "s--", label=f"restart, {label}")
        for rank in range(processes):
            peaks = [r["cold"]["peak_anonymous_mib"].get(f"rank {rank}", np.nan) / 1024 for r in rows]
            memory_axes.plot(sizes, peaks, "o-", label=f"{label}, rank {rank}, anonymous")
    time_axes.axhline(360, color="grey", lw=0.8)
    time_axes.axhline(30, color="grey", lw=0.8)
    memory_axes.axhline(1, color="grey", lw=0.8)
    time_axes.set(xscale="log", yscale="log", xlabel="training pairs", ylabel="seconds to the first update")
    memory_axes.set(
        xscale="log", xlabel="training pairs", ylabel="peak anonymous memory per process (GiB)", ylim=(0, None)
    )
    time_axes.legend(fontsize=8)
    memory_axes.legend(fontsize=8)
    figure.suptitle("hf-vanilla train, quickstart recipe, synthetic Multi30k-text corpora, 2-core CPU")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[30_000, 450_000, 4_500_000], help="none: only plot")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--corpora", nargs="+", choices=CORPORA, default=["multi30k-words"], help="; ".join(CORPORA.values())
    )
    parser.add_argument("--no-restarts-above", type=int, default=None, help="skip restarts for larger corpora")
    parser.add_argument(
        "--memory-limit-gib", type=float, help="run the cold start in a cgroup of this much memory per process"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/hf-vanilla-scale"))
    parser.add_argument(
        "--checkout", type=Path, nargs="*", default=[], help="other checkouts to measure beside this one, same corpora"
    )
    parser.add_argument("--json", type=Path, help="write the results here (appending to what is there)")
    parser.add_argument("--plot", type=Path, help="plot every result of --json here")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.json.read_text())["results"] if args.json and args.json.exists() else []
    checkouts = [ROOT, *args.checkout]
    results = []
    for size in args.sizes:
        for processes in args.processes:
            restarts = args.no_restarts_above is None or size <= args.no_restarts_above
            # back to back, so a drift of the machine's speed hits every corpus and path alike
            for corpus, checkout in itertools.product(args.corpora, checkouts):
                result = measure(size, processes, args.work, restarts, args.memory_limit_gib, checkout, corpus)
                print(json.dumps(result), flush=True)
                results.append(result)

    def key(result: dict) -> tuple:
        return corpus_of(result), result["pairs"], result["processes"], result["commit"]

    kept = [r for r in previous if key(r) not in {key(n) for n in results}]
    everything = sorted(kept + results, key=key)
    if args.json:
        document = record("benchmarks.scale", everything)
        del document["commit"]  # each result names the checkout it measured
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    if args.plot:
        plot(everything, args.plot)


if __name__ == "__main__":
    main()
