"""Parallel text in every form users hold it (`ACCEPTED_FORMS`), read as a stream into memory-mapped Arrow tables.

Whatever the form, `load_parallel_corpus` gives a `DatasetDict` of `source`/`target` string columns backed by Arrow
files in the `datasets` cache: the corpus is never a Python list, and a second read of the same files opens the cache.
"""

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .text_files import stream_lines


SPLIT_ALIASES = {"validation": ("val", "valid", "validation", "dev"), "test": ("test2016", "test")}
SPLITS = ("train", "validation", "test")

DEFAULT_PATTERN = "{split}.{lang}"
CORPORA = Path(__file__).parent / "corpora"
# Corpora shipped inside the package (provenance, terms and checksums in each folder's README): name -> folder and
# file pattern. `multi30k` is the raw text (score with sacreBLEU); `multi30k-tok` the lowercased, Moses-tokenized
# release that most multimodal-MT papers score with tokenized BLEU.
BUNDLED_CORPORA = {
    "multi30k": (CORPORA / "multi30k", DEFAULT_PATTERN),
    "multi30k-tok": (CORPORA / "multi30k" / "tok", "{split}.lc.norm.tok.{lang}"),
}
# File formats of dataset repositories and named split files, by suffix: the `datasets` builder that reads each.
DATASET_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
ACCEPTED_FORMS = (
    f"a bundled corpus ({', '.join(BUNDLED_CORPORA)}); a folder of aligned text files {{split}}.{{lang}}[.gz] "
    "(--data_pattern for other names); a folder of TSV pairs {split}.tsv[.gz]; a save_to_disk folder; a dataset "
    "repository (local or a Hub id, with --data_config) of JSON lines, parquet, arrow or CSV files holding a "
    "'translation' column or one column per language; or --train_file/--validation_file/--test_file"
)


def file_stamp(path: Path) -> tuple[str, int, int]:
    """What identifies a file's content for a cache: path, size and modification time."""
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def cache_key(**parts) -> str:
    """A short hash of `parts` (JSON-serialisable values): the name of a cache entry built from them."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def datasets_cache_dir() -> Path:
    """The `datasets` library's cache folder (`HF_DATASETS_CACHE`), where our copies of the text live too."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE)


def _load_local(path: Path, *args, **kwargs):
    """`datasets.load_dataset(*args)` over the local `path` (a file or a repository folder), cached under a key of
    the files' paths, sizes and modification times. The library's own key for a local repository with a README
    `configs:` section leaves the files out: a second folder of the same name (another copy of `wmt14`, say) was served
    the first one's cached rows."""
    import datasets

    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    key = cache_key(files=[file_stamp(file) for file in files if file.is_file()])
    cache_dir = datasets_cache_dir() / "hf_vanilla" / "local" / key
    return datasets.load_dataset(*args, cache_dir=str(cache_dir), **kwargs)


def aligned_text_pairs(source_path: str, target_path: str) -> Iterator[dict[str, str]]:
    """`{"source", "target"}` rows from two aligned text files; unequal line counts or an empty file raise
    `ValueError` naming both files."""
    sources, targets = stream_lines(source_path), stream_lines(target_path)
    count = 0
    for count, (source, target) in enumerate(itertools.zip_longest(sources, targets), start=1):
        if source is None or target is None:
            source_count = count - 1 + (source is not None) + sum(1 for _ in sources)
            target_count = count - 1 + (target is not None) + sum(1 for _ in targets)
            raise ValueError(
                f"Parallel files are not aligned: {source_path} has {source_count} lines but {target_path} has "
                f"{target_count}; line i of one must translate line i of the other."
            )
        yield {"source": source, "target": target}
    if count == 0:
        raise ValueError(f"Empty parallel files: {source_path} and {target_path} have no lines.")


def tsv_pairs(path: str) -> Iterator[dict[str, str]]:
    """`{"source", "target"}` rows from `source<TAB>target` lines; any other number of fields is an error naming the
    line (nothing is silently skipped)."""
    count = 0
    for count, line in enumerate(stream_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}: line {count} has {len(fields)} tab-separated fields, not source<TAB>target.")
        yield {"source": fields[0].strip(), "target": fields[1].strip()}
    if count == 0:
        raise ValueError(f"Empty TSV file: {path} has no lines.")


def _read_rows(generator, paths: tuple[str, ...], stamps: tuple) -> Iterator[dict[str, str]]:
    """`generator`'s rows from `paths` (`stamps` only key the `datasets` cache: a changed file is read again)."""
    yield from generator(*paths)


