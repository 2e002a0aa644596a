"""Check a saved model through its remote code alone, as a Python without hf_vanilla runs it; print one JSON line.

    python benchmarks/remote_code_check.py FOLDER [REFERENCE]

Run as a file, with any transformers 5.x installed and hf_vanilla blocked (it imports nothing of this repository):
loads FOLDER with `trust_remote_code=True`, then checks that `generate()` gives the same tokens with and without its
cache (greedy, and beam 4 with `num_return_sequences=2`), that the cached runs feed the decoder one new token a step
(a cache handed over under a name the model does not read would give the same tokens, slowly), and translates with
`pipeline("translation")`. With REFERENCE (a JSON file `benchmarks/transformers_releases.py` writes: sources and the
installed package's token ids for each of `COMPARED`), it translates the same sources in the same batches and
compares every sentence's tokens with the reference's. The line holds the installed transformers release,
`"status": "pass"` or the error's type and message, the pipeline's translations, and with REFERENCE the identical
count of each mode and the first differences, token by token.
"""

import json
import sys
import traceback
from pathlib import Path


SOURCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl in a red dress is reading a book."]
MODES = {"greedy": {"num_beams": 1}, "beam4_nbest2": {"num_beams": 4, "num_return_sequences": 2}}
NEW_TOKENS = 24
# The modes compared sentence by sentence with the installed package's tokens, and how: sources in batches of
# `COMPARED_BATCH`, each translation at most `COMPARED_NEW_TOKENS` tokens.
COMPARED = {"greedy": {"num_beams": 1}, "beam4": {"num_beams": 4}}
COMPARED_BATCH = 50
COMPARED_NEW_TOKENS = 80
DIFFERENCES_SHOWN = 5


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


def translation_ids(model, tokenizer, sources: list[str], mode: dict) -> list[list[int]]:
    """Each source's generated token ids, padding removed: the same batches on every release and on the package."""
    import torch

    translations = []
    for start in range(0, len(sources), COMPARED_BATCH):
        batch = tokenizer(
            sources[start : start + COMPARED_BATCH], return_tensors="pt", padding=True, return_token_type_ids=False
        )
        with torch.no_grad():
            generated = model.generate(**batch, max_new_tokens=COMPARED_NEW_TOKENS, **mode)
        pad = model.generation_config.pad_token_id
        translations += [[token for token in row if token != pad] for row in generated.tolist()]
    return translations


def first_difference(reference: list[int], tokens: list[int]) -> int:
    """The position of the first token where two translations differ (the shorter one's length if one is a prefix)."""
    return next(
        (i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b),
        min(len(reference), len(tokens)),
    )


def compare_with(reference_file: str, model, tokenizer) -> dict:
    """Translate the reference's sources as it did and count, per mode, the sentences with identical tokens; the
    first differences, token by token. Raises if any sentence differs."""
    reference = json.loads(Path(reference_file).read_text())
    sources, identical, differences = reference["sources"], {}, []
    for name, mode in COMPARED.items():
        tokens = translation_ids(model, tokenizer, sources, mode)
        same = [i for i, ids in enumerate(tokens) if ids == reference[name][i]]
        identical[name] = len(same)
        for i in sorted(set(range(len(sources))) - set(same))[:DIFFERENCES_SHOWN]:
            at = first_difference(reference[name][i], tokens[i])
            differences.append({
                "mode": name, "sentence": i, "position": at,
                "package": tokenizer.convert_ids_to_tokens(reference[name][i][at : at + 3]),
                "remote_code": tokenizer.convert_ids_to_tokens(tokens[i][at : at + 3]),
            })  # fmt: skip
    result = {"compared": len(sources), "identical": identical, "differences": differences}
    if differences:
        raise ComparisonFailed(result)
    return result


class ComparisonFailed(AssertionError):
    """Some sentence's tokens differ from the installed package's; `result` says which, token by token."""

    def __init__(self, result: dict):
        counts = ", ".join(f"{name} {count} of {result['compared']}" for name, count in result["identical"].items())
        super().__init__(f"tokens identical to the installed package's: {counts}")
        self.result = result


def check(folder: str, reference_file: str | None = None) -> dict:
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
    result = {"translations": [output["translation_text"] for output in translator(SOURCES)]}
    if reference_file:
        result.update(compare_with(reference_file, model, tokenizer))
    return result


def main() -> None:
    sys.modules["hf_vanilla"] = None  # `import hf_vanilla` fails, as where the package is not installed
    import transformers

    result = {"transformers": transformers.__version__}
    try:
        result.update(status="pass", **check(*sys.argv[1:3]))
    except ComparisonFailed as failed:
        result.update(status="error", error=f"ComparisonFailed: {failed}", **failed.result)
    except Exception as error:  # the record says which error, whatever it is
        message = " ".join(str(error).split())
        result.update(status="error", error=f"{type(error).__name__}: {message}"[:400])
        result["where"] = traceback.format_exc().strip().splitlines()[-3:-1]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
