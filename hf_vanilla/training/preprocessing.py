"""From parallel text to training batches' ids, once per corpus: a BPE trained on a sample, then every pair tokenized
into an on-disk cache that every process of a run and every later run opens (fairseq's binarized data, transformers'
`main_process_first` + `datasets` cache).

The cache lives under `<data_cache_dir>` (default `<HF_DATASETS_CACHE>/hf_vanilla`):
- `tokenizers/<key>/`: the BPE of a corpus, keyed by the training split, the vocabulary size and the sample size;
- `tokenized/<key>/`: per split, Arrow files (one per worker process) with `input_ids` and `labels` in the smallest
  integer type that holds the vocabulary and `source_length`/`target_length` columns for the token-budget sampler,
  and `hf_vanilla.json` listing them; keyed by the corpus, the tokenizer and the length limit. Training pairs over
  the limit are left out (counted); evaluation pairs never.
Both are written under a temporary name and renamed into place, so a killed run leaves nothing half-written.

Every pass over a corpus reads its files as a stream (`data.arrow_batches`) and writes large record batches: what a
process holds does not grow with the corpus, page cache included (a memory-mapped pass keeps every page it touched
in the process's resident set).
"""

import hashlib
import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset as TorchDataset
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..data import arrow_batches, arrow_files
from ..tokenization import CorpusEncoder, train_bpe_tokenizer


