"""Beam size and length penalty, chosen on the validation split: each run's last and averaged weights translate the
whole validation split with each decoding setting, scored as the run scores its test split.

    python -m benchmarks.decode_search --run 1 /work/record/seed1 --run 2 /work/record/seed2 \\
        --json docs/results/decode-search-cpu.json

A run is the output folder of `hf-vanilla train`: its newest checkpoint holds the last weights, `averaged` the average
of its last checkpoints, `final` the tokenizer. The translations go through `hf_vanilla.inference.translate_lines`,
as `hf-vanilla translate` does (the paper's budget of source length + 50 new tokens), and are scored by sacreBLEU with
`--bleu_tokenize` (`none` for the tokenised files of `--data multi30k-tok`: BLEU of multi-bleu's kind). The test split
decides nothing here.
"""

import argparse
import json
from pathlib import Path

import sacrebleu
import torch
from transformers import AutoTokenizer

from benchmarks import markdown, record
from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.inference import translate_lines
from hf_vanilla.text_files import stream_lines
from hf_vanilla.training.averaging import checkpoint_folders


SETTINGS = ("1:1.0", "5:0.6", "5:1.0", "5:1.5", "5:2.0")  # beam:length penalty; the recipe's test decodes with 5:1.0


def setting(text: str) -> tuple[int, float]:
    """`beam:length_penalty` as given on the command line."""
    beam, _, penalty = text.partition(":")
    try:
        return int(beam), float(penalty)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected beam:length_penalty, for example 5:1.0") from None


def validation_pairs(data: str, source: str, target: str) -> tuple[list[str], list[str]]:
    """The validation split of a bundled corpus: its source lines and their references."""
    folder, pattern = BUNDLED_CORPORA[data]

    def lines(language: str) -> list[str]:
        return list(stream_lines(folder / (pattern.format(split="val", lang=language) + ".gz")))

    return lines(source), lines(target)


def weights_of(run: Path) -> dict[str, Path]:
    """The folders of a run's last weights (its newest checkpoint) and of its averaged weights, where present."""
    folders = {"last": checkpoint_folders(run)[-1]}
    if (run / "averaged").is_dir():
        folders["averaged"] = run / "averaged"
    return folders


def score(model, tokenizer, sources: list[str], references: list[str], beam: int, penalty: float, tokenize: str):
    """sacreBLEU of the model's translations of `sources` with `beam` and length `penalty`, and its signature."""
    candidates = translate_lines(model, tokenizer, sources, batch_size=100, progress=False, num_beams=beam,
                                 length_penalty=penalty, do_sample=False)  # fmt: skip
    hypotheses = [found[0] if found else "" for found in candidates]
    metric = sacrebleu.BLEU(tokenize=tokenize)
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def search_run(seed: int, run: Path, settings: list[tuple[int, float]], sources, references, tokenize: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    scores, signature = [], ""
    for weights, folder in weights_of(run).items():
        model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
        for beam, penalty in settings:
            with torch.inference_mode():
                bleu, signature = score(model, tokenizer, sources, references, beam, penalty, tokenize)
            scores.append({"weights": weights, "beam": beam, "length_penalty": penalty, "bleu": bleu})
            print(json.dumps({"seed": seed, **scores[-1]}), flush=True)
    return {"seed": seed, "run": str(run), "scores": scores, "bleu_signature": signature}


def table(document: dict) -> str:
    """Validation BLEU by decoding setting (rows) and run weights (columns), with the mean over the columns."""
    runs = document["results"]
    found = {
        (run["seed"], entry["weights"], entry["beam"], entry["length_penalty"]): entry["bleu"]
        for run in runs
        for entry in run["scores"]
    }
    columns = list(dict.fromkeys((seed, weights) for seed, weights, _, _ in found))
    rows = []
    for beam, penalty in dict.fromkeys((beam, penalty) for _, _, beam, penalty in found):
        cells = [found.get((seed, weights, beam, penalty)) for seed, weights in columns]
        present = [cell for cell in cells if cell is not None]
        mean = f"{sum(present) / len(present):.2f}"
        rows.append([str(beam), f"{penalty:g}", *("-" if cell is None else f"{cell:.2f}" for cell in cells), mean])
    header = ["beam", "length penalty", *(f"seed {seed}, {weights}" for seed, weights in columns), "mean"]
    return markdown(header, rows) + f"\n\nBLEU signature: `{runs[0]['bleu_signature']}`."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", required=True, metavar=("SEED", "FOLDER"))
    parser.add_argument("--settings", type=setting, nargs="+", default=[setting(text) for text in SETTINGS])
    parser.add_argument("--data", default="multi30k-tok", choices=sorted(BUNDLED_CORPORA))
    parser.add_argument("--source_language", default="en")
    parser.add_argument("--target_language", default="de")
    parser.add_argument("--bleu_tokenize", default="none")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sources, references = validation_pairs(args.data, args.source_language, args.target_language)
    results = [
        search_run(int(seed), Path(folder), args.settings, sources, references, args.bleu_tokenize)
        for seed, folder in args.run
    ]
    document = record("benchmarks.decode_search", results)
    print(table(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
