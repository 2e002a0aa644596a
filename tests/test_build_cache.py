"""The suite's build cache (`build_cache.built_once`) as pytest-xdist's workers and side-by-side pytest runs use it:
from processes of their own, with several keys at once. A build is made once per key, by one builder at a time; a
build that a process reads is never removed; and a change of code or library gives a new key."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import build_cache


ROOT = Path(__file__).resolve().parents[1]

# A process asking the cache for a build: argv cache folder, build name, key, builds kept, and a file that, if named,
# it waits for before exiting (while it waits, it reads the build). It starts once `go` exists beside the cache, so
# that the processes of a test ask at the same moment; a build takes a second and notes its process in calls-<key>.
ASKER = """
import os, sys, time
from pathlib import Path
from tests import build_cache
cache, name, key, keep, hold = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
build_cache.build_key = lambda: key
build_cache.build_cache = lambda config, factory: cache
build_cache.KEPT_BUILDS = keep

def build(folder):
    with open(cache / f"calls-{key}", "a") as calls:
        calls.write(f"{os.getpid()}\\n")
    time.sleep(1.0)
    (folder / "made").write_text(key)

print("ready", flush=True)
while not (cache.parent / "go").exists():
    time.sleep(0.01)
print(build_cache.built_once(None, None, name, build), flush=True)
while hold and not Path(hold).exists():
    time.sleep(0.05)
"""


def ask(cache: Path, key: str, keep: int = 3, hold: str = "") -> subprocess.Popen:
    command = [sys.executable, "-c", ASKER, str(cache), "thing", key, str(keep), hold]
    asker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert asker.stdout.readline() == "ready\n"
    return asker


def answer(asker: subprocess.Popen) -> Path:
    return Path(asker.stdout.readline().strip())


def finish(asker: subprocess.Popen) -> None:
    assert asker.wait(timeout=120) == 0


@pytest.fixture
def cache(tmp_path) -> Path:
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache"


def test_processes_asking_for_two_keys_at_once_get_one_build_of_each(cache):
    askers = [ask(cache, key) for key in ("a", "a", "b", "b")]
    (cache.parent / "go").touch()
    folders = [answer(asker) for asker in askers]
    for asker in askers:
        finish(asker)
    assert folders[0] == folders[1] == cache / "thing-a" and folders[2] == folders[3] == cache / "thing-b"
    for key in "ab":
        assert len((cache / f"calls-{key}").read_text().split()) == 1, f"key {key} built more than once"
        assert (cache / f"thing-{key}" / "made").read_text() == key
    assert not (cache / "thing.partial").exists()


def test_a_build_a_process_reads_is_kept_while_newer_keys_push_the_rest_out(cache):
    (cache.parent / "go").touch()
    release = cache.parent / "release"
    reader = ask(cache, "a", keep=1, hold=str(release))
    try:
        assert answer(reader) == cache / "thing-a"
        for key in ("b", "c", "d"):  # each keeps one build beside those still read
            time.sleep(0.05)  # distinct modification times
            finish(ask(cache, key, keep=1))
        assert sorted(path.name for path in cache.glob("thing-*") if path.is_dir()) == ["thing-a", "thing-d"]
    finally:
        release.touch()  # the reader goes, whatever failed
        finish(reader)
    finish(ask(cache, "e", keep=1))
    assert sorted(path.name for path in cache.glob("thing-*") if path.is_dir()) == ["thing-e"]


def test_a_changed_library_or_code_file_gives_a_new_key(tmp_path, monkeypatch):
    code = tmp_path / "module.py"
    code.write_text("x = 1\n")
    monkeypatch.setattr(build_cache, "BUILD_CODE", [code])
    monkeypatch.setattr(build_cache, "ROOT", tmp_path)
    first = build_cache.build_key()
    code.write_text("x = 2\n")
    second = build_cache.build_key()
    real_version = build_cache.importlib.metadata.version
    for library in ("torch", "onnx-ir", "protobuf"):  # what the exports go through, too
        monkeypatch.setattr(
            build_cache.importlib.metadata,
            "version",
            lambda name, changed=library: "9.9" if name == changed else real_version(name),
        )
        assert build_cache.build_key() not in {first, second}, library
    assert first != second


def test_a_build_cut_short_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setattr(build_cache, "build_cache", lambda config, factory: tmp_path)

    def failing(folder: Path) -> None:
        (folder / "half").write_text("")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        build_cache.built_once(None, None, "thing", failing)
    assert not [path for path in tmp_path.glob("thing-*") if path.is_dir()]
    folder = build_cache.built_once(None, None, "thing", lambda folder: (folder / "made").write_text("1"))
    assert sorted(p.name for p in folder.iterdir()) == ["made"]
