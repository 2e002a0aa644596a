"""A tokenized cache that fails: unreadable files are rebuilt, by the process that prepares the data and by no other;
other errors of the disk propagate and keep the cache; a full disk fails once, naming the folder and the space, and
keeps nothing; files left by a killed build are cleared at the next one; two builders of one cache build it once."""

import errno
import hashlib
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import datasets
import pytest

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.training.preprocessing import tokenize_corpus


ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--config", "configs/smoke.yaml", "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no"]
SHORT += ["--average_last", "0", "--max_test_examples", "4", "--report_to", "none", "--disable_tqdm", "true"]


def train(tmp_path: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hf_vanilla", "train", *SHORT, "--output_dir", str(tmp_path / "run"), *extra]
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "PYTHONPATH": str(ROOT)}
    command += ["--data_cache_dir", str(cache)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def tokenized_folder(cache: Path) -> Path:
    (folder,) = (cache / "tokenized").iterdir()
    return folder


@pytest.mark.slow
def test_a_truncated_cache_file_is_built_again(tmp_path):
    cache = tmp_path / "cache"
    assert train(tmp_path, cache).returncode == 0
    train_file = tokenized_folder(cache) / "train.arrow"
    train_file.write_bytes(train_file.read_bytes()[: train_file.stat().st_size // 2])
    again = train(tmp_path, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"The tokenized cache {tokenized_folder(cache)} cannot be read (train.arrow:" in again.stderr
    assert "startup: tokenizing (built" in again.stderr


@pytest.mark.slow
def test_files_left_by_a_killed_build_are_cleared_by_the_next(tmp_path):
    cache = tmp_path / "cache"
    assert train(tmp_path, cache).returncode == 0
    folder = tokenized_folder(cache)
    for name in ("manifest.json", "train.arrow"):  # as a build killed while writing the training split leaves it
        (folder / name).unlink()
    left = folder / "tmpk1ll3d"  # written a moment ago: no build holds the cache's lock, so none is writing it
    left.write_bytes(b"\0" * 1000)
    again = train(tmp_path, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not left.exists() and f"Removed {left}, left by a build that stopped." in again.stderr
    assert (folder / "manifest.json").is_file()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs: a real full disk (the test needs the right to mount, as root has here)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_a_full_disk_names_the_folder_and_the_space_and_keeps_nothing(tmp_path, small_disk):
    full = train(tmp_path, small_disk / "cache", "--max_train_examples", "29000")  # ~4 MB of token ids
    assert full.returncode == 2, full.stderr[-3000:]
    assert "filled up while tokenizing train (nothing was kept)" in full.stderr
    assert full.stderr.count("Building the tokenized cache") == 1, "a full disk is not an unreadable cache"
    assert "cannot be read" not in full.stderr
    needed = re.search(r"needs about ([0-9.]+) (MB|GB) there", full.stderr)
    assert needed and float(needed[1]) > 0, full.stderr[-3000:]
    assert str(small_disk / "cache" / "tokenized") in full.stderr
    assert not any((small_disk / "cache" / "tokenized").iterdir())


@pytest.fixture(scope="module")
def loaded_corpus():
    return load_parallel_corpus("multi30k", "en", "de", max_examples={"train": 3000, "validation": 50, "test": 50})


@pytest.fixture
def corpus(loaded_corpus, own):
    return own(loaded_corpus)


def break_arrow_metadata(path: Path) -> None:
    """Overwrite the start of an Arrow file (its schema) with garbage of the same length: the size its manifest
    records still holds, but Arrow cannot read it."""
    data = bytearray(path.read_bytes())
    data[8:64] = b"A" * 56
    path.write_bytes(bytes(data))


def test_an_unreadable_cache_is_rebuilt_only_by_a_process_that_may_rebuild_it(corpus, small_tokenizer, tmp_path):
    first = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    train_file = first.path / "train.arrow"
    break_arrow_metadata(train_file)
    broken = train_file.read_bytes()
    with pytest.raises(RuntimeError, match=f"{re.escape(str(first.path))} cannot be read by this process"):
        tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1, may_rebuild=False)
    assert train_file.read_bytes() == broken, "a process that may not rebuild deletes nothing"
    again = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1, may_rebuild=True)
    assert again.built and again.path == first.path
    assert again.splits["train"]["labels"] == first.splits["train"]["labels"]


def test_another_disk_error_propagates_naming_the_folder_and_keeps_the_cache(
    corpus, small_tokenizer, tmp_path, monkeypatch
):
    first = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    files = {path.name: path.stat().st_size for path in first.path.iterdir()}

    def stale(*args, **kwargs):  # what an NFS client raises for a file the server no longer knows
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(datasets.Dataset, "from_file", stale)
    with pytest.raises(OSError, match="Stale file handle") as raised:
        tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    assert raised.value.errno == errno.ESTALE and str(first.path) in "".join(raised.value.__notes__)
    assert {path.name: path.stat().st_size for path in first.path.iterdir()} == files, "nothing deleted or rebuilt"


def tokenize_when_both_are_ready(barrier, cache_dir: str) -> bool:
    """One of two processes building the same cache at once; whether this one built it."""
    from .conftest import train_small_tokenizer

    tokenizer = train_small_tokenizer()
    corpus = load_parallel_corpus("multi30k", "en", "de", max_examples={"train": 3000, "validation": 50, "test": 50})
    barrier.wait()
    return tokenize_corpus(corpus, tokenizer, 30, cache_dir=Path(cache_dir), num_workers=1).built


def test_two_processes_building_one_cache_at_once_build_it_once(corpus, tmp_path):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(2, mp_context=context) as pool:
        barrier = manager.Barrier(2)
        built = list(pool.map(tokenize_when_both_are_ready, [barrier] * 2, [str(tmp_path)] * 2))
    assert sorted(built) == [False, True], "one builds, the other waits and opens what it wrote"
    assert not list(tmp_path.glob("tokenized/*/tmp*"))


def test_a_corrupt_manifest_is_rebuilt_once_by_the_process_that_prepares_the_data(corpus, small_tokenizer, tmp_path):
    first = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    (first.path / "manifest.json").write_text('{"train.arrow": 12')  # cut short
    with pytest.raises(RuntimeError, match="manifest.json is not a JSON object of splits and file sizes"):
        tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1, may_rebuild=False)
    again = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    assert again.built and again.splits["train"]["labels"] == first.splits["train"]["labels"]
    assert not tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1).built  # once


def test_an_unreadable_corpus_file_is_named_and_the_cache_kept(small_tokenizer, tmp_path, monkeypatch):
    """Arrow reads the corpus's own files while tokenizing (worker processes open them again): a read error there is
    the corpus's, which a rebuilt cache would meet again, so it propagates naming the file, and the cache is kept.
    Simulated: the corpus file is broken after this process mapped it, and the encoder meets Arrow's error."""
    from hf_vanilla.text_files import stream_lines
    from hf_vanilla.training.preprocessing import PairEncoder

    from .conftest import MULTI30K

    text = tmp_path / "text"
    text.mkdir()
    for split, source in (("train", "train"), ("val", "val"), ("test", "test2016")):
        for language in ("en", "de"):
            lines = list(stream_lines(MULTI30K / f"{source}.{language}.gz"))[:500]
            (text / f"{split}.{language}").write_text("\n".join(lines) + "\n")
    own = load_parallel_corpus(str(text), "en", "de")
    cache = tmp_path / "cache"
    first = tokenize_corpus(own, small_tokenizer, 30, cache_dir=cache, num_workers=1)
    (first.path / "manifest.json").unlink()  # as a killed build leaves it: the next one reads the corpus again
    (first.path / "train.arrow").unlink()
    corpus_file = Path(own["train"].cache_files[0]["filename"])
    break_arrow_metadata(corpus_file)

    def read_error(self, batch):
        raise OSError("Invalid flatbuffers message.")  # as Arrow raises it, without an errno

    monkeypatch.setattr(PairEncoder, "__call__", read_error)
    with pytest.raises(ValueError, match=f"The corpus file {re.escape(str(corpus_file))} cannot be read"):
        tokenize_corpus(own, small_tokenizer, 30, cache_dir=cache, num_workers=1)
    assert (first.path / "validation.arrow").is_file(), "the cache was not deleted"


# What the kernel answers where the filesystem has no flock: Lustre without it, NFS without its lock daemon, FUSE.
NO_FLOCK = [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP]


@pytest.mark.parametrize("answer", NO_FLOCK, ids=[errno.errorcode[answer] for answer in NO_FLOCK])
def test_a_filesystem_without_flock_locks_with_a_lock_file(
    corpus, small_tokenizer, tmp_path, monkeypatch, caplog, answer
):
    import fcntl

    def no_flock(*args):
        raise OSError(answer, os.strerror(answer))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    built = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    assert built.built and f"{tmp_path / 'locks'} has no flock: locking with a lock file" in caplog.text
    assert not list((tmp_path / "locks").glob("*.lock")), "a lock file exists only while it is held"


HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from hf_vanilla.training.cache_entries import entry_lock
with entry_lock(Path(sys.argv[1]), "tokenized", "key"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_lock_wait_past_the_timeout_names_the_process_that_holds_it(tmp_path, monkeypatch):
    from hf_vanilla.training.cache_entries import entry_lock

    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("HF_VANILLA_CACHE_LOCK_TIMEOUT", "1")
        with pytest.raises(TimeoutError, match=f"Waited 1 s .* held by process {holder.pid} on .* since"):
            with entry_lock(tmp_path, "tokenized", "key"):
                pass
    finally:
        holder.kill()
        holder.wait()


# A preparer on a filesystem without flock (ENOLCK, as NFS without its lock daemon answers): "stall" stops inside
# Dataset.map, with the entry's lock held and the build begun, as a job does when Slurm preempts or the OOM killer
# kills it; "freeze" stops there by SIGSTOP, as Ctrl-Z or a suspended job does, and goes on encoding once continued;
# "build" tokenizes. Prints what it did and the training labels' digest.
PREPARER = """
import errno, fcntl, hashlib, os, signal, sys, time
from pathlib import Path
from transformers import AutoTokenizer
from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.training import preprocessing

cache, tokenizer, mode = Path(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[2]), sys.argv[3]
corpus = load_parallel_corpus("multi30k", "en", "de", max_examples={"train": 3000, "validation": 50, "test": 50})

def no_flock(*args):  # from here on: the corpus's own `datasets` cache, read above, sits on another disk
    raise OSError(errno.ENOLCK, "No locks available")

fcntl.flock = no_flock
if mode in ("stall", "freeze"):
    encode = preprocessing.PairEncoder.__call__

    def stall(self, batch):
        print("building", flush=True)
        if mode == "stall":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGSTOP)
        return encode(self, batch)

    preprocessing.PairEncoder.__call__ = stall
done = preprocessing.tokenize_corpus(corpus, tokenizer, 30, cache_dir=cache, num_workers=1)
labels = hashlib.sha256(str(done.splits["train"]["labels"]).encode()).hexdigest()
print("built" if done.built else "opened", labels, flush=True)
"""


def preparer(cache: Path, tokenizer: Path, mode: str, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "HF_VANILLA_CACHE_LOCK_TIMEOUT": "120", **env}
    command = [sys.executable, "-c", PREPARER, str(cache), str(tokenizer), mode]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    return stdout.strip(), stderr


@pytest.mark.slow
def test_a_requeued_job_takes_over_the_lock_file_of_a_killed_preparer_and_builds_once(
    corpus, small_tokenizer, tmp_path
):
    """The preparer is SIGKILLed mid-build under the lock file; the requeued job's two processes find its holder
    gone, one of them takes the lock over at once (saying from whom) and builds, the other waits and opens what it
    built, and the ids are those of a build that was never interrupted."""
    small_tokenizer.save_pretrained(tmp_path / "tokenizer")
    cache = tmp_path / "cache"
    killed = preparer(cache, tmp_path / "tokenizer", "stall")
    assert killed.stdout.readline().strip() == "building"
    killed.kill()
    killed.wait()
    assert list((cache / "locks").glob("*.lock")), "the killed preparer left its lock file"
    requeued = [preparer(cache, tmp_path / "tokenizer", "build") for _ in range(2)]
    (first, first_log), (second, second_log) = map(finished, requeued)
    assert sorted(line.split()[0] for line in (first, second)) == ["built", "opened"], "one builder, never two"
    took_over = "Took over the lock of the cache entry tokenized/"
    assert (first_log + second_log).count(took_over) == 1, first_log + second_log
    assert f"from process {killed.pid} on {socket.gethostname()} since" in first_log + second_log
    expected = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path / "uninterrupted", num_workers=1)
    digest = hashlib.sha256(str(expected.splits["train"]["labels"]).encode()).hexdigest()
    assert first.split()[1] == second.split()[1] == digest, "nothing of the corpus was lost"


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")
    }


