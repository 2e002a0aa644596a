"""Every transformers 5.x release against a trained model's remote code: what a downloader meets on the release they
already have, token for token against the installed package on this environment's release (the lock's).

    python -m benchmarks.transformers_releases --model MODEL --json docs/results/transformers-releases-cpu.json
    python -m benchmarks.transformers_releases --model runs/quickstart/final --ends   # what CI runs

`--model` is a trained model (the README's main job writes `runs/quickstart/final`): a random one repeats a token,
on which "cached == uncached" holds almost by construction. The installed package translates the first `--sentences`
of test2016 (greedy and beam 4) into the reference. One virtual environment with torch then gets each release in turn
and runs `benchmarks/remote_code_check.py` there, where hf_vanilla is not installed: load with
`trust_remote_code=True`, `generate()` cached == uncached (greedy, beam 4 with an n-best of 2), the cached decoder fed
one token a step, `pipeline("translation")`, and the reference's sources translated in the same batches, every
sentence's tokens compared with the package's. The default releases are the newest patch of every 5.x minor release
on the index; those below the remote-code floor (`configuration_vanilla.TRANSFORMERS_FLOOR`) must be refused by the
config's own one-line check. Exit status 1 if a release at or above the floor fails or translates a sentence
otherwise, or one below it fails otherwise than by that refusal.
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from benchmarks import ROOT, markdown, record
from hf_vanilla.configuration_vanilla import TRANSFORMERS_FLOOR


CHECK = ROOT / "benchmarks" / "remote_code_check.py"
TORCH = "torch==2.13.0"  # the CPU build CI installs, the floor of pyproject.toml
FLOOR_REFUSAL = "needs transformers >="
# The reference and every release translate on one thread: a matrix product's sums, and so a near tie between two
# tokens, may fall otherwise on another number of threads, which is not what a release changes.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def minor_releases() -> list[str]:
    """The newest patch of every transformers 5.x minor release on the package index."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True, check=True
    ).stdout
    versions = [Version(v) for v in re.search(r"Available versions: (.*)", listing)[1].split(", ")]
    newest = {}
    for version in versions:
        if version.major == 5 and not version.is_prerelease:
            key = version.release[:2]
            newest[key] = max(newest.get(key, version), version)
    return [str(version) for _, version in sorted(newest.items())]


def ends(releases: list[str]) -> list[str]:
    """The newest patch of the minor release below the floor (to be refused), the floor's, the release halfway to the
    newest tested (the lock's), and that one."""
    from hf_vanilla.env import range_tested

    _, newest = range_tested("transformers")
    floor = Version(TRANSFORMERS_FLOOR).release
    below = [r for r in releases if Version(r).release[:2] < floor]
    tested = [r for r in releases if floor <= Version(r).release[:2] <= newest.release]
    return [*below[-1:], tested[0], tested[len(tested) // 2], str(newest)]


def package_reference(model: Path, sentences: int, path: Path) -> Path:
    """The installed package's translations of test2016's first `sentences` sources, in each mode the check compares,
    written to `path` for `remote_code_check.py`."""
    import torch
    from transformers import AutoTokenizer

    from benchmarks.remote_code_check import COMPARED, translation_ids
    from hf_vanilla import VanillaTransformerForConditionalGeneration
    from hf_vanilla.data import BUNDLED_CORPORA
    from hf_vanilla.text_files import stream_lines

    torch.set_num_threads(int(ONE_THREAD["OMP_NUM_THREADS"]))
    corpus, _ = BUNDLED_CORPORA["multi30k"]
    sources = list(stream_lines(corpus / "test2016.en.gz"))[:sentences]
    package_model = VanillaTransformerForConditionalGeneration.from_pretrained(model).eval()
    tokenizer = AutoTokenizer.from_pretrained(model)
    reference = {name: translation_ids(package_model, tokenizer, sources, mode) for name, mode in COMPARED.items()}
    path.write_text(json.dumps({"sources": sources, **reference}))
    return path


def check_release(python: Path, release: str, model: Path, reference: Path, workdir: Path) -> dict:
    """Install `release` into the environment of `python`, then check `model` there in a fresh process."""
    started = time.monotonic()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"transformers=={release}"], capture_output=True, text=True
    )
    if install.returncode != 0:
        return {"transformers": release, "status": "not installable", "error": install.stderr.strip()[-400:]}
    run = subprocess.run(
        [str(python), str(CHECK), str(model), str(reference)],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={
            "HF_HOME": str(workdir / f"hf_home-{release}"),
            "HF_HUB_OFFLINE": "1",
            "PATH": "/usr/bin:/bin",
            **ONE_THREAD,
        },
    )
    # (a release's trust_remote_code prompt may share the line)
    lines = [line[line.index('{"transformers"') :] for line in run.stdout.splitlines() if '{"transformers"' in line]
    result = json.loads(lines[-1]) if lines else {"transformers": release, "status": "error"}
    if not lines:  # the check itself did not finish
        result["error"] = (run.stdout + run.stderr).strip()[-400:]
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def verdict(result: dict) -> str:
    """`pass`, `refused` (the config's one-line floor check), or `FAIL`."""
    below_floor = Version(result["transformers"]).release < Version(TRANSFORMERS_FLOOR).release
    if below_floor:
        return "refused" if FLOOR_REFUSAL in result.get("error", "") else "FAIL"
    return "pass" if result["status"] == "pass" else "FAIL"


