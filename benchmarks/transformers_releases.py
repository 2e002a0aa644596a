"""Every transformers 5.x release against a published model's remote code: what a downloader meets on the release
they already have.

    python -m benchmarks.transformers_releases --json docs/results/transformers-releases-cpu.json
    python -m benchmarks.transformers_releases --model runs/quickstart/final --ends   # what CI runs

Saves a model with its tokenizer (or takes `--model`, a folder `save_pretrained` wrote), makes one virtual
environment with torch, then installs each release in turn into it and runs `benchmarks/remote_code_check.py` there,
where hf_vanilla is not installed: load with `trust_remote_code=True`, `generate()` cached == uncached (greedy, beam 4
with an n-best of 2), the cached decoder fed one token a step, `pipeline("translation")`. The default releases are
the newest patch of every 5.x minor release on the index; those below the remote-code floor
(`configuration_vanilla.TRANSFORMERS_FLOOR`) must be refused by the config's own one-line check. Exit status 1 if a
release at or above the floor fails, or one below it fails otherwise.
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
    """The floor's newest patch, the release halfway to the newest tested (the lock's), and that one."""
    from hf_vanilla.env import range_tested

    _, newest = range_tested("transformers")
    tested = [r for r in releases if Version(TRANSFORMERS_FLOOR).release <= Version(r).release[:2] <= newest.release]
    return [tested[0], tested[len(tested) // 2], str(newest)]


def save_test_model(folder: Path) -> Path:
    """A small random model with a BPE tokenizer of Multi30k, saved as `hf-vanilla train` saves its final model."""
    import torch

    from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from hf_vanilla.data import BUNDLED_CORPORA
    from hf_vanilla.text_files import stream_lines
    from hf_vanilla.tokenization import train_bpe_tokenizer

    corpus, _ = BUNDLED_CORPORA["multi30k"]
    lines = [*list(stream_lines(corpus / "train.en.gz"))[:2000], *list(stream_lines(corpus / "train.de.gz"))[:2000]]
    tokenizer = train_bpe_tokenizer(lines, vocab_size=500, show_progress=False)
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=len(tokenizer), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, init_std=1.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
        unk_token_id=tokenizer.unk_token_id,
    )  # fmt: skip
    model = VanillaTransformerForConditionalGeneration(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_release(python: Path, release: str, model: Path, workdir: Path) -> dict:
    """Install `release` into the environment of `python`, then check `model` there in a fresh process."""
    started = time.monotonic()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"transformers=={release}"], capture_output=True, text=True
    )
    if install.returncode != 0:
        return {"transformers": release, "status": "not installable", "error": install.stderr.strip()[-400:]}
    run = subprocess.run(
        [str(python), str(CHECK), str(model)],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={"HF_HOME": str(workdir / f"hf_home-{release}"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
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


def sweep(releases: list[str], model: Path | None, workdir: Path) -> list[dict]:
    if model is None:
        model = save_test_model(workdir / "model")
    subprocess.run([sys.executable, "-m", "venv", str(workdir / "venv")], check=True)
    python = workdir / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", TORCH], check=True)
    results = []
    for release in releases:
        result = check_release(python, release, model.resolve(), workdir)
        result["verdict"] = verdict(result)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def markdown_table(document: dict) -> str:
    """One row per run of consecutive releases with the same outcome."""
    groups = []
    for result in document["results"]:
        # refusals name the installed release: grouped by verdict, each group shows its first release's message
        outcome = (result["verdict"], result.get("error", "") if result["verdict"] == "FAIL" else "")
        if groups and groups[-1][0] == outcome:
            groups[-1][1].append(result["transformers"])
        else:
            groups.append((outcome, [result["transformers"]]))
    rows = []
    for (verdict, error), releases in groups:
        first = next(r for r in document["results"] if r["transformers"] == releases[0])
        span = releases[0] if len(releases) == 1 else f"{releases[0]} to {releases[-1]} ({len(releases)} releases)"
        what = {
            "pass": "works: cached == uncached (greedy, beam 4 with an n-best of 2), one token a step, the pipeline",
            "refused": f"refused at once, on {releases[0]}: `{first.get('error', '')}`",
        }.get(verdict, f"FAILS: `{error}`")
        rows.append([span, what])
    header = ["transformers (each minor's newest patch)", "a saved model's remote code, without hf_vanilla"]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="+", help="transformers versions (default: each 5.x minor's newest)")
    parser.add_argument("--ends", action="store_true", help="only the floor, a release halfway, the newest tested")
    parser.add_argument("--model", type=Path, help="a saved model folder (default: a small random model)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="transformers-releases-") as workdir:
        releases = args.releases or (ends(minor_releases()) if args.ends else minor_releases())
        results = sweep(releases, args.model, Path(workdir))
    document = record("benchmarks.transformers_releases", results, floor=TRANSFORMERS_FLOOR, torch=TORCH)
    print(markdown_table(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    failed = [result["transformers"] for result in results if result["verdict"] == "FAIL"]
    if failed:
        sys.exit(f"remote code fails on transformers {', '.join(failed)}")


if __name__ == "__main__":
    main()