@pytest.mark.slow
def test_a_frozen_holder_superseded_after_its_lease_stops_without_touching_the_entry(small_tokenizer, tmp_path):
    """A holder that stops refreshing (SIGSTOP, as Ctrl-Z or a suspended job) keeps its lock file only for the lease:
    a waiter then takes it over and builds. Continued, the old holder finds its claim gone before it writes, and stops
    with an error naming the takeover; the entry is as its successor left it, file for file."""
    small_tokenizer.save_pretrained(tmp_path / "tokenizer")
    lease = {"HF_VANILLA_CACHE_LOCK_LEASE": "3"}
    frozen = preparer(tmp_path / "cache", tmp_path / "tokenizer", "freeze", **lease)
    try:
        assert frozen.stdout.readline().strip() == "building"
        waiter, log = finished(preparer(tmp_path / "cache", tmp_path / "tokenizer", "build", **lease))
        assert waiter.startswith("built") and f"from process {frozen.pid} on" in log
        built = files_under(tmp_path / "cache" / "tokenized")
        os.kill(frozen.pid, signal.SIGCONT)
        _, stderr = frozen.communicate(timeout=120)
    finally:
        frozen.kill()
        frozen.wait()
    assert frozen.returncode == 1 and "LockLost: The lock of the cache entry tokenized-" in stderr, stderr[-3000:]
    assert "was taken over while this process was stopped longer than" in stderr
    assert files_under(tmp_path / "cache" / "tokenized") == built
    opened, _ = finished(preparer(tmp_path / "cache", tmp_path / "tokenizer", "build", **lease))
    assert opened == "opened " + waiter.split()[1]