def sweep(releases: list[str], model: Path, sentences: int, workdir: Path) -> list[dict]:
    reference = package_reference(model, sentences, workdir / "reference.json")
    subprocess.run([sys.executable, "-m", "venv", str(workdir / "venv")], check=True)
    python = workdir / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", TORCH], check=True)
    results = []
    for release in releases:
        result = check_release(python, release, model.resolve(), reference, workdir)
        result["verdict"] = verdict(result)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def identical_counts(result: dict) -> str:
    """How many of the compared test2016 translations were the package's, token for token, in each mode."""
    counts = ", ".join(f"{name} {count}" for name, count in result["identical"].items())
    return f"test2016's first {result['compared']} sentences identical to the package on the lock's release: {counts}"


def markdown_table(document: dict) -> str:
    """One row per run of consecutive releases with the same outcome."""
    groups = []
    for result in document["results"]:
        # refusals name the installed release: grouped by verdict, each group shows its first release's message
        outcome = (
            result["verdict"],
            result.get("error", "") if result["verdict"] == "FAIL" else "",
            identical_counts(result) if result["verdict"] == "pass" else "",
        )
        if groups and groups[-1][0] == outcome:
            groups[-1][1].append(result["transformers"])
        else:
            groups.append((outcome, [result["transformers"]]))
    rows = []
    for (verdict, error, _), releases in groups:
        first = next(r for r in document["results"] if r["transformers"] == releases[0])
        span = releases[0] if len(releases) == 1 else f"{releases[0]} to {releases[-1]} ({len(releases)} releases)"
        if verdict == "pass":
            what = "works: cached == uncached (greedy, beam 4 with an n-best of 2), one token a step, the pipeline; "
            what += identical_counts(first)
        elif verdict == "refused":
            what = f"refused at once, on {releases[0]}: `{first.get('error', '')}`"
        else:
            what = f"FAILS: `{error}`"
        rows.append([span, what])
    header = ["transformers (each minor's newest patch)", "a saved model's remote code, without hf_vanilla"]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="+", help="transformers versions (default: each 5.x minor's newest)")
    parser.add_argument(
        "--ends",
        action="store_true",
        help="the minor below the floor, the floor, a release halfway, the newest tested",
    )
    parser.add_argument("--model", type=Path, required=True, help="a trained model's folder (runs/quickstart/final)")
    parser.add_argument("--sentences", type=int, default=250, help="test2016 sources compared token for token")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="transformers-releases-") as workdir:
        releases = args.releases or (ends(minor_releases()) if args.ends else minor_releases())
        results = sweep(releases, args.model, args.sentences, Path(workdir))
    document = record("benchmarks.transformers_releases", results, floor=TRANSFORMERS_FLOOR, torch=TORCH)
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(markdown_table(document))
    failed = [result["transformers"] for result in results if result["verdict"] == "FAIL"]
    if failed:
        sys.exit(f"remote code fails on transformers {', '.join(failed)}")


if __name__ == "__main__":
    main()
