"""The Python and libraries this installation runs on, against the range hf_vanilla was tested with
(`hf-vanilla env`).

The range of each library runs from its floor, the lowest release that pyproject.toml allows, to the newest release
tested: the newer of its versions in the two locks, `constraints.txt` (Python 3.11, what the README's commands and
CI's main legs install) and `constraints-newest.txt` (Python 3.13 with the newest releases, CI's newest leg). Python's
runs from `requires-python` to the newest of the package's `Programming Language :: Python :: 3.x` classifiers. CI
runs the tests that touch the libraries at both ends, the floors together and the newest releases together, so an
installed version between them is covered. A newer one has not been tested yet, and one below the floor is refused
by pip.
"""

import importlib.metadata
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version


DISTRIBUTION = "hf-vanilla"
LOCKS = ("constraints.txt", "constraints-newest.txt")
# What CI's range legs check (`hf-vanilla env --check`): every axis of the README's table of versions.
AXES = ("python", "torch", "transformers", "datasets", "tokenizers", "accelerate")
# The extras whose libraries the package itself runs on. `bench` and `dev` only add tools.
RUNTIME_EXTRAS = ("train", "export", "openvino")


def shipped_file(name: str) -> Path:
    """A top-level file of the repository that wheels carry inside the package (setup.py copies it next to this
    module at build time); an editable install reads it from the checkout's top level."""
    for candidate in (Path(__file__).with_name(name), Path(__file__).parents[1] / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name} is neither installed with hf_vanilla nor at the top of a checkout.")


