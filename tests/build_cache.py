"""The suite's build cache: what the tests of several files (on pytest-xdist's workers, in pytest runs side by side)
share, built once per key of code and libraries. Light on purpose (no torch): `tests/test_build_cache.py` starts
processes that import it."""

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


ROOT = Path(__file__).resolve().parents[1]

# What a build in the cache depends on besides its name: our code, the test helpers that train and save, and every
# library the builds go through to compute, save and export (an absent one counts as a version of its own).
BUILD_CODE = sorted(
    [
        *(ROOT / "hf_vanilla").rglob("*.py"),
        ROOT / "tests" / "conftest.py",
        ROOT / "tests" / "build_cache.py",
        ROOT / "benchmarks" / "synthetic.py",
    ]
)
BUILD_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "onnx", "onnx-ir", "onnxscript",
                   "protobuf", "onnxruntime", "ctranslate2", "openvino")  # fmt: skip
KEPT_BUILDS = 3  # builds of one name kept, the one in use among them: other environments share the cache
READERS: list = []  # the files whose shared locks mark the builds this process reads, held until it exits


def build_key() -> str:
    """A digest of the Python, the library versions and the code a cached build came from: any change, a new key."""
    digest = hashlib.sha256(sys.version.encode())
    for library in BUILD_LIBRARIES:
        try:
            digest.update(f"{library}=={importlib.metadata.version(library)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{library} absent".encode())
    for path in BUILD_CODE:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_cache(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where builds are kept: pytest's cache folder (`.pytest_cache`, kept across runs of one checkout; `--cache-clear`
    empties it), or without the cache plugin (`-p no:cacheprovider`) this run's temporary folder, which pytest-xdist's
    workers share."""
    if getattr(config, "cache", None) is not None:
        return config.cache.mkdir("hf-vanilla-builds")
    run_folder = tmp_path_factory.getbasetemp()
    return run_folder.parent if os.environ.get("PYTEST_XDIST_WORKER") else run_folder


def built_once(
    config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]
) -> Path:
    """The folder `build` fills, built once for every pytest process with the same code and libraries: the first to
    ask builds it under a lock while the others wait, and later runs reuse it while `build_key()` is unchanged. A
    build cut short leaves only a partial folder, built again. This process reads the build until it exits, and says
    so with a shared lock; builds of other keys are removed past the `KEPT_BUILDS` newest, never one that a process
    (another pytest run, another environment's) still reads."""
    cache = build_cache(config, tmp_path_factory)
    folder = cache / f"{name}-{build_key()}"
    with FileLock(cache / f"{name}.lock"):
        if not folder.is_dir():
            partial = cache / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            partial.rename(folder)
        READERS.append(reading(folder))
        os.utime(folder)  # the newest used, for `remove_unused_builds`
        remove_unused_builds(cache, name, keep=KEPT_BUILDS)
    return folder


def reading(folder: Path):
    """An open file holding a shared lock that says this process reads `folder`; the lock goes with the process."""
    readers = open(folder.with_name(folder.name + ".readers"), "a")  # noqa: SIM115 (held until the process exits)
    fcntl.flock(readers, fcntl.LOCK_SH)
    return readers


def remove_unused_builds(cache: Path, name: str, keep: int) -> None:
    """Remove the builds of `name` past the `keep` most recently used, other than the ones a process reads (those
    whose readers' file no exclusive lock can be taken on). Called under the name's lock, as every reader starts."""
    builds = sorted((path for path in cache.glob(f"{name}-*") if path.is_dir()), key=lambda path: path.stat().st_mtime)
    for stale in builds[: max(len(builds) - keep, 0)]:
        readers = stale.with_name(stale.name + ".readers")
        with open(readers, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # still read
            shutil.rmtree(stale)
            readers.unlink()
