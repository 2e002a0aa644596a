"""The suite's own settings (pyproject.toml's pytest options) end every run: a worker that dies fails the run naming
its test, and a test that hangs is stopped with its traceback, where pytest-xdist alone would wait forever."""

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def run_suite_settings_on(files: dict[str, str], folder: Path, *options: str) -> subprocess.CompletedProcess:
    """pytest with pyproject.toml's options on `files` (written into `folder`), on two workers; it must end in 2
    minutes: the runs below take seconds, and without the settings they never end."""
    for name, text in files.items():
        (folder / name).write_text(text)
    command = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(folder)]
    command += ["-p", "no:cacheprovider", "-n", "2", *options, str(folder)]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)


def test_a_worker_that_dies_near_the_end_fails_the_run_naming_its_test(tmp_path):
    """The layout of pytest-dev/pytest-xdist#1378: one worker finishes several files, then dies in the last one while
    the other still runs a long file. Replaced, the dead worker's finished files came back as empty units, and the run
    waited for them forever (as CI did, until its limit)."""
    files = {
        f"test_short_{i}.py": "import time\ndef test_a(): time.sleep(0.3)\ndef test_b(): time.sleep(0.3)\n"
        for i in range(6)
    }
    files["test_a_long.py"] = "import time\ndef test_long(): time.sleep(6)\ndef test_after_it(): pass\n"
    files["test_z_dies.py"] = (
        "import os, signal\ndef test_dies(): os.kill(os.getpid(), signal.SIGKILL)\ndef test_after(): pass\n"
    )
    result = run_suite_settings_on(files, tmp_path)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "crashed while running 'test_z_dies.py::test_dies'" in result.stdout, result.stdout[-3000:]


def test_a_test_that_hangs_is_stopped_with_its_traceback(tmp_path):
    """With the timeout shortened to 2 s, a test that would sleep for 10 minutes is stopped, its traceback printed,
    and the run fails naming it."""
    files = {"test_hangs.py": "import time\ndef test_waits_for_ever():\n    time.sleep(600)\n"}
    result = run_suite_settings_on(files, tmp_path, "-o", "faulthandler_timeout=2")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "crashed while running 'test_hangs.py::test_waits_for_ever'" in result.stdout, result.stdout[-3000:]
    assert "Timeout (0:00:02)!" in result.stderr and "in test_waits_for_ever" in result.stderr, result.stderr[-3000:]
