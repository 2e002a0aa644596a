"""The suite's build cache (conftest.built_once): a build is made once per key, by one builder at a time, and never
reused once its code or a library changes."""

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from . import conftest


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(conftest, "build_cache", lambda config, factory: tmp_path)
    return tmp_path


def counting_build(calls: list) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        calls.append(folder)
        time.sleep(0.2)  # long enough for a second asker to arrive while the first builds
        (folder / "made").write_text(str(len(calls)))

    return build


def test_two_askers_at_once_get_one_build(cache):
    calls, folders = [], []
    askers = [
        threading.Thread(
            target=lambda: folders.append(conftest.built_once(None, None, "thing", counting_build(calls)))
        )
        for _ in range(2)
    ]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert len(calls) == 1 and folders[0] == folders[1] and (folders[0] / "made").read_text() == "1"
    assert conftest.built_once(None, None, "thing", counting_build(calls)) == folders[0] and len(calls) == 1


def test_a_changed_library_or_code_file_gives_a_new_build_and_removes_the_old(cache, tmp_path_factory, monkeypatch):
    code = tmp_path_factory.mktemp("code") / "module.py"
    code.write_text("x = 1\n")
    monkeypatch.setattr(conftest, "BUILD_CODE", [code])
    monkeypatch.setattr(conftest, "ROOT", code.parent)
    calls = []
    first = conftest.built_once(None, None, "thing", counting_build(calls))
    code.write_text("x = 2\n")
    second = conftest.built_once(None, None, "thing", counting_build(calls))
    real_version = conftest.importlib.metadata.version
    monkeypatch.setattr(
        conftest.importlib.metadata, "version", lambda name: "9.9" if name == "torch" else real_version(name)
    )
    third = conftest.built_once(None, None, "thing", counting_build(calls))
    assert len(calls) == 3 and len({first, second, third}) == 3
    assert not first.exists() and not second.exists() and (third / "made").read_text() == "3"


def test_a_build_cut_short_is_built_again(cache):
    def failing(folder: Path) -> None:
        (folder / "half").write_text("")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        conftest.built_once(None, None, "thing", failing)
    assert not list(cache.glob("thing-*"))
    calls = []
    folder = conftest.built_once(None, None, "thing", counting_build(calls))
    assert len(calls) == 1 and sorted(p.name for p in folder.iterdir()) == ["made"]
