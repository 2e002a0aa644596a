"""What the exports cost in quality and gain in speed, on a trained model and a real test set.

Exports a trained hf_vanilla folder to CTranslate2 in float32, int8 and int8_float32 and to ONNX (run by ONNX
Runtime under `generate()`), translates the test set with each and with PyTorch `generate()`, and reports sacreBLEU,
sentences per second and how many translations equal PyTorch's, alternating engines over `--repeats` passes in one
process, each through the batching of `hf-vanilla translate` (`inference.translate_stream`). Same decoding
everywhere: beam `--beam`, length penalty `--length-penalty`, at most source length + 50 new tokens.

    python -m benchmarks.quantization runs/quickstart/final --json docs/results/engines-quickstart-cpu.json
"""

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.inference import CTranslate2Translator, GenerateTranslator, translate_stream
from hf_vanilla.interop.ctranslate2 import export_ctranslate2
from hf_vanilla.interop.exporters import ExportedVanillaForConditionalGeneration, export_model
from hf_vanilla.loading import load_model
from hf_vanilla.training.metrics import TranslationMetric

from . import record
from .benchmark import CT2_QUANTIZATIONS


def stream_translate(translate, tokenizer, lines: list[str], max_tokens: int, batch_size: int):
    """A function translating `lines` as `hf-vanilla translate` does (buffers sorted by length into token-budget
    batches), returning the first candidate of each."""
    return lambda: [c[0] for c in translate_stream(translate, tokenizer, lines, 2000, max_tokens, batch_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a trained hf_vanilla folder with its tokenizer")
    parser.add_argument("--data", default="multi30k", help="bundled corpus name, folder of text files or Hub id")
    parser.add_argument("--split", default="test", help="train, validation or test (test2016 for Multi30k)")
    parser.add_argument("--source-language", default="en")
    parser.add_argument("--target-language", default="de")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences a batch, at most")
    parser.add_argument(
        "--max-tokens", type=int, default=4000, help="source tokens a batch (the command's CPU default)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    pairs = load_parallel_corpus(args.data, args.source_language, args.target_language, splits=(args.split,))
    sources, references = list(pairs[args.split]["source"]), list(pairs[args.split]["target"])
    model, tokenizer = load_model(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
    decoding = {"num_beams": args.beam, "length_penalty": args.length_penalty}

    def engine(translate):
        return stream_translate(translate, tokenizer, sources, args.max_tokens, args.batch_size)

    engines = {"pytorch": engine(GenerateTranslator(model, tokenizer, **decoding))}
    with tempfile.TemporaryDirectory() as scratch:
        for backend, runtime in (("onnx", "onnxruntime"), ("openvino", "openvino")):
            if importlib.util.find_spec(runtime) is None:
                continue
            export_model(model, tokenizer, Path(scratch) / backend, backend=backend)
            exported = ExportedVanillaForConditionalGeneration.from_pretrained(
                Path(scratch) / backend, num_threads=torch.get_num_threads()
            )
            engines[f"{runtime} float32"] = engine(GenerateTranslator(exported, tokenizer, **decoding))
        for quantization in CT2_QUANTIZATIONS:
            export = str(Path(scratch) / quantization)
            export_ctranslate2(model, tokenizer, export, quantization=quantization)
            engines[f"ctranslate2 {quantization}"] = engine(CTranslate2Translator(export, tokenizer, **decoding))
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
        Path(args.json).write_text(json.dumps(record("benchmarks.quantization", [report]), indent=1) + "\n")


if __name__ == "__main__":
    main()
