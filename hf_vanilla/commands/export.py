"""Export a trained model (folder with its tokenizer) to another inference engine.

    hf-vanilla export ctranslate2 MODEL OUTPUT [--quantization int8]
    hf-vanilla export onnx MODEL OUTPUT [--opset 18]
    hf-vanilla export openvino MODEL OUTPUT       # needs `pip install 'hf-vanilla[openvino]'`

Then `hf-vanilla translate OUTPUT --engine ctranslate2|onnx|openvino`, or, with `pip install 'hf-vanilla[export]'`:
    translator = ctranslate2.Translator(OUTPUT, device="cpu")
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("A dog runs.")["input_ids"])
    translator.translate_batch([tokens], beam_size=4, length_penalty=0.6)
or
    model = hf_vanilla.interop.exporters.ExportedVanillaForConditionalGeneration.from_pretrained(OUTPUT)
    model.generate(**tokenizer(["A dog runs."], return_tensors="pt"))
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", choices=["ctranslate2", "onnx", "openvino"])
    parser.add_argument("model", help="hf_vanilla model folder with its tokenizer")
    parser.add_argument("output", help="folder to write")
    parser.add_argument("--quantization", help="ctranslate2: int8, int8_float32, int8_float16, float16, bfloat16, ...")
    parser.add_argument("--opset", type=int, help="onnx: the ONNX opset (default: transformers' exporter's)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output folder")


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from ..loading import load_model

    if args.engine != "ctranslate2" and args.quantization:
        raise ValueError(f"--quantization is for ctranslate2; the {args.engine} export is float32.")
    if args.engine != "onnx" and args.opset:
        raise ValueError("--opset is for onnx.")
    model = load_model(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.engine in ("onnx", "openvino"):
        from ..interop.exporters import export_model

        output = export_model(model.float(), tokenizer, args.output, args.engine, args.opset, force=args.force)
        print(output)
    else:
        from ..interop.ctranslate2 import export_ctranslate2

        print(export_ctranslate2(model, tokenizer, args.output, quantization=args.quantization, force=args.force))
        # what `hf-vanilla translate --engine ctranslate2 OUTPUT` needs beside the model: tokens and decoding defaults
        tokenizer.save_pretrained(args.output)
        model.generation_config.save_pretrained(args.output)