def _from_files(generator, split: str, *paths: Path):
    """A memory-mapped `Dataset` of the rows `generator` reads from `paths`, written into the `datasets` cache, with
    our own errors instead of the library's generic wrapper."""
    import datasets

    stamps = tuple(file_stamp(path) for path in paths)
    gen_kwargs = {"generator": generator, "paths": tuple(map(str, paths)), "stamps": stamps}
    try:
        return datasets.Dataset.from_generator(_read_rows, gen_kwargs=gen_kwargs, split=split)
    except datasets.exceptions.DatasetGenerationError as error:
        if isinstance(error.__cause__, ValueError):
            raise error.__cause__ from None
        raise


def _split_names(split: str) -> tuple[str, ...]:
    return SPLIT_ALIASES.get(split, (split,))


def find_split_file(folder: Path, split: str, language: str, pattern: str) -> Path | None:
    """The file of `split` in `language` under `folder`, gzipped or plain (`val.en.gz` for validation, say)."""
    for name in _split_names(split):
        for suffix in (".gz", ""):
            candidate = folder / (pattern.format(split=name, lang=language) + suffix)
            if candidate.is_file():
                return candidate
    return None


def _split_files(folder: Path, splits, languages: tuple[str, ...], pattern: str) -> dict[str, list[Path]]:
    """The file of each split in each of `languages` (`tsv` for TSV pairs) under `folder`, or an error naming what
    was looked for."""
    files = {}
    for split in splits:
        files[split] = [find_split_file(folder, split, language, pattern) for language in languages]
        if None in files[split]:
            language = languages[files[split].index(None)]
            looked_for = [pattern.format(split=name, lang=language) + "[.gz]" for name in _split_names(split)]
            raise FileNotFoundError(
                f"No {split} file for language '{language}' in {folder} (looked for {looked_for})."
            )
    return files


def _text_folder(folder: Path, source_language: str, target_language: str, pattern: str, splits) -> dict:
    files = _split_files(folder, splits, (source_language, target_language), pattern)
    return {split: _from_files(aligned_text_pairs, split, *pair) for split, pair in files.items()}


def _pick_splits(loaded, splits, description: str) -> dict:
    """`splits` of a loaded `DatasetDict`, each found under its name or an alias (`dev` for validation, ...)."""
    corpus = {}
    for split in splits:
        name = next((alias for alias in (split, *_split_names(split)) if alias in loaded), None)
        if name is None:
            raise ValueError(
                f"{description} has no {split} split (it has {sorted(loaded)}); give one with --{split}_file."
            )
        corpus[split] = loaded[name]
    return corpus


def select_pair(batch: pa.Table, source_path: list[str], target_path: list[str]) -> pa.Table:
    """`source`/`target` columns (whitespace-trimmed strings) from the columns or struct fields at the two paths."""

    def column(path: list[str]):
        values = batch.column(path[0])
        if len(path) > 1:
            values = pc.struct_field(values, path[1:])
        if values.null_count:
            raise ValueError(f"Column {'.'.join(path)} has {values.null_count} empty (null) rows; fill or drop them.")
        return pc.utf8_trim_whitespace(values.cast(pa.string()))

    return pa.table({"source": column(source_path), "target": column(target_path)})


def _language_paths(dataset, source_language: str, target_language: str, description: str):
    """Where the two languages are: fields of a `translation` column, or columns of their own."""
    arrow_type = dataset.data.schema
    if "translation" in arrow_type.names and pa.types.is_struct(arrow_type.field("translation").type):
        fields = {field.name for field in arrow_type.field("translation").type}
        if {source_language, target_language} <= fields:
            return ["translation", source_language], ["translation", target_language]
        raise ValueError(
            f"{description}: its 'translation' column holds {sorted(fields)}, not both '{source_language}' and "
            f"'{target_language}'; set --source_language/--target_language (or --data_config) to its pair."
        )
    if {source_language, target_language} <= set(arrow_type.names):
        return [source_language], [target_language]
    raise ValueError(
        f"{description}: no 'translation' column and no '{source_language}'/'{target_language}' columns "
        f"(columns: {arrow_type.names})."
    )


def _as_pairs(loaded: dict, source_language: str, target_language: str, description: str) -> dict:
    """Each split reduced to `source`/`target` columns (an Arrow-level pass, cached by `datasets`)."""
    corpus = {}
    for split, dataset in loaded.items():
        if set(dataset.column_names) == {"source", "target"}:
            corpus[split] = dataset
            continue
        source_path, target_path = _language_paths(dataset, source_language, target_language, description)
        corpus[split] = (
            dataset.with_format("arrow")
            .map(
                select_pair,
                batched=True,
                batch_size=10_000,
                fn_kwargs={"source_path": source_path, "target_path": target_path},
                remove_columns=dataset.column_names,
                desc=f"{split}: {source_language}-{target_language} pairs",
            )
            .with_format(None)
        )
    return corpus