def test_the_size_estimate_of_a_full_disk_is_within_1_5x_of_the_built_cache(corpus, small_tokenizer, tmp_path):
    """On a `select` view (the corpus cut to 3000 of its 29000 training pairs, as --max_train_examples does)."""
    from hf_vanilla.training.preprocessing import needed_space

    built = tokenize_corpus(corpus, small_tokenizer, 10_000, cache_dir=tmp_path, num_workers=1)
    size = sum(path.stat().st_size for path in built.path.glob("*.arrow"))
    assert 1 / 1.5 < needed_space(corpus, small_tokenizer) / size < 1.5


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to give the ranks different counts")
def test_a_rank_with_another_cpu_count_opens_the_files_the_manifest_lists(
    corpus, small_tokenizer, tmp_path, monkeypatch
):
    """The preparer builds with one worker a CPU (shards named `train_0000i_of_0000n.arrow`); a rank on a node with
    another CPU count (here: this process pinned to one CPU) opens those files, builds nothing, rewrites nothing."""
    import json

    monkeypatch.setattr("hf_vanilla.training.preprocessing.MIN_PAIRS_PER_WORKER", 1000)  # 3000 pairs: 2 workers
    built = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path)
    manifest = (built.path / "manifest.json").read_text()
    assert json.loads(manifest)["splits"]["train"] == ["train_00000_of_00002.arrow", "train_00001_of_00002.arrow"]
    every_cpu = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(every_cpu)})
    try:
        opened = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, may_rebuild=False)
    finally:
        os.sched_setaffinity(0, every_cpu)
    assert not opened.built and (built.path / "manifest.json").read_text() == manifest
    assert sorted(path.name for path in built.path.glob("*.arrow")) == sorted(
        name for names in json.loads(manifest)["splits"].values() for name in names
    )
    assert opened.splits["train"]["labels"] == built.splits["train"]["labels"]
