"""The tested range of each library (`hf-vanilla env`), the lock the README installs, and the floors CI tests."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from benchmarks.readme import readme_command
from hf_vanilla.env import LibraryStatus, declared_requirements, library_statuses, locked_versions, range_tested


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
    assert output.startswith(f"hf-vanilla {importlib.metadata.version('hf-vanilla')}, Python ")
    for status in library_statuses():
        row = next(line for line in output.splitlines() if line.split()[0] == status.name)
        assert str(status.installed or "-") in row and status.verdict in row
    floor, newest = range_tested("transformers")
    assert floor == Version("5.23") and newest >= floor
    transformers_row = next(line for line in output.splitlines() if line.startswith("transformers "))
    assert importlib.metadata.version("transformers") in transformers_row


def test_the_readme_table_of_versions_is_the_floors_and_the_lock():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| library | floor (pyproject.toml) | newest tested (the lock) |") :].split("\n\n")[0]
    rows = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    assert len(rows) >= 5
    for name, floor, newest in ((cell.strip() for cell in row) for row in rows):
        assert range_tested(name) == (Version(floor), Version(newest)), name
