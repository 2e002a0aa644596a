"""What the exports cost in quality and gain in speed, on a trained model and a real test set.

Exports a trained hf_vanilla folder to CTranslate2 in float32, int8 and int8_float32 and to ONNX (run by ONNX
Runtime under `generate()`), translates the test set with each and with PyTorch `generate()`, and reports sacreBLEU,
sentences per second and how many translations equal PyTorch's, alternating engines over `--repeats` passes in one
process. Same decoding everywhere: beam `--beam`, length penalty `--length-penalty`, at most source length + 50
new tokens.

    python -m benchmarks.quantization runs/quickstart_s1/averaged --json docs/results/ct2-quantization.json
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.inference import translate_lines
from hf_vanilla.interop.ctranslate2 import export_ctranslate2
from hf_vanilla.interop.onnx import OnnxVanillaForConditionalGeneration, export_onnx
from hf_vanilla.loading import load_model
from hf_vanilla.pipeline_vanilla import EXTRA_TARGET_TOKENS
from hf_vanilla.training.metrics import TranslationMetric

from .benchmark import CT2_QUANTIZATIONS


def ctranslate2_translate(folder: str, tokenizer, lines: list[str], beam: int, length_penalty: float, batch: int):
    """A function translating `lines` with the CTranslate2 model in `folder`, batched by length like
    `translate_lines`, each batch allowed its longest source + 50 new tokens."""
    import ctranslate2

    translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=torch.get_num_threads())
    encoded = tokenizer(lines)["input_ids"]
    order = sorted(range(len(lines)), key=lambda i: len(encoded[i]))

    def run() -> list[str]:
        outputs = [""] * len(lines)
        for start in range(0, len(order), batch):
            indices = order[start : start + batch]
            sources = [tokenizer.convert_ids_to_tokens(encoded[i]) for i in indices]
            results = translator.translate_batch(
                sources,
                beam_size=beam,
                length_penalty=length_penalty,
                max_decoding_length=max(len(encoded[i]) for i in indices) + EXTRA_TARGET_TOKENS,
            )
            for index, result in zip(indices, results, strict=True):
                ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
                outputs[index] = tokenizer.decode(ids, skip_special_tokens=True)
        return outputs

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a trained hf_vanilla folder with its tokenizer")
    parser.add_argument("--data", default="multi30k", help="bundled corpus name, folder of text files or Hub id")
    parser.add_argument("--split", default="test", help="train, validation or test (test2016 for Multi30k)")
    parser.add_argument("--source-language", default="en")
    parser.add_argument("--target-language", default="de")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    pairs = load_parallel_corpus(args.data, args.source_language, args.target_language, splits=(args.split,))
    sources, references = list(pairs[args.split]["source"]), list(pairs[args.split]["target"])
    model, tokenizer = load_model(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
    decoding = {"num_beams": args.beam, "length_penalty": args.length_penalty}

    def generate_translate(generator):
        return lambda: [
            c[0] for c in translate_lines(generator, tokenizer, sources, args.batch_size, progress=False, **decoding)
        ]

    engines = {"pytorch": generate_translate(model)}
    with tempfile.TemporaryDirectory() as scratch:
        export_onnx(model, tokenizer, Path(scratch) / "onnx")
        onnx_model = OnnxVanillaForConditionalGeneration.from_pretrained(
            Path(scratch) / "onnx", num_threads=torch.get_num_threads()
        )
        engines["onnxruntime float32"] = generate_translate(onnx_model)
        for quantization in CT2_QUANTIZATIONS:
            export = str(Path(scratch) / quantization)
            export_ctranslate2(model, tokenizer, export, quantization=quantization)
            engines[f"ctranslate2 {quantization}"] = ctranslate2_translate(
                export, tokenizer, sources, args.beam, args.length_penalty, args.batch_size
            )
        seconds = {name: [] for name in engines}
        translations = {}
        for _ in range(args.repeats):  # alternating, so drifts of the machine hit every engine alike
            for name, translate in engines.items():
                start = time.perf_counter()
                translations[name] = translate()
                seconds[name].append(time.perf_counter() - start)

    metric = TranslationMetric()
    report = {"model": args.model, "split": args.split, "sentences": len(sources), **decoding, "engines": {}}
    for name, hypotheses in translations.items():
        scores = metric.compute(predictions=hypotheses, references=[[r] for r in references])
        report["engines"][name] = {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "bleu_signature": scores["bleu_signature"],
            "sentences_per_second": len(sources) / statistics.median(seconds[name]),
            "identical_to_pytorch": sum(a == b for a, b in zip(hypotheses, translations["pytorch"], strict=True)),
            "seconds": seconds[name],
        }
    report["threads"] = torch.get_num_threads()
    print(f"{len(sources)} sentences of {args.split}, beam {args.beam}, {report['threads']} threads")
    print(
        "| engine | BLEU | chrF | sentences/s | speed vs PyTorch | identical to PyTorch |\n|---|---|---|---|---|---|"
    )
    baseline = report["engines"]["pytorch"]["sentences_per_second"]
    for name, row in report["engines"].items():
        speed = row["sentences_per_second"]
        same = f"{row['identical_to_pytorch']}/{len(sources)}"
        print(f"| {name} | {row['bleu']:.2f} | {row['chrf']:.2f} | {speed:.1f} | {speed / baseline:.2f}x | {same} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
