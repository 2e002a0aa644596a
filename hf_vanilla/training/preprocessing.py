"""From parallel text to training batches' ids, once per corpus: a BPE trained on a sample, then every pair tokenized
by `Dataset.map(num_proc=...)` into an on-disk cache that every process of a run and every later run opens
(transformers' `main_process_first` + the `datasets` cache, as `run_translation.py` does it).

Under `<data_cache_dir>` (default `<HF_DATASETS_CACHE>/hf_vanilla`; layout and faults: docs/training.md, "The data
cache"): `tokenizers/<key>/`, a BPE; `tokenized/<key>/<split>*.arrow`, `input_ids` and `labels` in the smallest integer
type that holds the vocabulary with `source_length`/`target_length` for the token-budget sampler (training pairs over
the length limit left out and counted, evaluation pairs never); `locks/` (`cache_entries`). Keys are hashes of public
values (`data.cache_key`): the files behind each split, the tokenizer's serialised form, the limits.
"""

import errno
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..data import cache_key, datasets_cache_dir, file_stamp
from ..tokenization import WordCachedEncoder, train_bpe_tokenizer, without_call_state
from .cache_entries import (
    MANIFEST,
    Claim,
    check_corpus_files,
    entry_lock,
    read_manifest,
    remove_temporary_files,
)
from .folders import save_whole


logger = logging.getLogger(__name__)

# Part of every key: bump when the layout of the cached files or the protocol of building them changes, so that a
# release that builds otherwise never shares an entry with this one (4: entries built under a lock).
CACHE_FORMAT = 4
SAMPLE_SEED = 0  # the tokenizer's sample does not follow the training seed, so every seed shares one tokenizer
MIN_PAIRS_PER_WORKER = 50_000  # below this, starting worker processes costs more than it saves
ENCODE_ROWS = 2000  # pairs a worker encodes at a time
WRITER_BATCH_ROWS = 1 << 15  # pairs per record batch of the tokenized files (~5 MB of ids), before the length filter


def default_cache_dir() -> Path:
    return datasets_cache_dir() / "hf_vanilla"


def dataset_identity(dataset) -> dict:
    """What identifies a split's rows through public values: the Arrow files behind it (path, size, mtime) and the
    number of rows (a corpus cut to its first N pairs reads the same files). A dataset held in memory has no files;
    its rows are hashed instead, as the dataset yields them: a `shuffle` or `select` view keeps its parent's table
    and reorders it through an indices mapping."""
    if not dataset.cache_files:
        from datasets.fingerprint import Hasher

        return {"in_memory": Hasher.hash(dataset.with_format("arrow")[:])}
    return {"files": [file_stamp(Path(file["filename"])) for file in dataset.cache_files], "rows": len(dataset)}


def sample_sentences(train, sentences: int, seed: int = SAMPLE_SEED):
    """Batches of about `sentences` sentences (both sides of ~`sentences / 2` pairs drawn at random, all of them for a
    smaller corpus), read in one pass over the table: what the BPE learns from (Marian's `--sentencepiece-max-lines`).
    Memory is one batch, never the corpus."""
    keep, rng = sentences / (2 * len(train)), np.random.default_rng(seed)
    for batch in train.with_format("arrow").select_columns(["source", "target"]).iter(batch_size=WRITER_BATCH_ROWS):
        if keep < 1:
            batch = batch.filter(pa.array(rng.random(batch.num_rows) < keep))
        yield batch.column("source").to_pylist()
        yield batch.column("target").to_pylist()


def prepare_tokenizer(
    train,
    vocab_size: int,
    sample: int,
    output_dir: Path,
    cache_dir: Path,
    tokenizer_path: str | None = None,
    is_main_process: bool = True,
) -> PreTrainedTokenizerBase:
    """The tokenizer at `tokenizer_path`; else the joint BPE of `vocab_size` learnt from a `sample` of the training
    split, from the cache or trained into it, then saved to `<output_dir>/tokenizer`."""
    if tokenizer_path:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    key = cache_key(format=CACHE_FORMAT, corpus=dataset_identity(train), vocab_size=vocab_size, sample=sample)
    folder = cache_dir / "tokenizers" / key
    with entry_lock(cache_dir, "tokenizers", key) as claim:
        if not (folder / "tokenizer.json").is_file():
            start = time.monotonic()
            tokenizer = train_bpe_tokenizer(
                sample_sentences(train, sample), vocab_size=vocab_size, show_progress=False
            )
            save_whole(folder, tokenizer, check=claim.check)
            logger.warning(
                "Trained a %d-entry BPE in %.1f s, cached in %s.", len(tokenizer), time.monotonic() - start, folder
            )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if is_main_process:
        tokenizer.save_pretrained(output_dir / "tokenizer")
    return tokenizer


def smallest_unsigned(largest: int | None) -> np.dtype:
    """uint16 where every value is at most `largest` and it fits, else uint32."""
    return np.dtype(np.uint16 if largest is not None and largest <= np.iinfo(np.uint16).max else np.uint32)


