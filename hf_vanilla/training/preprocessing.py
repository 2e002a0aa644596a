"""From parallel text to training batches' ids, once per corpus: a BPE trained on a sample, then every pair tokenized
into an on-disk cache that every process of a run and every later run opens (fairseq's binarized data, transformers'
`main_process_first` + `datasets` cache).

The cache lives under `<data_cache_dir>` (default `<HF_DATASETS_CACHE>/hf_vanilla`):
- `tokenizers/<key>/`: the BPE of a corpus, keyed by the training split, the vocabulary size and the sample size;
- `tokenized/<key>/`: a `save_to_disk` `DatasetDict` with `input_ids` and `labels` in the smallest integer type that
  holds the vocabulary and `source_length`/`target_length` columns for the token-budget sampler, keyed by the corpus,
  the tokenizer and the length limit. Training pairs over the limit are left out (counted); evaluation pairs never.
Both are written under a temporary name and renamed into place, so a killed run leaves nothing half-written.
"""

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..tokenization import CorpusEncoder, train_bpe_tokenizer


logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the layout of the cached files changes
SAMPLE_SEED = 0  # the tokenizer's sample does not follow the training seed, so every seed shares one tokenizer
MIN_PAIRS_PER_WORKER = 50_000  # below this, starting worker processes costs more than it saves


def default_cache_dir() -> Path:
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "hf_vanilla"


def _key(**parts) -> str:
    return hashlib.sha256(json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True).encode()).hexdigest()[:24]


