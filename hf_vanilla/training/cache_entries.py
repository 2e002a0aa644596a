"""A cache entry's lock, manifest and repair (the entries themselves: `preprocessing`; the whole story, with the
faults each part answers: docs/training.md, "The data cache").

- Lock: a file lock per entry under `<data_cache_dir>/locks/` (`filelock`, as `datasets` locks its builds), held while
  the entry is built or checked, so that processes that need it at once build it once. `<lock>.holder` names the
  holder for a waiter's messages. Where the filesystem has no `flock`, filelock's `SoftFileLease`, whose waiters take
  a gone or silent holder's lease over; so a holder checks its `Claim` before each write, move or removal.
- Manifest: a complete entry's files and their sizes, written last.
- Repair: what a killed build left is removed; an Arrow error of the corpus is told apart from one of the cache.
"""

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from filelock import BaseFileLock, FileLock, SoftFileLease, Timeout


logger = logging.getLogger(__name__)

LOCK_TIMEOUT_VARIABLE = "HF_VANILLA_CACHE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 3 * 3600.0  # seconds: longer than building the largest corpus we measured takes
LOCK_LEASE_VARIABLE = "HF_VANILLA_CACHE_LOCK_LEASE"
# Seconds without a refresh after which a lock file held from another host is taken over. The holder refreshes every
# third of it from a thread of its own, so only a process that is gone (or frozen that long) loses it.
DEFAULT_LOCK_LEASE = 600.0
# What `flock` answers where the filesystem does not support it: ENOSYS (Lustre without -o flock), ENOLCK (NFS without
# its lock daemon), EOPNOTSUPP (some FUSE and network mounts).
NO_FLOCK_ERRNOS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
# A complete tokenized cache's files, written last: {"splits": {split: [file, ...]}, "sizes": {file: bytes}}. Every
# process opens the files it lists: their names come from the builder's worker count, which another node's CPU
# count (or cgroup, or --cpus-per-task) would not reproduce.
MANIFEST = "manifest.json"


def has_flock(folder: Path) -> bool:
    """Whether the filesystem of `folder` supports `flock` (the kernel answers one of `NO_FLOCK_ERRNOS` where not)."""
    descriptor = os.open(folder / f".flock-probe-{os.getpid()}", os.O_RDWR | os.O_CREAT, 0o664)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    except OSError as error:
        if error.errno in NO_FLOCK_ERRNOS:
            return False
        if error.errno not in (errno.EAGAIN, errno.EACCES):
            raise
    finally:
        os.close(descriptor)
        (folder / f".flock-probe-{os.getpid()}").unlink(missing_ok=True)
    return True


def new_lock(path: Path) -> BaseFileLock:
    """A `FileLock` at `path`, or a `SoftFileLease` where the filesystem has no `flock` (every filelock release before
    the newest would otherwise wait forever there, or raise)."""
    if has_flock(path.parent):
        return FileLock(str(path))
    logger.warning("%s has no flock: locking with a lock file (SoftFileLease) instead.", path.parent)
    return SoftFileLease(str(path), lease_duration=seconds_from_environment(LOCK_LEASE_VARIABLE, DEFAULT_LOCK_LEASE))


def seconds_from_environment(variable: str, default: float) -> float:
    value = os.environ.get(variable) or str(default)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{variable} must be a positive number of seconds, got {value!r}.")
    return seconds


class LockLost(RuntimeError):
    """The lock of a cache entry was taken over while this process held it: it stops without touching the entry."""


@dataclass(frozen=True)
class Claim:
    """This process's hold on a cache entry's lock: its unique line in the `.holder` file, which a waiter that took
    the lease over replaced. Plain data, so the workers a build forks check it too."""

    holder: Path
    line: str

    def check(self) -> None:
        """Raise `LockLost`, naming the process that holds the lock now, if this process no longer does."""
        try:
            now = self.holder.read_text()
        except FileNotFoundError:
            now = "no process"
        if now != self.line:
            entry = self.holder.name.removesuffix(".lock.holder")
            raise LockLost(
                f"The lock of the cache entry {entry} was taken over while this process was stopped longer than the "
                f"{LOCK_LEASE_VARIABLE} lease, by {now.strip()}: stopping without touching the entry. Run it again."
            )


