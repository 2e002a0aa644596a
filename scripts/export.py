"""Export a trained hf_vanilla model (folder with its tokenizer) to another inference engine.

    python scripts/export.py ctranslate2 runs/model runs/model-ct2 [--quantization int8]

Then, with `pip install ctranslate2`:
    translator = ctranslate2.Translator("runs/model-ct2", device="cpu")
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("A dog runs.")["input_ids"])
    translator.translate_batch([tokens], beam_size=4, length_penalty=0.6)
"""

import argparse

from transformers import AutoTokenizer

import hf_vanilla  # noqa: F401  (registers the model with the Auto classes)
from hf_vanilla.export import export_ctranslate2
from hf_vanilla.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=["ctranslate2"])
    parser.add_argument("model", help="hf_vanilla model folder with its tokenizer")
    parser.add_argument("output", help="folder to write")
    parser.add_argument("--quantization", help="int8, int8_float32, int8_float16, float16, bfloat16, ...")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output folder")
    args = parser.parse_args()
    model = load_model(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    print(export_ctranslate2(model, tokenizer, args.output, quantization=args.quantization, force=args.force))


if __name__ == "__main__":
    main()
