"""Check a saved model through its remote code alone, as a Python without hf_vanilla runs it; print one JSON line.

    python benchmarks/remote_code_check.py FOLDER

Run as a file, with any transformers 5.x installed and hf_vanilla blocked (it imports nothing of this repository):
loads FOLDER with `trust_remote_code=True`, then checks that `generate()` gives the same tokens with and without its
cache (greedy, and beam 4 with `num_return_sequences=2`), that the cached runs feed the decoder one new token a step
(a cache handed over under a name the model does not read would give the same tokens, slowly), and translates with
`pipeline("translation")`. The line holds the installed transformers release, `"status": "pass"` or the error's type
and message, and the pipeline's translations.
"""

import json
import sys
import traceback


sys.modules["hf_vanilla"] = None  # `import hf_vanilla` fails, as where the package is not installed

SOURCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl in a red dress is reading a book."]
MODES = {"greedy": {"num_beams": 1}, "beam4_nbest2": {"num_beams": 4, "num_return_sequences": 2}}
NEW_TOKENS = 24


def decoder_input_lengths(model, run) -> list[int]:
    """How many decoder tokens each decoder call got while `run()` ran."""
    lengths = []
    decoder = model.get_decoder()
    hook = decoder.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append((kwargs.get("input_ids", args[0] if args else None)).shape[1]),
        with_kwargs=True,
    )
    try:
        run()
    finally:
        hook.remove()
    return lengths


def check(folder: str) -> dict:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True, return_token_type_ids=False)
    for name, mode in MODES.items():
        with torch.no_grad():
            outputs = {}
            lengths = decoder_input_lengths(
                model,
                lambda: outputs.update(cached=model.generate(**batch, max_new_tokens=NEW_TOKENS, **mode)),
            )
            outputs["uncached"] = model.generate(**batch, max_new_tokens=NEW_TOKENS, use_cache=False, **mode)
        if not torch.equal(outputs["cached"], outputs["uncached"]):
            raise AssertionError(f"{name}: generate() gives other tokens with its cache than without it")
        if set(lengths[1:]) != {1}:
            raise AssertionError(f"{name}: the cached decoder was fed {sorted(set(lengths))} tokens a step, not 1")
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    if not type(translator).__module__.startswith("transformers_modules"):
        raise AssertionError(f"the pipeline is {type(translator)}, not the folder's remote code")
    return {"translations": [output["translation_text"] for output in translator(SOURCES)]}


def main() -> None:
    import transformers

    result = {"transformers": transformers.__version__}
    try:
        result.update(status="pass", **check(sys.argv[1]))
    except Exception as error:  # the record says which error, whatever it is
        message = " ".join(str(error).split())
        result.update(status="error", error=f"{type(error).__name__}: {message}"[:400])
        result["where"] = traceback.format_exc().strip().splitlines()[-3:-1]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