@contextlib.contextmanager
def entry_lock(cache_dir: Path, kind: str, key: str) -> Iterator[Claim]:
    """Hold the lock of the cache entry `<kind>/<key>`, saying so when another process holds it (it is building the
    entry: this one waits, then opens what it wrote), and naming that process if the wait exceeds the timeout. Yields
    the `Claim` to check before each write."""
    path = cache_dir / "locks" / f"{kind}-{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = path.with_name(path.name + ".holder")
    lock, timeout = new_lock(path), seconds_from_environment(LOCK_TIMEOUT_VARIABLE, DEFAULT_LOCK_TIMEOUT)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("Another process is building or checking %s/%s in %s: waiting for it.", kind, key, cache_dir)
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise TimeoutError(
                f"Waited {timeout:.0f} s for the lock of the cache entry {kind}/{key} in {cache_dir}, held by "
                f"{holder.read_text().strip() if holder.is_file() else 'an unknown process'}. If that process is gone "
                f"and the lock stayed (a lock file where the disk has no flock, held from another host: it is taken "
                f"over once {LOCK_LEASE_VARIABLE} seconds pass without a refresh), delete {path}; "
                f"{LOCK_TIMEOUT_VARIABLE} sets how long to wait."
            ) from None
    if holder.is_file():  # a holder that releases the lock removes it first: this one stopped while holding it
        logger.warning(
            "Took over the lock of the cache entry %s/%s in %s from %s, which stopped without releasing it.",
            kind, key, cache_dir, holder.read_text().strip(),
        )  # fmt: skip
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    claim = Claim(holder, f"process {os.getpid()} on {socket.gethostname()} since {since} ({secrets.token_hex(4)})\n")
    try:
        holder.write_text(claim.line)
        yield claim
    finally:
        with contextlib.suppress(LockLost):  # a successor's record stays
            claim.check()
            holder.unlink(missing_ok=True)
        lock.release()


def check_corpus_files(corpus, error: Exception) -> None:
    """Raise, naming the file, if one of the corpus's own Arrow files cannot be read (each read whole): then `error`
    came from the corpus, which a rebuilt cache would fail on again, not from the cache."""
    for dataset in corpus.values():
        for file in dataset.cache_files:
            path = Path(file["filename"])
            try:
                with pa.memory_map(str(path)) as source:
                    pa.ipc.open_stream(source).read_all()
            except (pa.ArrowInvalid, OSError) as corpus_error:
                raise ValueError(
                    f"The corpus file {path} cannot be read ({corpus_error}), so the corpus cannot be tokenized. It "
                    "is the `datasets` cache of the corpus text: delete it to read the text again."
                ) from error


def read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    """The manifest of a cache folder (None for a build in progress or an interrupted one, which `Dataset.map`
    completes), and why the folder cannot be trusted, or None: a manifest that is not what `_tokenize_into` writes
    (it is written whole and renamed into place: a disk fault or a hand-edit), a file missing or of another size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None, None
    except ValueError as error:
        return None, f"{MANIFEST} is not a JSON object of splits and file sizes ({error})"
    if not (isinstance(manifest, dict) and all(isinstance(manifest.get(k), dict) for k in ("splits", "sizes"))):
        return None, f"{MANIFEST} is not a JSON object of splits and file sizes"
    for name, size in manifest["sizes"].items():
        actual = (folder / name).stat().st_size if (folder / name).is_file() else "missing"
        if actual != size:
            return manifest, f"{name}: {actual} bytes, {size} when it was built"
    return manifest, None


def remove_temporary_files(folder: Path, claim: Claim) -> None:
    """`Dataset.map` writes each file under a temporary name in `folder`. Called with the entry's lock held, when no
    build is running: any such file was left by a build that was killed."""
    claim.check()
    for path in folder.glob("tmp*"):
        path.unlink(missing_ok=True)
        logger.warning("Removed %s, left by a build that stopped.", path)