logger = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when the layout of the cached files changes
MANIFEST = "hf_vanilla.json"  # written last: a tokenized folder holding it is complete
SAMPLE_SEED = 0  # the tokenizer's sample does not follow the training seed, so every seed shares one tokenizer
MIN_PAIRS_PER_WORKER = 50_000  # below this, starting worker processes costs more than it saves
ENCODE_ROWS = 2000  # pairs encoded at a time
# Rows per record batch of the tokenized files (~20 MB of ids): opening a file reads every batch's header, and this
# kernel maps a large folio (~400 KB) around each; the worker that writes holds one batch.
TOKENIZED_BATCH_ROWS = 1 << 17


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
    smaller corpus), read in one streaming pass over the table: what the BPE learns from (Marian's
    `--sentencepiece-max-lines`). Memory is one batch, never the corpus."""
    keep, rng = sentences / (2 * len(train)), np.random.default_rng(seed)
    for batch in arrow_batches(train, ["source", "target"]):
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


def _length_type(max_length: int | None) -> np.dtype:
    """16-bit lengths where the limit allows (what the sampler reads for every pair), else 32."""
    return np.dtype(np.uint16 if max_length is not None and max_length <= np.iinfo(np.uint16).max else np.uint32)


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
            "source_length": pa.array(source_lengths),
            "target_length": pa.array(target_lengths),
        }
    )
    if max_length is not None:
        table = table.filter(pa.array((source_lengths <= max_length) & (target_lengths <= max_length)))
    return table.cast(_schema(source_encoder, max_length))


def _schema(encoder: CorpusEncoder, max_length: int | None) -> pa.Schema:
    ids, lengths = pa.large_list(pa.from_numpy_dtype(encoder.dtype)), pa.from_numpy_dtype(_length_type(max_length))
    return pa.schema({"input_ids": ids, "labels": ids, "source_length": lengths, "target_length": lengths})


def length_columns(tokenized) -> tuple[np.ndarray, np.ndarray]:
    """The `source_length` and `target_length` columns of a tokenized split as numpy arrays: two bytes a pair each,
    read straight from the Arrow columns (indexing a `datasets` column row by row would take minutes at millions of
    pairs, and its numpy formatting held ~40 bytes a pair on the way)."""
    table = tokenized.with_format("arrow").select_columns(["source_length", "target_length"])[:]
    return table.column("source_length").to_numpy(), table.column("target_length").to_numpy()


class TokenizedRows(TorchDataset):
    """The `input_ids` and `labels` of tokenized pairs, read from the cache's Arrow files with `os.pread` at each
    access: what the training batches read.

    A memory-mapped table (what `datasets` gives) puts the page cache around every row read into the process, and
    this kernel maps whole large folios (~400 KB a random row here): the first few batches of random pairs made
    hundreds of MB of a WMT-size corpus resident. Reading the rows holds only them. Opening walks the files' record
    batches through a memory map that it closes again, keeping where each batch's buffers lie (six numbers a batch).
    """

    def __init__(self, files: list[str], columns: tuple[str, ...] = ("input_ids", "labels")):
        self.files, self.columns = list(files), columns
        self.layout: list[tuple[int, list[tuple[int, int, np.dtype]]]] = []  # per record batch: file, column buffers
        first_rows, rows = [], 0
        for number, path in enumerate(self.files):
            with pa.memory_map(path) as source:
                start = source.read_buffer(1).address  # where the file begins in this mapping
                source.seek(0)
                for batch in pa.ipc.open_stream(source):
                    buffers = [self._buffer_positions(batch.column(name), start, path) for name in columns]
                    self.layout.append((number, buffers))
                    first_rows.append(rows)
                    rows += batch.num_rows
        self.first_rows, self.rows = np.asarray(first_rows, dtype=np.int64), rows
        self._descriptors: dict[int, int] = {}
        self._pid = None

    @staticmethod
    def _buffer_positions(column: pa.Array, start: int, path: str) -> tuple[int, int, np.dtype]:
        """File positions of a list column's offsets (int64) and values, and the values' dtype."""
        if not pa.types.is_large_list(column.type) or column.null_count:
            raise ValueError(f"{path}: expected a large_list column without nulls, got {column.type}.")
        _, offsets, _, values = column.buffers()
        dtype = np.dtype(column.type.value_type.to_pandas_dtype())
        return (
            offsets.address - start + 8 * column.offset,
            values.address - start + dtype.itemsize * column.values.offset,
            dtype,
        )

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        if not 0 <= index < self.rows:
            raise IndexError(f"row {index} of {self.rows}")
        batch = int(np.searchsorted(self.first_rows, index, side="right")) - 1
        number, buffers = self.layout[batch]
        descriptor, local = self._descriptor(number), index - int(self.first_rows[batch])
        row = {}
        for name, (offsets, values, dtype) in zip(self.columns, buffers, strict=True):
            first, last = np.frombuffer(os.pread(descriptor, 16, offsets + 8 * local), dtype=np.int64).tolist()
            data = os.pread(descriptor, (last - first) * dtype.itemsize, values + first * dtype.itemsize)
            row[name] = np.frombuffer(data, dtype=dtype).tolist()
        return row

    def _descriptor(self, number: int) -> int:
        if self._pid != os.getpid():  # a DataLoader worker forked from the process that opened them
            self._descriptors, self._pid = {}, os.getpid()
        if number not in self._descriptors:
            self._descriptors[number] = os.open(self.files[number], os.O_RDONLY)
        return self._descriptors[number]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_descriptors": {}, "_pid": None}

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for descriptor in self._descriptors.values():
                os.close(descriptor)


def training_rows(tokenized, columns: tuple[str, ...] = ("input_ids", "labels")):
    """What the training batches read: `TokenizedRows` over the files of a tokenized split from the cache, or the
    split's own columns for anything else (a dataset in memory; a system without `os.pread`)."""
    files = arrow_files(tokenized)
    schema = tokenized.features.arrow_schema
    lists = all(pa.types.is_large_list(schema.field(name).type) for name in columns)
    if files is None or not lists or not hasattr(os, "pread"):
        return tokenized.select_columns(list(columns))
    return TokenizedRows(files, columns)


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
    built = not (folder / MANIFEST).is_file()
    if built:
        start = time.monotonic()
        _build_tokenized(corpus, tokenizer, max_length, folder, num_workers)
        logger.warning("Tokenized the corpus in %.1f s into %s.", time.monotonic() - start, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    splits = {
        split: datasets.concatenate_datasets([datasets.Dataset.from_file(str(folder / shard)) for shard in shards])
        for split, shards in manifest["splits"].items()
    }
    return TokenizedCorpus(datasets.DatasetDict(splits), manifest["dropped_training_pairs"], folder, built)


def _build_tokenized(corpus, tokenizer, max_length: int, folder: Path, num_workers: int | None) -> None:
    staging = folder.with_name(f"{folder.name}.incomplete-{os.getpid()}")
    if not num_workers:
        num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if num_workers > 1:
        # The workers are forked; the Rust tokenizer's own threads would only compete with them (and warn).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    encoders = (CorpusEncoder(tokenizer), CorpusEncoder(tokenizer, as_target=True))
    manifest, kept = {"max_length": max_length, "splits": {}}, {}
    for split, dataset in corpus.items():
        workers = max(1, min(num_workers, math.ceil(len(dataset) / MIN_PAIRS_PER_WORKER)))
        shards = [f"{split}/data-{shard:05d}-of-{workers:05d}.arrow" for shard in range(workers)]
        bounds = np.linspace(0, len(dataset), workers + 1).astype(int).tolist()
        limit = max_length if split == "train" else None
        jobs = [
            (dataset, start, stop, staging / shard, encoders, limit)
            for start, stop, shard in zip(bounds[:-1], bounds[1:], shards, strict=True)
        ]
        (staging / split).mkdir(parents=True)
        kept[split] = _run_jobs(jobs, len(dataset), f"tokenizing {split}")
        manifest["splits"][split] = shards
    manifest["dropped_training_pairs"] = dropped = len(corpus["train"]) - kept["train"] if "train" in corpus else 0
    if "train" in corpus:
        logger.warning(
            "Length filter: kept %d training pairs, dropped %d longer than %d tokens.",
            kept["train"],
            dropped,
            max_length,
        )
    (staging / MANIFEST).write_text(json.dumps(manifest))
    _publish(staging, folder)


def _encode_range(
    dataset, start: int, stop: int, path: Path, encoders: tuple, max_length: int | None, progress=None
) -> int:
    """Pairs `start` to `stop` of `dataset` encoded into the Arrow file `path`, in record batches of
    `TOKENIZED_BATCH_ROWS` rows (so that opening it reads few headers); returns how many pairs the limit kept."""
    progress = progress or _count_in_shared_total
    schema, pending, position, kept = _schema(encoders[0], max_length), [], 0, 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in arrow_batches(dataset, ["source", "target"]):
            first, last = max(start - position, 0), min(stop - position, batch.num_rows)
            position += batch.num_rows
            for offset in range(first, last, ENCODE_ROWS):
                rows = min(ENCODE_ROWS, last - offset)
                pending.append(encode_pairs(batch.slice(offset, rows), *encoders, max_length))
                progress(rows)
                if sum(table.num_rows for table in pending) >= TOKENIZED_BATCH_ROWS:
                    kept += _write_batch(writer, pending)
            if position >= stop:
                break
        return kept + _write_batch(writer, pending)


def _write_batch(writer: pa.ipc.RecordBatchStreamWriter, tables: list[pa.Table]) -> int:
    """Writes `tables` as one record batch and empties the list; returns their rows."""
    if not tables:
        return 0
    batch = pa.concat_tables(tables).combine_chunks()
    writer.write_table(batch)
    tables.clear()
    return batch.num_rows


_shared_total = None  # in a worker process: the count of pairs encoded by all workers, for the progress bar


def _share_total(total) -> None:
    global _shared_total
    _shared_total = total


def _count_in_shared_total(pairs: int) -> None:
    with _shared_total.get_lock():
        _shared_total.value += pairs


def _run_jobs(jobs: list[tuple], pairs: int, description: str) -> int:
    """`_encode_range` over each job, in a process of its own when there are several, under one progress bar;
    returns the pairs kept."""
    with tqdm(total=pairs, desc=description, unit=" pairs") as bar:
        if len(jobs) == 1:
            return _encode_range(*jobs[0], progress=bar.update)
        # fork where it is the platform's way (the workers inherit the encoders); spawn elsewhere
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
        total = context.Value("q", 0)
        with ProcessPoolExecutor(len(jobs), mp_context=context, initializer=_share_total, initargs=(total,)) as pool:
            futures = [pool.submit(_encode_range, *job) for job in jobs]
            while wait(futures, timeout=0.5).not_done:
                bar.update(total.value - bar.n)
            bar.update(total.value - bar.n)
            return sum(future.result() for future in futures)
