"""Print the lowest versions pyproject.toml allows, as pip constraints (`name==floor`), one a line.

CI installs the package with them (`pip install -c FILE -e ".[dev]"`) to run the library tests on the floors: the
same as `uv pip install --resolution lowest-direct`, with pip alone. Covered: the libraries the package runs on
(its dependencies and the extras train, export, openvino); the test tools of [dev] resolve as usual.
"""

import re
import tomllib
from pathlib import Path


EXTRAS = ("train", "export", "openvino")


def floors(pyproject: dict) -> list[str]:
    project = pyproject["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in EXTRAS for r in project["optional-dependencies"][extra]),
    ]
    pins = []
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][^,;\s]*).*", requirement)
        if match is None:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no '>=' floor; every library needs one.")
        pins.append(f"{match[1]}=={match[2]}")
    return pins


if __name__ == "__main__":
    print("\n".join(floors(tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text()))))
