"""Export a trained model (folder with its tokenizer) to another inference engine.

    hf-vanilla export ctranslate2 MODEL OUTPUT [--quantization int8]

Then, with `pip install 'hf-vanilla[export]'`:
    translator = ctranslate2.Translator(OUTPUT, device="cpu")
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("A dog runs.")["input_ids"])
    translator.translate_batch([tokens], beam_size=4, length_penalty=0.6)
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", choices=["ctranslate2"])
    parser.add_argument("model", help="hf_vanilla model folder with its tokenizer")
    parser.add_argument("output", help="folder to write")
    parser.add_argument("--quantization", help="int8, int8_float32, int8_float16, float16, bfloat16, ...")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output folder")


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    import hf_vanilla  # noqa: F401  (registers the model with the Auto classes)

    from ..interop.ctranslate2 import export_ctranslate2
    from ..loading import load_model

    model = load_model(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    print(export_ctranslate2(model, tokenizer, args.output, quantization=args.quantization, force=args.force))