def _named_files(data_files: dict[str, str], splits) -> dict:
    """One file per split, each read by its suffix (TSV pairs, or a `datasets` builder)."""
    corpus = {}
    for split in splits:
        if not data_files.get(split):
            raise ValueError(f"No {split} file: give --train_file, --validation_file and --test_file together.")
        path = Path(data_files[split])
        if not path.is_file():
            raise FileNotFoundError(f"--{split}_file {path}: no such file.")
        suffix = ([suffix for suffix in path.suffixes if suffix != ".gz"] or [""])[-1]
        if suffix == ".tsv":
            corpus[split] = _from_files(tsv_pairs, split, path)
        elif suffix in DATASET_FILE_BUILDERS:
            loaded = _load_local(path, DATASET_FILE_BUILDERS[suffix], data_files={split: str(path)})
            corpus[split] = loaded[split]
        else:
            raise ValueError(
                f"--{split}_file {path}: unknown format '{suffix}'; use .tsv, "
                f"{', '.join(DATASET_FILE_BUILDERS)} (optionally .gz), or a --data folder for aligned text files."
            )
    return corpus


def _folder(folder: Path, source_language: str, target_language: str, splits, pattern, config) -> dict:
    """A local folder in whichever form it holds."""
    import datasets

    text_form = pattern or DEFAULT_PATTERN
    if (folder / "dataset_dict.json").is_file():
        return _pick_splits(datasets.load_from_disk(str(folder)), splits, str(folder))
    if find_split_file(folder, "train", source_language, text_form):
        return _text_folder(folder, source_language, target_language, text_form, splits)
    if find_split_file(folder, "train", "tsv", "{split}.{lang}"):
        files = _split_files(folder, splits, ("tsv",), "{split}.{lang}")
        return {split: _from_files(tsv_pairs, split, *paths) for split, paths in files.items()}
    dataset_files = (
        path.suffix in DATASET_FILE_BUILDERS or path.name.endswith(".json.gz") for path in folder.rglob("*")
    )
    if (folder / "README.md").is_file() or any(dataset_files):
        return _pick_splits(_load_local(folder, str(folder), config), splits, str(folder))
    raise FileNotFoundError(
        f"No parallel data in {folder}: looked for dataset_dict.json, "
        f"{text_form.format(split='train', lang=source_language)}[.gz], train.tsv[.gz], a dataset README.md and "
        f"{'/'.join(DATASET_FILE_BUILDERS)} files. Accepted: {ACCEPTED_FORMS}."
    )


def load_parallel_corpus(
    location: str | Path | None,
    source_language: str,
    target_language: str,
    splits: tuple[str, ...] = SPLITS,
    pattern: str | None = None,
    max_examples: dict[str, int] | None = None,
    config: str | None = None,
    data_files: dict[str, str] | None = None,
):
    """A `datasets.DatasetDict` of `splits`, with string columns `source` and `target`, from any form of parallel
    data the module docstring lists; `max_examples` keeps the first N pairs of a split."""
    import datasets

    description = "the named files" if data_files else str(location)
    if data_files:
        corpus = _named_files(data_files, splits)
    elif str(location) in BUNDLED_CORPORA:
        folder, bundled_pattern = BUNDLED_CORPORA[str(location)]
        corpus = _text_folder(folder, source_language, target_language, pattern or bundled_pattern, splits)
    elif Path(location).is_dir():
        corpus = _folder(Path(location), source_language, target_language, splits, pattern, config)
    elif Path(location).exists() or str(location).startswith((".", os.sep, "~")):
        raise FileNotFoundError(f"--data {location}: not a folder. Accepted: {ACCEPTED_FORMS}.")
    else:
        try:
            loaded = datasets.load_dataset(str(location), config)
        except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as error:
            raise ValueError(
                f"--data {location}: no such local folder, and the Hub dataset could not be loaded ({error}). "
                f"Accepted: {ACCEPTED_FORMS}."
            ) from error
        description = f"Hub dataset {location}"
        corpus = _pick_splits(loaded, splits, description)
    for split, limit in (max_examples or {}).items():
        if limit and split in corpus:
            corpus[split] = corpus[split].select(range(min(limit, len(corpus[split]))))
    return datasets.DatasetDict(_as_pairs(corpus, source_language, target_language, description))
