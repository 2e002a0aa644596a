"""Print one of the README's two set-up commands exactly as written, so CI runs what a user copies.

    python3 -m benchmarks.readme main     # install, train the quickstart model, translate with it
    python3 -m benchmarks.readme tests    # install, run the test suite

They are the `bash` blocks of the README's "Set up" section: the one that runs `hf-vanilla train`, and the one that
runs pytest. Anything else there (no such block, or two of a kind) is an error, so the README and CI cannot drift.
"""

import re
import sys

from benchmarks import ROOT


MARKERS = {"main": "hf-vanilla train", "tests": "pytest"}


def setup_commands(readme: str) -> dict[str, str]:
    section = re.search(r"^## Set up\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    if section is None:
        raise SystemExit("README.md has no '## Set up' section.")
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), flags=re.S | re.M)
    commands = {}
    for kind, marker in MARKERS.items():
        found = [block.strip() for block in blocks if marker in block]
        if len(found) != 1 or "\n" in found[0]:
            raise SystemExit(f"README.md's Set up section needs exactly one one-line bash block with {marker!r}.")
        commands[kind] = found[0]
    return commands


def readme_command(kind: str) -> str:
    return setup_commands((ROOT / "README.md").read_text())[kind]


if __name__ == "__main__":
    print(readme_command(sys.argv[1]))
