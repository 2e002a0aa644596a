"""The tested range of each library (`hf-vanilla env`), the lock the README installs, and the floors CI tests."""

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from benchmarks.readme import readme_command
from hf_vanilla import env
from hf_vanilla.env import (
    AXES,
    LibraryStatus,
    declared_requirements,
    library_statuses,
    locked_versions,
    outside_the_tested_range,
    range_tested,
)


ROOT = Path(__file__).parents[1]


def test_every_library_is_locked_at_a_version_its_requirement_allows():
    locked = locked_versions()
    for requirement, _ in declared_requirements():
        assert requirement.name.lower().replace("_", "-") in locked, f"{requirement.name} is not in constraints.txt"
        assert requirement.specifier.contains(locked[requirement.name.lower().replace("_", "-")])


def test_the_readme_commands_install_from_the_lock():
    for kind in ("main", "tests"):
        assert "pip install -c constraints.txt -e " in readme_command(kind)


def test_the_floors_ci_installs_are_the_lowest_versions_pyproject_allows():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    output = subprocess.run([sys.executable, ".ci/floors.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    pins = dict(line.split("==") for line in output.stdout.split())
    extras = project["optional-dependencies"]
    requirements = [
        Requirement(r) for r in (*project["dependencies"], *extras["train"], *extras["export"], *extras["openvino"])
    ]
    assert set(pins) == {requirement.name for requirement in requirements}
    for requirement in requirements:
        (lowest,) = (spec.version for spec in requirement.specifier if spec.operator == ">=")
        assert pins[requirement.name] == lowest
    assert pins["transformers"] == "5.23" and pins["torch"] == "2.13"


@pytest.mark.parametrize(
    ("installed", "verdict"),
    [
        (None, "not installed (pip install 'hf-vanilla[train]')"),
        ("4.9.9", "below the floor: pip install -U 'datasets>=5.0'"),
        ("5.0.0", "in the tested range"),
        ("5.1.3", "in the tested range"),
        ("5.2.0", "in the tested range"),
        ("5.2.1", "newer than tested"),
    ],
)
def test_where_a_version_lies_in_the_tested_range(installed, verdict):
    status = LibraryStatus("datasets", "train", installed and Version(installed), Version("5.0"), Version("5.2.0"))
    assert status.verdict == verdict


def test_hf_vanilla_env_names_every_library_with_its_installed_version():
    output = subprocess.run(
        [sys.executable, "-m", "hf_vanilla", "env"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert output.startswith(f"hf-vanilla {importlib.metadata.version('hf-vanilla')}\n")
    for status in library_statuses():
        row = next(line for line in output.splitlines() if line.split()[0] == status.name)
        assert str(status.installed or "-") in row and status.verdict in row
    floor, newest = range_tested("transformers")
    assert floor == Version("5.23") and newest >= floor
    # Independent truth: the installed version from the package's metadata, the floor written here, the newest
    # tested read from the locks' own lines, and the verdict worked out here.
    locked = [
        Version(line.split("==")[1])
        for lock in ("constraints.txt", "constraints-newest.txt")
        for line in (ROOT / lock).read_text().splitlines()
        if line.startswith("transformers==")
    ]
    installed = importlib.metadata.version("transformers")
    within = Version("5.23") <= Version(installed) <= max(locked)
    row = next(line for line in output.splitlines() if line.startswith("transformers ")).split(maxsplit=4)
    assert row[:4] == ["transformers", installed, "5.23", str(max(locked))]
    assert row[4] == ("in the tested range" if within else "newer than tested")


def test_the_readme_table_of_versions_is_the_floors_and_the_lock():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| library | floor (pyproject.toml) | newest tested |") :].split("\n\n")[0]
    rows = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    assert sorted(row[0].strip() for row in rows) == sorted(AXES)
    for name, floor, newest in ((cell.strip() for cell in row) for row in rows):
        assert range_tested(name) == (Version(floor), Version(newest)), name


def test_the_python_range_is_requires_python_to_the_newest_classifier():
    assert range_tested("python") == (Version("3.11"), Version("3.13"))
    python = library_statuses()[0]
    assert python.name == "python" and python.installed == Version(".".join(map(str, sys.version_info[:3])))
    assert LibraryStatus("python", None, Version("3.13.9"), Version("3.11"), Version("3.13")).verdict == (
        "in the tested range"
    )
    assert LibraryStatus("python", None, Version("3.14.0"), Version("3.11"), Version("3.13")).verdict == (
        "newer than tested"
    )
    assert LibraryStatus("python", None, Version("3.10.13"), Version("3.11"), Version("3.13")).verdict == (
        "below the floor: use Python >= 3.11"
    )


def test_ci_installs_the_torch_releases_the_table_names():
    script = (ROOT / ".ci" / "run").read_text()
    floor, newest = range_tested("torch")
    assert f"TORCH_FLOOR={floor}.0 " in script and f"TORCH_NEWEST={newest} " in script


def test_env_check_names_each_axis_outside_its_range(monkeypatch):
    statuses = [
        LibraryStatus("torch", None, Version("2.16.0"), Version("2.13"), Version("2.15.0")),
        LibraryStatus("datasets", "train", None, Version("4.0"), Version("5.2.0")),  # an extra not installed: fine
        LibraryStatus("numpy", "train", Version("9.0"), Version("2.0"), Version("2.4.6")),  # not an axis
        LibraryStatus("transformers", None, Version("5.9.0"), Version("5.23"), Version("5.24.0")),
    ]
    monkeypatch.setattr("hf_vanilla.env.library_statuses", lambda newest=True: statuses)
    assert outside_the_tested_range() == [
        "torch 2.16.0: newer than tested",
        "transformers 5.9.0: below the floor: pip install -U 'transformers>=5.23'",
    ]


def test_the_environment_under_test_passes_env_check():
    run = subprocess.run([sys.executable, "-m", "hf_vanilla", "env", "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("python", "refused"),
    [("3.14.0rc1", False), ("3.13.0+", False), ("3.11.0a7", False), ("3.12.4", False), ("3.10.14", True),
     ("3.10.0rc1", True)],
)  # fmt: skip
def test_a_python_is_judged_by_its_release(monkeypatch, python, refused):
    """A pre-release (3.14.0rc1, which packaging 24.2 refuses to compare) and a branch build (3.13.0+, no PEP 440
    version at all) import where their release is in range; a release below the floor is refused, naming both."""
    monkeypatch.setattr(env.platform, "python_version", lambda: python)
    if refused:
        with pytest.raises(ImportError, match=rf"needs Python >=3\.11; this is Python {re.escape(python)}\."):
            env.check_installation()
    else:
        env.check_installation()
        assert env.python_status().verdict in ("in the tested range", "newer than tested")


@pytest.mark.parametrize(
    ("installed", "verdict"),
    [
        ("5.23.0rc1", "in the tested range"),
        ("5.23.0.dev0", "in the tested range"),
        ("5.22.9.post1", "below the floor"),
    ],
)
def test_a_library_is_judged_by_its_release(installed, verdict):
    status = LibraryStatus("transformers", None, Version(installed), Version("5.23"), Version("5.24.0"))
    assert status.verdict.startswith(verdict)


@pytest.mark.parametrize(
    ("argv", "env_command"),
    [
        (["python", "-m", "hf_vanilla", "env"], True),
        (["python", "-X", "utf8", "-m", "hf_vanilla", "--debug", "env", "--check"], True),
        (["/venv/bin/python", "/venv/bin/hf-vanilla", "env"], True),
        (["/venv/bin/python", "/venv/bin/hf-vanilla", "translate", "env"], False),
        (["python", "-m", "hf_vanilla", "train"], False),
        (["python", "-m", "pytest", "env"], False),
        (["python", "-c", "import hf_vanilla", "env"], False),
    ],
)
def test_only_the_env_command_is_let_past_the_import_time_check(monkeypatch, argv, env_command):
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert env.running_the_env_command() is env_command


def test_below_a_floor_the_import_is_refused_and_hf_vanilla_env_still_reports(tmp_path):
    """A simulated older transformers (its metadata says 5.0.0, found first on the path): importing hf_vanilla
    stops with one line naming the floor, and `hf-vanilla env`, which that line points to, runs and names it."""
    metadata = tmp_path / "transformers-5.0.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.0.0\n")
    run = dict(capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    imported = subprocess.run([sys.executable, "-c", "import hf_vanilla"], **run)
    assert imported.returncode == 1
    assert imported.stderr.strip().splitlines()[-1] == (
        "ImportError: hf_vanilla needs transformers>=5.23 (installed: 5.0.0): pip install -U 'transformers>=5.23'. "
        "`hf-vanilla env` shows what is installed."
    )
    reported = subprocess.run([sys.executable, "-m", "hf_vanilla", "env", "--check"], **run)
    row = next(line for line in reported.stdout.splitlines() if line.startswith("transformers "))
    assert row.split()[:3] == ["transformers", "5.0.0", "5.23"] and "below the floor" in row
    assert reported.returncode == 1 and "transformers 5.0.0: below the floor" in reported.stderr


def test_packaging_is_declared_by_hf_vanilla_itself():
    """env.py imports it; transformers happening to require it is not a promise to us."""
    assert "packaging" in {requirement.name for requirement, extra in declared_requirements() if extra is None}