def _publish(staging: Path, final: Path) -> None:
    """Rename a finished `staging` folder to `final`; if another run got there first, keep theirs."""
    try:
        os.replace(staging, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def sample_sentences(train, sentences: int, seed: int = SAMPLE_SEED) -> Iterator[list[str]]:
    """Batches of about `sentences` sentences (both sides of ~`sentences / 2` pairs drawn at random, all of them for a
    smaller corpus), read from the memory-mapped table: what the BPE learns from (Marian's
    `--sentencepiece-max-lines`). Memory is the sample's indices, never the corpus."""
    pairs = len(train)
    if sentences < 2 * pairs:
        rng, chunk, keep = np.random.default_rng(seed), 1 << 20, sentences / (2 * pairs)
        picked = [
            start + np.flatnonzero(rng.random(min(chunk, pairs - start)) < keep) for start in range(0, pairs, chunk)
        ]
        train = train.select(np.concatenate(picked))
    for batch in train.with_format("arrow").iter(batch_size=10_000):
        yield batch.column("source").to_pylist()
        yield batch.column("target").to_pylist()


def prepare_tokenizer(
    train,
    vocab_size: int,
    sample: int,
    output_dir: Path,
    cache_dir: Path,
    tokenizer_path: str | None = None,
    resuming: bool = False,
    is_main_process: bool = True,
) -> PreTrainedTokenizerBase:
    """The tokenizer at `tokenizer_path`; when resuming, the run's own; else the joint BPE of `vocab_size` learnt from
    a `sample` of the training split, from the cache or trained into it. Saved to `<output_dir>/tokenizer`."""
    if tokenizer_path:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    if resuming and (output_dir / "tokenizer").is_dir():  # the checkpoints' ids come from this one
        return AutoTokenizer.from_pretrained(output_dir / "tokenizer")
    folder = cache_dir / "tokenizers" / _key(corpus=train._fingerprint, vocab_size=vocab_size, sample=sample)
    if not (folder / "tokenizer.json").is_file():
        start = time.monotonic()
        tokenizer = train_bpe_tokenizer(sample_sentences(train, sample), vocab_size=vocab_size, show_progress=False)
        staging = folder.with_name(f"{folder.name}.incomplete-{os.getpid()}")
        tokenizer.save_pretrained(staging)
        _publish(staging, folder)
        logger.warning(
            "Trained a %d-entry BPE in %.1f s, cached in %s.", len(tokenizer), time.monotonic() - start, folder
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if is_main_process:
        tokenizer.save_pretrained(output_dir / "tokenizer")
    return tokenizer


def _ids_column(ids: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids))


def encode_pairs(
    batch: pa.Table, source_encoder: CorpusEncoder, target_encoder: CorpusEncoder, max_length: int | None
) -> pa.Table:
    """Token ids and lengths of a batch of pairs, without the pairs longer than `max_length` tokens (if given)."""
    source_ids, source_lengths = source_encoder(batch.column("source").to_pylist())
    target_ids, target_lengths = target_encoder(batch.column("target").to_pylist())
    table = pa.table(
        {
            "input_ids": _ids_column(source_ids, source_lengths),
            "labels": _ids_column(target_ids, target_lengths),
            "source_length": pa.array(source_lengths.astype(np.int32)),
            "target_length": pa.array(target_lengths.astype(np.int32)),
        }
    )
    if max_length is None:
        return table
    return table.filter(pa.array((source_lengths <= max_length) & (target_lengths <= max_length)))


def length_columns(tokenized) -> tuple[np.ndarray, np.ndarray]:
    """The `source_length` and `target_length` columns of a tokenized split as numpy arrays, read at once (indexing
    a `datasets` column row by row would take minutes at millions of pairs)."""
    lengths = tokenized.select_columns(["source_length", "target_length"]).with_format("numpy")[:]
    return lengths["source_length"], lengths["target_length"]


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides the tokenizer's ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return hashlib.sha256(backend.to_str().encode()).hexdigest()
    from datasets.fingerprint import Hasher

    return Hasher.hash(tokenizer)


@dataclass
class TokenizedCorpus:
    """The tokenized splits, how many training pairs the length limit left out, where the cache lies, and whether
    this process built it (or opened what another process or an earlier run built)."""

    splits: "object"  # a datasets.DatasetDict
    dropped: int
    path: Path
    built: bool


def tokenize_corpus(
    corpus, tokenizer: PreTrainedTokenizerBase, max_length: int, cache_dir: Path, num_workers: int | None = None
) -> TokenizedCorpus:
    """Every split of `corpus` tokenized, from the cache or built into it with `num_workers` processes."""
    import datasets

    key = _key(
        corpus={split: dataset._fingerprint for split, dataset in corpus.items()},
        tokenizer=tokenizer_identity(tokenizer),
        max_length=max_length,
    )
    folder = cache_dir / "tokenized" / key
    built = not (folder / "dataset_dict.json").is_file()
    if built:
        start = time.monotonic()
        _build_tokenized(corpus, tokenizer, max_length, folder, num_workers)
        logger.warning("Tokenized the corpus in %.1f s into %s.", time.monotonic() - start, folder)
    splits = datasets.load_from_disk(str(folder))
    meta = json.loads((folder / "hf_vanilla.json").read_text())
    return TokenizedCorpus(splits, meta["dropped_training_pairs"], folder, built)


def _build_tokenized(corpus, tokenizer, max_length: int, folder: Path, num_workers: int | None) -> None:
    import datasets

    staging = folder.with_name(f"{folder.name}.incomplete-{os.getpid()}")
    work = staging.with_name(staging.name + "-work")
    if not num_workers:
        num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if num_workers > 1:
        # The workers are forked; the Rust tokenizer's own threads would only compete with them (and warn).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    encoders = {"source_encoder": CorpusEncoder(tokenizer), "target_encoder": CorpusEncoder(tokenizer, as_target=True)}
    tokenized = {}
    for split, dataset in corpus.items():
        workers = max(1, min(num_workers, math.ceil(len(dataset) / MIN_PAIRS_PER_WORKER)))
        tokenized[split] = dataset.with_format("arrow").map(
            encode_pairs,
            batched=True,
            batch_size=2000,
            num_proc=workers if workers > 1 else None,
            fn_kwargs={**encoders, "max_length": max_length if split == "train" else None},
            remove_columns=dataset.column_names,
            cache_file_name=str(work / f"{split}.arrow"),
            new_fingerprint=f"{folder.name}-{split}",
            desc=f"tokenizing {split}",
        )
    dropped = len(corpus["train"]) - len(tokenized["train"]) if "train" in corpus else 0
    if "train" in corpus:
        logger.warning(
            "Length filter: kept %d training pairs, dropped %d longer than %d tokens.",
            len(tokenized["train"]),
            dropped,
            max_length,
        )
    datasets.DatasetDict({split: data.with_format(None) for split, data in tokenized.items()}).save_to_disk(staging)
    (staging / "hf_vanilla.json").write_text(json.dumps({"dropped_training_pairs": dropped, "max_length": max_length}))
    shutil.rmtree(work, ignore_errors=True)
    _publish(staging, folder)
