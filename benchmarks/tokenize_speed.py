"""How fast a corpus is tokenized on one core, by each way there is to do it with our byte-level BPE, in one run:

- `encode_batch_fast`: the tokenizer's own pipeline (its Rust threads off, as in our `Dataset.map` workers);
- `pre_tokenize_str` alone: the tokenizer's own pre-tokenizer, without the BPE: the bound on any word cache behind it;
- word cache behind `pre_tokenize_str`: fastBPE's way on the tokenizer's public pieces (each distinct piece through
  `model.tokenize` once, kept in a dict, EOS appended);
- `WordCachedEncoder`: the words split by Python's `regex`, each new word through the tokenizer's pieces once.

Each way encodes the same sentences (Multi30k training pairs joined two by two, ~24 words a side, as
`benchmarks/scale.py` writes its corpora), `ENCODE_ROWS` at a time as a tokenizing worker does, after one warm-up pass
that fills the caches as a long corpus would and checks every way's ids against `encode_batch_fast`'s; the best of
`--repeats` passes counts, the ways alternating so that a drift of the machine hits each alike.

    python -m benchmarks.tokenize_speed --json docs/results/tokenize-speed-cpu.json
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks import markdown, record
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import WordCachedEncoder, train_bpe_tokenizer
from hf_vanilla.training.preprocessing import ENCODE_ROWS


def joined_pairs(language: str, count: int, seed: int = 0) -> list[str]:
    """`count` sentences, each two random Multi30k training sentences joined, as `benchmarks.scale` writes them."""
    multi30k, _ = BUNDLED_CORPORA["multi30k"]
    sentences = np.array(list(stream_lines(multi30k / f"train.{language}.gz")), dtype=object)
    first, second = np.random.default_rng(seed).integers(0, len(sentences), (2, count))
    return [f"{a} {b}" for a, b in zip(sentences[first], sentences[second], strict=True)]


def pre_tokenizer_word_cache(backend):
    """fastBPE's way on the tokenizer's public pieces: `pre_tokenize_str` per sentence, `model.tokenize` per new
    piece, remembered; the post-processor's EOS appended."""
    pre_tokenize, tokenize, cache = backend.pre_tokenizer.pre_tokenize_str, backend.model.tokenize, {}
    eos = backend.encode("").ids

    def encode_piece(piece: str) -> tuple[int, ...]:
        ids = cache[piece] = tuple(token.id for token in tokenize(piece))
        return ids

    def encode(texts: list[str]) -> list[list[int]]:
        return [
            [i for piece, _ in pre_tokenize(text) for i in (cache.get(piece) or encode_piece(piece))] + eos
            for text in texts
        ]

    return encode


def ways(tokenizer) -> dict:
    backend = tokenizer.backend_tokenizer
    return {
        "encode_batch_fast": lambda texts: [encoding.ids for encoding in backend.encode_batch_fast(texts)],
        "pre_tokenize_str alone": lambda texts: [len(backend.pre_tokenizer.pre_tokenize_str(text)) for text in texts],
        "word cache behind pre_tokenize_str": pre_tokenizer_word_cache(backend),
        "WordCachedEncoder": WordCachedEncoder.for_tokenizer(tokenizer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=100_000, help="per language")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core, as in each tokenizing worker process
    texts = joined_pairs("en", args.sentences) + joined_pairs("de", args.sentences)
    tokenizer = train_bpe_tokenizer(texts[:: max(1, len(texts) // 100_000)], vocab_size=8000, show_progress=False)
    expected = tokenizer(texts)["input_ids"]
    candidates = ways(tokenizer)
    best = dict.fromkeys(candidates, float("inf"))
    for name, encode in candidates.items():  # warm-up: the caches fill, and each way's ids are checked
        ids = encode(texts)
        if name != "pre_tokenize_str alone":
            assert ids == expected, f"{name} gives other ids than the tokenizer"
    for _ in range(args.repeats):
        for name, encode in candidates.items():
            start = time.perf_counter()
            for piece in range(0, len(texts), ENCODE_ROWS):  # as a tokenizing worker does, keeping nothing
                encode(texts[piece : piece + ENCODE_ROWS])
            best[name] = min(best[name], time.perf_counter() - start)
    library = len(texts) / best["encode_batch_fast"]
    results = [
        {
            "way": name,
            "sentences_per_s": round(len(texts) / seconds),
            "vs_encode_batch_fast": round(len(texts) / seconds / library, 2),
        }
        for name, seconds in best.items()
    ]
    rows = [[r["way"], f"{r['sentences_per_s'] / 1000:.1f}k", f"{r['vs_encode_batch_fast']:.2f}x"] for r in results]
    print(markdown(["way (one core)", "sentences/s", "vs encode_batch_fast"], rows))
    document = record("benchmarks.tokenize_speed", results, sentences=len(texts), threads=1)
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
