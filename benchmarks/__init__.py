"""The lab: speed, memory and quality of hf_vanilla, each against a peer in the same run (not shipped in the wheel).

Every benchmark writes its JSON through `record`, so each result in docs/results says the commit it measured, the
machine (CPU model, cores, threads) and the command; `python -m benchmarks.report` renders the docs' tables from them.
"""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def commit_of(checkout: Path = ROOT) -> str:
    """The commit a checkout holds (a benchmark measures the code it runs, so it records which)."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()


def machine() -> dict:
    """The machine of a run: CPU model with cores and threads (or the GPU), torch version, date."""
    from hf_vanilla.training.report import hardware_description

    return {"hardware": hardware_description(1), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}


def fresh_clone(folder: Path) -> Path:
    """A clone of the committed code in `folder`/clone: what a new user gets, without this checkout's local files."""
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    return clone


def record(module: str, results: list, checkout: Path = ROOT, **extra) -> dict:
    """A results document: the machine, the command that wrote it, the commit of `checkout` (the code the results
    measured) and the results. The command is quoted for the shell, so that it runs again as recorded."""
    command = shlex.join(["python", "-m", module, *sys.argv[1:]])
    return {"machine": {**machine(), **extra}, "command": command, "commit": commit_of(checkout), "results": results}


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the one writer of every results table, in the docs and on the terminal."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])
