"""A tokenized cache entry's lock, manifest and repair (the entries themselves: `preprocessing`).

- Lock: a file lock per cache entry under `<data_cache_dir>/locks/` (`filelock`, as `datasets` locks its own builds),
  held while one is built or checked, so that processes building the same entry at once (two runs, or the nodes of
  one on a shared disk) build it once. Beside each lock, `<lock>.holder` names the process that holds it (host, pid,
  since when), for the message of a process that waited longer than `HF_VANILLA_CACHE_LOCK_TIMEOUT` seconds (default
  3 hours). On a filesystem without `flock` (Lustre mounted without it, NFS without its lock daemon, some FUSE
  mounts: the kernel answers ENOSYS, ENOLCK or EOPNOTSUPP) the lock is filelock's `SoftFileLease`, a file that exists
  while it is held, as `datasets` and `huggingface_hub` fall back to a lock file there. It records its holder (host,
  PID namespace, pid, and the process's start with the boot id) and refreshes itself every third of its lease
  (`HF_VANILLA_CACHE_LOCK_LEASE`, default 10 minutes). A waiter takes it over at once where the holder was on its
  own host and is gone (SIGKILLed, OOM-killed, preempted; its pid reused or the host restarted since), and from a
  holder on another host once no refresh came for the lease: a Slurm job requeued after its preparer was killed
  builds the entry instead of waiting out the timeout. The waiter that takes over says so in one line naming the old
  holder. A `flock` is released by the kernel when its holder dies, so that case needs nothing of this. A holder
  that was frozen past its lease (SIGSTOP, a suspended job) and then continues is not told by the lease itself, so
  every holder checks its `Claim` (its line in `.holder`) before it writes, moves or removes anything of the entry,
  its encoding workers before each batch: a superseded one stops (`LockLost`) and leaves the entry to its successor.
- Manifest: a complete entry's files and their sizes, written last.
- Repair: what a killed build left is removed; a file Arrow cannot parse is told apart from a fault of the system.
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
    value = os.environ.get(variable, "")
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{variable} must be a positive number of seconds, got {value!r}.")
    return seconds


class LockLost(RuntimeError):
    """The lock of a cache entry was taken over while this process held it: it stops without touching the entry."""


@dataclass(frozen=True)
class Claim:
    """This process's hold on a cache entry's lock, as its `.holder` file records it (a unique line). A process that a
    lease's waiter took the lock over from (frozen past the lease by SIGSTOP, a suspended job, a host cut off) finds
    another line there: `check` raises before the entry is written, moved or removed, so a resumed holder never writes
    over what its successor builds. Plain data, so the workers a build forks check it too."""

    holder: Path
    line: str

    def check(self) -> None:
        """Raise `LockLost`, naming the process that holds the lock now, if this process no longer does."""
        try:
            now = self.holder.read_text()
        except FileNotFoundError:
            now = "no process"
        if now != self.line:
            raise LockLost(
                f"The lock of the cache entry {self.holder.name.removesuffix('.lock.holder')} was taken over while "
                f"this process held it (it was stopped longer than the {LOCK_LEASE_VARIABLE} lease); it is held by "
                f"{now.strip()}. This process stops without touching the entry: run it again, and it opens what the "
                "new holder builds."
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
    """Raise, naming the file, if one of the corpus's own Arrow files cannot be read: then `error` came from the
    corpus, which a rebuilt cache would read again and fail on, not from the cache. Reads every file whole: only
    after a read error."""
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


def is_arrow_read_error(error: Exception) -> bool:
    """Whether `error` is Arrow failing to parse a file's bytes: `ArrowInvalid`, or the `OSError` without an errno
    that Arrow raises for a malformed message (`pa.ArrowIOError` is `OSError` itself). An error of the system (a full
    disk, permissions, a stale NFS handle, too many open files) carries its errno."""
    return isinstance(error, pa.ArrowInvalid) or (isinstance(error, OSError) and error.errno is None)


def read_manifest(folder: Path) -> dict | None:
    """The manifest of a complete cache folder, or None for a build in progress or an interrupted one (which
    `Dataset.map` completes). A manifest that is not what `_tokenize_into` writes raises ValueError."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if not (isinstance(manifest, dict) and all(isinstance(manifest.get(k), dict) for k in ("splits", "sizes"))):
        raise ValueError("not a JSON object of splits and file sizes")
    return manifest


def unreadable(folder: Path) -> str | None:
    """Why a complete cache folder cannot be trusted (a manifest that cannot be read, a file missing or of another
    size than its manifest says), or None."""
    try:
        manifest = read_manifest(folder)
    except ValueError as error:  # written whole and renamed into place: a disk fault or a hand-edit
        return f"{MANIFEST} is not a JSON object of splits and file sizes ({error})"
    for name, size in (manifest or {}).get("sizes", {}).items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            actual = path.stat().st_size if path.is_file() else "missing"
            return f"{name}: {actual} bytes, {size} when it was built"
    return None


def remove_temporary_files(folder: Path, claim: Claim) -> None:
    """`Dataset.map` writes each file under a temporary name in `folder`. Called with the entry's lock held, when no
    build is running: any such file was left by a build that was killed."""
    claim.check()
    for path in folder.glob("tmp*"):
        path.unlink(missing_ok=True)
        logger.warning("Removed %s, left by a build that stopped.", path)
