"""Reading parallel text: plain or gzipped UTF-8, one sentence a line; the corpora shipped with the package."""

import gzip
from collections.abc import Iterator
from pathlib import Path


def read_lines(path: str | Path) -> list[str]:
    """All lines of a text file (`.gz` decompressed), stripped of surrounding whitespace and line ends (LF or CRLF).

    Invalid UTF-8 raises `ValueError` naming the file and line, rather than decoding into replacement characters.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                lines.append(raw.decode("utf-8").strip())
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}: line {number} is not valid UTF-8 ({error.reason}).") from error
    return lines


def iter_lines(paths: list[str | Path]) -> Iterator[str]:
    """The non-empty lines of several files, in order."""
    for path in paths:
        yield from (line for line in read_lines(path) if line)


SPLIT_ALIASES = {"validation": ("val", "valid", "validation", "dev"), "test": ("test2016", "test")}

DEFAULT_PATTERN = "{split}.{lang}"
CORPORA = Path(__file__).parent / "corpora"
# Corpora shipped inside the package (provenance, terms and checksums in each folder's README): name -> folder and
# file pattern. `multi30k` is the raw text (score with sacreBLEU); `multi30k-tok` the lowercased, Moses-tokenized
# release that most multimodal-MT papers score with tokenized BLEU.
BUNDLED_CORPORA = {
    "multi30k": (CORPORA / "multi30k", DEFAULT_PATTERN),
    "multi30k-tok": (CORPORA / "multi30k" / "tok", "{split}.lc.norm.tok.{lang}"),
}


def find_split_file(folder: Path, split: str, language: str, pattern: str) -> Path:
    """The file of `split` in `language` under `folder`, gzipped or plain (`val.en.gz` for validation, say)."""
    for name in SPLIT_ALIASES.get(split, (split,)):
        for suffix in (".gz", ""):
            candidate = folder / (pattern.format(split=name, lang=language) + suffix)
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"No {split} file for language '{language}' in {folder} (looked for "
        f"{[pattern.format(split=name, lang=language) for name in SPLIT_ALIASES.get(split, (split,))]}, .gz or plain)."
    )


def read_parallel(source_path: str | Path, target_path: str | Path) -> tuple[list[str], list[str]]:
    """Aligned source/target lines; unequal line counts or an empty file raise `ValueError` naming both files."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if not sources or not targets:
        raise ValueError(f"Empty parallel file: {source_path} has {len(sources)} lines, {target_path} {len(targets)}.")
    if len(sources) != len(targets):
        raise ValueError(
            f"Parallel files are not aligned: {source_path} has {len(sources)} lines but {target_path} has "
            f"{len(targets)}; line i of one must translate line i of the other."
        )
    return sources, targets


def load_parallel_corpus(
    location: str | Path,
    source_language: str,
    target_language: str,
    splits: tuple[str, ...] = ("train", "validation", "test"),
    pattern: str | None = None,
    max_examples: dict[str, int] | None = None,
):
    """A `datasets.DatasetDict` with columns `source` and `target`, from a bundled corpus (`BUNDLED_CORPORA`), a
    folder of aligned text files (`pattern`, default `{split}.{lang}`), or, for anything else, a Hub dataset id with
    one column per language (e.g. `bentrevett/multi30k`)."""
    import datasets

    max_examples = max_examples or {}
    if str(location) in BUNDLED_CORPORA:
        location, bundled_pattern = BUNDLED_CORPORA[str(location)]
        pattern = pattern or bundled_pattern
    pattern = pattern or DEFAULT_PATTERN
    folder = Path(location)
    if folder.is_dir():
        columns = {}
        for split in splits:
            sources, targets = read_parallel(
                find_split_file(folder, split, source_language, pattern),
                find_split_file(folder, split, target_language, pattern),
            )
            limit = max_examples.get(split)
            columns[split] = {"source": sources[:limit], "target": targets[:limit]}
        return datasets.DatasetDict({split: datasets.Dataset.from_dict(data) for split, data in columns.items()})
    hub = datasets.load_dataset(str(location))
    corpus = {}
    for split in splits:
        name = next((alias for alias in SPLIT_ALIASES.get(split, (split,)) if alias in hub), split)
        part = hub[name].map(
            lambda row: {"source": row[source_language].strip(), "target": row[target_language].strip()},
            remove_columns=hub[name].column_names,
        )
        limit = max_examples.get(split)
        corpus[split] = part.select(range(min(limit, len(part)))) if limit else part
    return datasets.DatasetDict(corpus)