def id_type(tokenizer: PreTrainedTokenizerBase) -> np.dtype:
    """The smallest unsigned integer type that holds every id of the tokenizer."""
    return smallest_unsigned(len(tokenizer) - 1)


class PairEncoder:
    """`Dataset.map`'s function over a batch of pairs: their token ids and lengths, without the pairs longer than
    `max_length` tokens (if given). A byte-level BPE goes through a `WordCachedEncoder` (docs/results/
    tokenize-speed-cpu.json; each worker gets its own copy and cache), any other tokenizer through its own call."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int | None, claim: Claim | None = None):
        self.tokenizer, self.max_length, self.claim = tokenizer, max_length, claim
        self.id_type, self.length_type = id_type(tokenizer), smallest_unsigned(max_length)
        self.word_cache = WordCachedEncoder.for_tokenizer(tokenizer)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Encoded `ENCODE_ROWS` pairs at a time (what the per-sentence Python objects cost stays small) and returned
        as one table, which `Dataset.map` writes as one record batch. Under a `claim`, only while it holds."""
        if self.claim is not None:
            self.claim.check()
        starts = range(0, batch.num_rows, ENCODE_ROWS)
        pieces = [self.encode_piece(batch.slice(start, ENCODE_ROWS)) for start in starts]
        return pa.concat_tables(pieces) if pieces else self.encode_piece(batch)

    @property
    def identity(self) -> str:
        """What encodes the text, and the tokenizers release it runs on: part of the tokenized cache's key."""
        if self.word_cache is not None:
            return self.word_cache.identity
        return f"tokenizer, tokenizers {tokenizers.__version__}"

    def encode(self, texts: list[str], as_target: bool) -> pa.ListArray:
        """The ids of `texts` (special tokens added; `text_target=` for a tokenizer with a target vocabulary or
        language codes) as an Arrow list column of the id type."""
        if self.word_cache is not None:
            ids = self.word_cache(texts)
        else:
            ids = (self.tokenizer(text_target=texts) if as_target else self.tokenizer(texts))["input_ids"]
        return pa.array(ids, type=pa.list_(pa.from_numpy_dtype(self.id_type)))

    def encode_piece(self, batch: pa.Table) -> pa.Table:
        input_ids = self.encode(batch.column("source").to_pylist(), False)
        labels = self.encode(batch.column("target").to_pylist(), True)
        source_lengths = pc.list_value_length(input_ids).to_numpy()
        target_lengths = pc.list_value_length(labels).to_numpy()
        source_length, target_length = source_lengths.astype(self.length_type), target_lengths.astype(self.length_type)
        columns = {"input_ids": input_ids, "labels": labels, "source_length": source_length}
        table = pa.table({**columns, "target_length": target_length})
        if self.max_length is not None:
            keep = (source_lengths <= self.max_length) & (target_lengths <= self.max_length)
            if not keep.all():  # a filter copies every column
                table = table.filter(pa.array(keep))
        return table


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> str:
    """Everything that decides the tokenizer's ids: its serialised form, or the library's hash of it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.to_str()
    from datasets.fingerprint import Hasher

    return Hasher.hash(tokenizer)


@dataclass
class TokenizedCorpus:
    """The tokenized splits, the training pairs the length limit left out, the cache folder, whether this built it."""

    splits: "object"  # a datasets.DatasetDict
    dropped: int
    path: Path
    built: bool

    @classmethod
    def of(cls, splits: dict, corpus, path: Path, built: bool) -> "TokenizedCorpus":
        import datasets

        dropped = len(corpus["train"]) - len(splits["train"]) if "train" in corpus else 0
        return cls(datasets.DatasetDict(splits), dropped, path, built)


def tokenize_corpus(
    corpus,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cache_dir: Path,
    num_workers: int | None = None,
    may_rebuild: bool = True,
) -> TokenizedCorpus:
    """Every split of `corpus` tokenized by `Dataset.map` with `num_workers` processes (default: one per core), from
    the cache or built into it, under the entry's lock. Only a process that `may_rebuild` (the one that prepares the
    data) builds, or builds again a complete cache that cannot be read; the others open what it built, and for them
    such a cache is an error. Other `OSError`s propagate naming the folder (docs/training.md, "The data cache")."""
    tokenizer = without_call_state(tokenizer)  # the key and the encoder as a freshly loaded tokenizer has them
    key = cache_key(
        format=CACHE_FORMAT,
        corpus={split: dataset_identity(dataset) for split, dataset in corpus.items()},
        tokenizer=tokenizer_identity(tokenizer),
        encoder=PairEncoder(tokenizer, max_length).identity,
        max_length=max_length,
    )
    folder = cache_dir / "tokenized" / key
    with entry_lock(cache_dir, "tokenized", key) as claim:
        try:
            manifest, problem = read_manifest(folder)
            if problem is None:
                try:
                    if manifest is not None:
                        return open_listed(folder, manifest, corpus)
                    if may_rebuild:
                        return _tokenize_into(folder, key, corpus, tokenizer, max_length, num_workers, claim)
                    problem = f"no {MANIFEST}: did that process fail? Its log says why"
                except (pa.ArrowInvalid, OSError) as error:
                    if isinstance(error, OSError) and error.errno is not None:
                        raise  # a fault of the system (full disk, permissions, stale NFS handle), not of the bytes
                    check_corpus_files(corpus, error)  # Arrow reads the corpus too: rebuilding would not mend that
                    problem = str(error)
            if not may_rebuild:
                raise RuntimeError(
                    f"The tokenized cache {folder} cannot be read by this process ({problem}), though the process "
                    "that prepares the data has just built or checked it. Check that disk; deleting the folder makes "
                    "the next run build it again."
                )
            logger.warning("The tokenized cache %s cannot be read (%s): building it again.", folder, problem)
            claim.check()
            shutil.rmtree(folder)
            return _tokenize_into(folder, key, corpus, tokenizer, max_length, num_workers, claim)
        except OSError as error:
            error.add_note(f"(building or opening the tokenized cache {folder})")
            raise


def open_listed(folder: Path, manifest: dict, corpus) -> TokenizedCorpus:
    """The splits of a complete cache, opened from the files its manifest lists (no worker count involved)."""
    import datasets

    splits = {}
    for split, names in manifest["splits"].items():
        parts = [datasets.Dataset.from_file(str(folder / name)) for name in names]
        splits[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return TokenizedCorpus.of(splits, corpus, folder, built=False)


def _tokenize_into(folder: Path, key: str, corpus, tokenizer, max_length: int, num_workers: int | None, claim: Claim):

    folder.mkdir(parents=True, exist_ok=True)
    remove_temporary_files(folder, claim)
    existing = set(os.listdir(folder))
    logger.warning("Building the tokenized cache %s.", folder)
    if not num_workers:
        num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if num_workers > 1:
        # The workers are forked; the Rust tokenizer's own threads would only compete with them (and warn).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start, splits = time.monotonic(), {}
    for split, dataset in corpus.items():
        workers = max(1, min(num_workers, -(-len(dataset) // MIN_PAIRS_PER_WORKER)))
        try:
            splits[split] = (
                dataset.with_format("arrow")
                .map(
                    PairEncoder(tokenizer, max_length if split == "train" else None, claim),
                    batched=True,
                    batch_size=WRITER_BATCH_ROWS,
                    num_proc=workers if workers > 1 else None,
                    remove_columns=dataset.column_names,
                    cache_file_name=str(folder / f"{split}.arrow"),
                    new_fingerprint=cache_key(key=key, split=split),
                    # Our entry, keyed, checked against its manifest and built under its lock, is opened even under
                    # `datasets.disable_caching()`: else each process would rewrite files the others have mapped.
                    load_from_cache_file=True,
                    writer_batch_size=WRITER_BATCH_ROWS,
                    desc=f"tokenizing {split}",
                )
                .with_format(None)
            )
        except OSError as error:
            if error.errno != errno.ENOSPC and "No space left" not in str(error):
                raise
            claim.check()
            shutil.rmtree(folder, ignore_errors=True)
            raise OSError(
                errno.ENOSPC,
                f"The disk of {folder} filled up while tokenizing {split} (nothing was kept): the tokenized corpus "
                f"needs about {needed_space(corpus, tokenizer) / 1e6:.1f} MB there. Free that much, or give "
                "--data_cache_dir on a larger disk.",
            ) from error
    listed = {split: [Path(file["filename"]).name for file in data.cache_files] for split, data in splits.items()}
    files = {name for names in listed.values() for name in names}
    built = not files <= existing
    # written once, whole, renamed into place: other processes may be reading it
    staged = folder / f"{MANIFEST}.{os.getpid()}"
    sizes = {name: (folder / name).stat().st_size for name in sorted(files)}
    claim.check()
    staged.write_text(json.dumps({"splits": listed, "sizes": sizes}))
    os.replace(staged, folder / MANIFEST)
    tokenized = TokenizedCorpus.of(splits, corpus, folder, built)
    if built:
        logger.warning("Tokenized the corpus in %.1f s into %s.", time.monotonic() - start, folder)
        if "train" in corpus:
            message = "Length filter: kept %d training pairs, dropped %d longer than %d tokens."
            logger.warning(message, len(splits["train"]), tokenized.dropped, max_length)
    return tokenized


def needed_space(corpus, tokenizer: PreTrainedTokenizerBase, sample_pairs: int = ENCODE_ROWS) -> int:
    """What the tokenized corpus takes on disk in bytes, estimated by tokenizing the first `sample_pairs` pairs of
    each split: their Arrow bytes a pair (ids in the id type, offsets, lengths), times the split's pairs."""
    encoder, total = PairEncoder(tokenizer, None), 0.0
    for dataset in corpus.values():
        sample = dataset.with_format("arrow")[:sample_pairs]
        if sample.num_rows:
            total += encoder(sample).nbytes / sample.num_rows * len(dataset)
    return int(total)
