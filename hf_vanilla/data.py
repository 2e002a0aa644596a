"""Reading parallel text: plain or gzipped UTF-8, one sentence a line."""

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