def locked_versions(lock: str = LOCKS[0]) -> dict[str, Version]:
    """The version of every package in one lock: its `name==version` lines."""
    versions = {}
    for line in shipped_file(lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (pin,) = requirement.specifier
            versions[canonicalize_name(requirement.name)] = Version(pin.version)
    return versions


def newest_tested_versions() -> dict[str, Version]:
    """The newest tested version of every package: the newer of its pins in the two locks."""
    newest = {}
    for lock in LOCKS:
        for name, version in locked_versions(lock).items():
            newest[name] = max(newest.get(name, version), version)
    return newest


def declared_requirements() -> list[tuple[Requirement, str | None]]:
    """Each library the installed hf-vanilla runs on, with the extra that brings it (None: always installed)."""
    requirements = []
    for line in importlib.metadata.requires(DISTRIBUTION) or []:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == DISTRIBUTION:
            continue  # an extra made of other extras
        if requirement.marker is None:
            requirements.append((requirement, None))
            continue
        extra = next((e for e in RUNTIME_EXTRAS if requirement.marker.evaluate({"extra": e})), None)
        if extra is not None:
            requirements.append((requirement, extra))
    return requirements


def release_of(version: str) -> Version:
    """The release a Python's version string belongs to: `3.14.0rc1` and `3.13.0+` (a Python built from a branch,
    which PEP 440 cannot parse) are 3.14.0 and 3.13.0. A pre-release, local or development Python is judged by its
    release, whatever `packaging` release reads the string (24.2's `SpecifierSet.contains` refuses a pre-release).
    Libraries' versions are PEP 440's, and `LibraryStatus.verdict` compares their releases."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return Version(match[1])


@dataclass
class LibraryStatus:
    """One library: what is installed, the tested range, and where the installed version lies in it."""

    name: str
    extra: str | None
    installed: Version | None
    floor: Version | None
    newest_tested: Version | None

    @property
    def verdict(self) -> str:
        if self.installed is None:
            return "not installed" + (f" (pip install 'hf-vanilla[{self.extra}]')" if self.extra else "")
        if self.floor is not None and self.installed.release < self.floor.release:
            if self.name == "python":
                return f"below the floor: use Python >= {self.floor}"
            return f"below the floor: pip install -U '{self.name}>={self.floor}'"
        newest = self.newest_tested
        # compared to the precision it is stated in: Python's newest tested, 3.13, covers 3.13.x
        if newest is not None and self.installed.release[: len(newest.release)] > newest.release:
            return "newer than tested"
        return "in the tested range"


def range_tested(name: str) -> tuple[Version | None, Version | None]:
    """(floor, newest tested) of one library that hf-vanilla requires."""
    status = next(status for status in library_statuses() if status.name == canonicalize_name(name))
    return status.floor, status.newest_tested


# Where a library's import name differs from its distribution name. `importlib.metadata.packages_distributions()`
# cannot tell: it maps the modules that are installed, and `extra_providing` is asked about one that is missing.
DISTRIBUTION_OF_MODULE = {"yaml": "pyyaml"}


def extra_providing(module: str) -> str | None:
    """The extra of hf-vanilla that installs the top-level `module` (None: no extra does)."""
    distribution = canonicalize_name(DISTRIBUTION_OF_MODULE.get(module, module))
    extras = (
        extra for requirement, extra in declared_requirements() if canonicalize_name(requirement.name) == distribution
    )
    return next(extras, None)


def floor_of(requirement: Requirement) -> Version | None:
    bounds = [Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
    return max(bounds, default=None)


def python_status() -> LibraryStatus:
    """Python, as a library: floor from `requires-python`, newest tested from the classifiers."""
    classifiers = importlib.metadata.metadata(DISTRIBUTION).get_all("Classifier") or []
    tested = [
        Version(c.rsplit(" :: ", 1)[1])
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    (floor,) = (Version(spec.version) for spec in python_requirement() if spec.operator == ">=")
    return LibraryStatus("python", None, release_of(platform.python_version()), floor, max(tested, default=None))


def library_statuses(newest: bool = True) -> list[LibraryStatus]:
    """Python first, then every library hf-vanilla requires, each with its floor and (`newest`) newest tested."""
    locked = newest_tested_versions() if newest else {}
    statuses = [python_status()]
    for requirement, extra in declared_requirements():
        name = canonicalize_name(requirement.name)
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            installed = None
        statuses.append(LibraryStatus(name, extra, installed, floor_of(requirement), locked.get(name)))
    return statuses


def python_requirement() -> SpecifierSet:
    """The Pythons hf-vanilla installs on (`requires-python`)."""
    return SpecifierSet(importlib.metadata.metadata(DISTRIBUTION)["Requires-Python"] or "")


def check_installation() -> None:
    """Refuse, in one line, a Python or a required library below what hf-vanilla needs, which pip refuses to
    install but a `--no-deps` install, a copied folder or a later downgrade can still leave. Extras' libraries are
    checked where they are imported. Nothing to check without the package's metadata (a plain checkout on the
    path). `hf-vanilla env`, the diagnostic the refusal points to, is let through: it reports the same."""
    try:
        pythons = python_requirement()
    except importlib.metadata.PackageNotFoundError:
        return
    if running_the_env_command():
        return
    python = platform.python_version()
    if not pythons.contains(release_of(python)):
        raise ImportError(
            f"hf_vanilla needs Python {pythons}; this is Python {python}. `hf-vanilla env` shows what is installed."
        )
    below = [
        f"{status.name}>={status.floor} (installed: {status.installed})"
        for status in library_statuses(newest=False)[1:]
        if status.extra is None and status.verdict.startswith("below the floor")
    ]
    if below:
        raise ImportError(
            f"hf_vanilla needs {', '.join(below)}: pip install -U "
            + " ".join(f"'{item.split(' ')[0]}'" for item in below)
            + ". `hf-vanilla env` shows what is installed."
        )


def running_the_env_command() -> bool:
    """Whether this process is `hf-vanilla env` or `python -m hf_vanilla env`, read from the interpreter's own
    command line (`sys.orig_argv`: `sys.argv[0]` is still `-m` while the package imports)."""
    arguments = sys.orig_argv[1:]
    if "-m" in arguments:
        module = arguments.index("-m") + 1
        if arguments[module : module + 1] != ["hf_vanilla"]:
            return False
        arguments = arguments[module + 1 :]
    elif arguments and Path(arguments[0]).name == "hf-vanilla":  # the console script, its interpreter's first argument
        arguments = arguments[1:]
    else:
        return False
    return next((argument for argument in arguments if not argument.startswith("-")), None) == "env"


def outside_the_tested_range() -> list[str]:
    """The axes (`AXES`) installed outside their tested range, each with its verdict; an extra's library that is not
    installed is not outside it."""
    return [
        f"{status.name} {status.installed}: {status.verdict}"
        for status in library_statuses()
        if status.name in AXES and status.installed is not None and status.verdict != "in the tested range"
    ]


def report() -> str:
    """The table `hf-vanilla env` prints."""
    rows = [("library", "installed", "floor", "newest tested", "")]
    for status in library_statuses():
        rows.append(
            (
                status.name,
                str(status.installed or "-"),
                str(status.floor or "-"),
                str(status.newest_tested or "-"),
                status.verdict,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = [
        f"hf-vanilla {importlib.metadata.version(DISTRIBUTION)}",
        *(
            "  ".join(cell.ljust(width) for cell, width in zip(row, [*widths, 0], strict=True)).rstrip()
            for row in rows
        ),
    ]
    return "\n".join(lines)
