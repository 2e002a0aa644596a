"""Text files one sentence a line, as MT tools read them: plain or gzipped, UTF-8 checked line by line.

Inference reads its input through these (`hf-vanilla translate`), so they need nothing beyond the standard library:
the base install, without the training extras, translates.
"""

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def open_binary(path: Path) -> BinaryIO:
    """A text file's bytes, decompressed if its name ends in `.gz`."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def decode_lines(handle: BinaryIO, name: str, errors: str = "strict", fix: str = "") -> Iterator[str]:
    """The lines of a binary stream as text, without their line ends (LF or CRLF). With `errors="strict"`, invalid
    UTF-8 raises `ValueError` naming the file and line (and `fix`), rather than decoding into replacement
    characters; `errors="replace"` puts U+FFFD in place of the bad bytes."""
    for number, raw in enumerate(handle, start=1):
        try:
            yield raw.decode("utf-8", errors=errors).rstrip("\r\n")
        except UnicodeDecodeError as error:
            hint = f"; {fix}" if fix else ""
            raise ValueError(f"{name}: line {number} is not valid UTF-8 ({error.reason}){hint}.") from error


def stream_lines(path: str | Path) -> Iterator[str]:
    """The lines of a text file (`.gz` decompressed), stripped of surrounding whitespace, as `decode_lines` reads
    them (invalid UTF-8 is an error naming the file and line)."""
    path = Path(path)
    with open_binary(path) as handle:
        yield from (line.strip() for line in decode_lines(handle, str(path)))
