"""A tokenized cache that fails, through the command: unreadable files are rebuilt, a full disk names the folder and
keeps nothing, files left by a killed build are cleared at the next one."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


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
    left = folder / "tmpk1ll3d"
    left.write_bytes(b"\0" * 1000)
    an_hour_ago = time.time() - 3600
    os.utime(left, (an_hour_ago, an_hour_ago))
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
    assert str(small_disk / "cache" / "tokenized") in full.stderr and " GB there" in full.stderr
    assert not any((small_disk / "cache" / "tokenized").iterdir())
