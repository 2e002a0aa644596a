"""Folders that are written whole or not at all."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def save_whole(folder: Path, *parts, check: Callable[[], None] | None = None) -> None:
    """`save_pretrained` each of `parts` (a model, a tokenizer) into `folder`, whole or not at all: into a staging
    folder beside it, renamed into place once written and `check` (which may raise) passed, so that a process killed
    midway leaves no folder that looks complete. What was at `folder` before is replaced."""
    staging = folder.with_name(f"{folder.name}.incomplete-{os.getpid()}")
    for part in parts:
        part.save_pretrained(staging)
    if check is not None:
        check()
    shutil.rmtree(folder, ignore_errors=True)  # an earlier one, or what a write killed before it was whole left
    os.replace(staging, folder)
